//! Replaying the chain: each record applied to the model of the tables it describes.

#[allow(clippy::wildcard_imports)]
use super::*;

impl Replay {
    /// An empty replay that keeps at most `entries_in_memory` entries of each map in
    /// memory.
    pub(super) fn new(entries_in_memory: usize) -> Replay {
        Replay {
            scratch: Scratch::default(),
            sagas: Spill::new("sagas", entries_in_memory),
            steps: Spill::new("steps", entries_in_memory),
            keys: Spill::new("keys", entries_in_memory),
            approvals: Spill::new("approvals", entries_in_memory),
            dead_letters: Spill::new("dead_letters", entries_in_memory),
        }
    }

    pub(super) fn has_saga(&self, saga_id: &str) -> Result<bool, String> {
        self.scratch
            .noted(self.sagas.contains(&self.scratch, &id_key(saga_id)))
    }

    pub(super) fn saga_mut(&mut self, saga_id: &str) -> Result<&mut SagaModel, String> {
        let found = self.sagas.get_mut(&mut self.scratch, &id_key(saga_id));
        self.scratch
            .noted(found)?
            .ok_or_else(|| format!("it refers to saga {saga_id}, which no earlier record created"))
    }

    pub(super) fn has_step(&self, saga_id: &str, step_seq: i64) -> Result<bool, String> {
        self.scratch.noted(
            self.steps
                .contains(&self.scratch, &(saga_id.to_owned(), step_seq)),
        )
    }

    pub(super) fn approval_mut(
        &mut self,
        approval_id: &str,
        saga_id: &str,
    ) -> Result<&mut ApprovalModel, String> {
        let found = self
            .approvals
            .get_mut(&mut self.scratch, &id_key(approval_id));
        let approval = self.scratch.noted(found)?.ok_or_else(|| {
            format!("it refers to approval {approval_id}, which no earlier record requested")
        })?;
        if approval.saga_id != saga_id {
            return Err(format!(
                "it refers to approval {approval_id} as one of saga {saga_id}, but it belongs to saga {}",
                approval.saga_id
            ));
        }
        Ok(approval)
    }

    pub(super) fn step_mut(
        &mut self,
        saga_id: &str,
        step_seq: i64,
    ) -> Result<&mut StepModel, String> {
        self.saga_mut(saga_id)?;
        let found = self
            .steps
            .get_mut(&mut self.scratch, &(saga_id.to_owned(), step_seq));
        self.scratch.noted(found)?.ok_or_else(|| {
            format!("it refers to step {step_seq} of saga {saga_id}, which no earlier record began")
        })
    }

    /// Puts `value` under `key` in `map` (a field of `self`).
    pub(super) fn put<V: Entry>(
        scratch: &mut Scratch,
        map: &mut Spill<V>,
        key: Key,
        value: V,
    ) -> Result<(), String> {
        let result = map.insert(scratch, key, value);
        scratch.noted(result)
    }

    /// [`Replay::put`] under a key the caller found empty.
    pub(super) fn put_new<V: Entry>(
        scratch: &mut Scratch,
        map: &mut Spill<V>,
        key: Key,
        value: V,
    ) -> Result<(), String> {
        let result = map.insert_absent(scratch, key, value);
        scratch.noted(result)
    }

    /// Applies one record that passed the chain checks; `Err` when it cannot follow the
    /// records before it.
    pub(super) fn apply(&mut self, record: &Record) -> Result<(), String> {
        let body: Value = serde_json::from_str(&record.body)
            .map_err(|_| "its body is not valid JSON".to_owned())?;
        let body = Body(
            body.as_object()
                .ok_or_else(|| "its body is not a JSON object".to_owned())?,
        );
        self.apply_body(record, &body)?;
        if let Some(saga_id) = &record.saga_id {
            // Counted from the saga's creation (or the `Genesis` record), and only while it
            // exists, as `prune` counts: a record that creates the saga counts, one that
            // prunes it does not.
            let found = self.sagas.get_mut(&mut self.scratch, &id_key(saga_id));
            if let Some(saga) = self.scratch.noted(found)? {
                saga.records.add(&record.hash);
            }
        }
        Ok(())
    }

    /// What [`Replay::apply`] does to the tables.
    pub(super) fn apply_body(&mut self, record: &Record, body: &Body<'_>) -> Result<(), String> {
        if record.kind == KIND_GENESIS {
            return self.genesis(record, body);
        }
        if record.kind == KIND_PRUNE {
            return self.prune(body);
        }
        if [
            KIND_OPERATOR,
            KIND_PLAN_DENIED,
            KIND_CALL_REFUSED,
            KIND_SAGA_ABORTED,
        ]
        .contains(&record.kind.as_str())
        {
            // Changes no table; its body must still name what the column names.
            let saga_id = match body.0.get("saga_id") {
                None | Some(Value::Null) => None,
                Some(Value::String(saga_id)) => Some(saga_id.as_str()),
                Some(_) => return Err("its body's `saga_id` is neither text nor null".to_owned()),
            };
            if record.saga_id.as_deref() != saga_id {
                return Err("its saga_id column differs from its body's".to_owned());
            }
            body.object("by")?;
            return Ok(());
        }
        let saga_id = body.str("saga_id")?;
        if record.saga_id.as_deref() != Some(saga_id) {
            return Err("its saga_id column differs from its body's".to_owned());
        }
        if record.kind == KIND_LOCK_CONFLICT {
            // Changes no table: the step it names was never written.
            body.int("step_seq")?;
            body.str("resource")?;
            body.object("holder")?;
            return Ok(());
        }
        if record.kind == KIND_LOCKS {
            // Changes no table the chain models: a settled saga's locks claimed or released.
            body.str("action")?;
            return Ok(());
        }
        let (seq, at_ms) = (record.seq, record.at_ms);
        match record.kind.as_str() {
            KIND_CREATE_SAGA => self.create_saga(saga_id, body, seq, at_ms),
            KIND_SET_STATE => {
                let state = body.state("state")?;
                let saga = self.saga_mut(saga_id)?;
                saga.state = state;
                saga.updated_at_ms = Some(at_ms);
                saga.last_seq = seq;
                Ok(())
            }
            KIND_TAKE_OVER => self.take_over(saga_id, body, seq, at_ms),
            KIND_BEGIN_STEP | KIND_REFUSE_STEP | KIND_REUSE_STEP | KIND_SIMULATE_STEP => {
                self.insert_step(record, body, saga_id)
            }
            KIND_COMMIT_STEP | KIND_FAIL_STEP => self.step_outcome(record, body, saga_id),
            KIND_COMPENSATION => self.compensation(saga_id, body, seq, at_ms),
            KIND_APPROVAL_REQUESTED => self.approval_requested(saga_id, body, seq),
            KIND_APPROVAL_DECIDED => self.approval_decided(saga_id, body, seq, at_ms),
            KIND_APPROVAL_CONSUMED => self.approval_consumed(saga_id, body, seq),
            KIND_DEAD_LETTER => self.dead_letter(saga_id, body, seq, at_ms),
            KIND_DEAD_LETTER_SETTLED => self.dead_letter_settled(saga_id, body, seq, at_ms),
            other => Err(format!("its kind `{other}` is unknown")),
        }
    }

    pub(super) fn insert_step(
        &mut self,
        record: &Record,
        body: &Body<'_>,
        saga_id: &str,
    ) -> Result<(), String> {
        let step_seq = body.int("step_seq")?;
        if !(0..=i64::from(u32::MAX)).contains(&step_seq) {
            return Err(format!("its step_seq {step_seq} is out of range"));
        }
        let status = body.status("status")?;
        let allowed: &[StepStatus] = match record.kind.as_str() {
            KIND_BEGIN_STEP => &[StepStatus::Begin, StepStatus::Fail],
            KIND_REFUSE_STEP => &[StepStatus::Fail],
            KIND_SIMULATE_STEP => &[StepStatus::Commit, StepStatus::Fail],
            _ => &[StepStatus::Commit],
        };
        if !allowed.contains(&status) {
            return Err(format!(
                "a {} record cannot leave a step {}",
                record.kind,
                status.as_str()
            ));
        }
        let reused_from = match body.field("reused_from")? {
            Value::Null => None,
            Value::Object(map) => {
                let from = Body(map);
                Some((from.str("saga_id")?.to_owned(), from.int("step_seq")?))
            }
            _ => return Err("its body's `reused_from` is neither an object nor null".to_owned()),
        };
        let content = StepContent {
            tool_id: body.str("tool")?.to_owned(),
            tool_version: body.str("tool_version")?.to_owned(),
            effect: body.str("effect")?.to_owned(),
            idempotency_key: body.opt_str("idempotency_key")?,
            args_hash: body.str("args_hash")?.to_owned(),
            args_sha256: body.str("args_sha256")?.to_owned(),
            undo_sha256: body.str("undo_sha256")?.to_owned(),
            undo_blob_sha256: body.opt_str("undo_blob_sha256")?,
            reused_from,
            resources: body.sorted_strs("resources")?,
        };
        let output_sha256 = body.opt_str("output_sha256")?;
        let error_sha256 = body.opt_str("error_sha256")?;
        let claims_key = record.kind == KIND_BEGIN_STEP && status == StepStatus::Begin;
        let key_claim = content
            .idempotency_key
            .clone()
            .filter(|_| claims_key)
            .map(|key| (key, content.args_hash.clone()));
        let dry_run = self.saga_mut(saga_id)?.dry_run == Some(true);
        if record.kind == KIND_SIMULATE_STEP && !dry_run {
            return Err(format!(
                "it simulates a step of saga {saga_id}, which is not a dry run"
            ));
        }
        if record.kind == KIND_BEGIN_STEP && dry_run {
            return Err(format!(
                "it begins a step of saga {saga_id}, which is a dry run"
            ));
        }
        if self.has_step(saga_id, step_seq)? {
            return Err(format!(
                "it begins step {step_seq} of saga {saga_id}, which was already begun"
            ));
        }
        self.saga_mut(saga_id)?.n_known_steps += 1;
        Self::put_new(
            &mut self.scratch,
            &mut self.steps,
            (saga_id.to_owned(), step_seq),
            StepModel {
                last_seq: record.seq,
                status,
                content: Some(content),
                output_sha256: Some(output_sha256),
                error_sha256: Some(error_sha256),
                compensation_sha256: Some(None),
                created_at_ms: Some(record.at_ms),
                updated_at_ms: Some(record.at_ms),
            },
        )?;
        // The store binds a key to its first arguments for good and moves it to each new
        // step that claims it.
        if let Some((key, args_hash)) = key_claim {
            let key = id_key(&key);
            let found = self.keys.get_mut(&mut self.scratch, &key);
            if let Some(binding) = self.scratch.noted(found)? {
                binding.saga_id = saga_id.to_owned();
                binding.step_seq = step_seq;
                binding.last_seq = record.seq;
            } else {
                let binding = KeyModel {
                    last_seq: record.seq,
                    args_hash,
                    saga_id: saga_id.to_owned(),
                    step_seq,
                };
                Self::put_new(&mut self.scratch, &mut self.keys, key, binding)?;
            }
        }
        Ok(())
    }

    /// A `Prune` checkpoint: every saga it names must be prunable here (`Done`,
    /// `FailedRolledBack` or `Undone`, last changed before the horizon, no open dead letter,
    /// no open request), its steps must add up, and the hash of their records must match;
    /// then they leave the tables.
    pub(super) fn prune(&mut self, body: &Body<'_>) -> Result<(), String> {
        let before_ms = body.int("before_ms")?;
        let n_steps = body.int("n_steps")?;
        let records_sha256 = body.str("records_sha256")?;
        let listed = body
            .field("saga_ids")?
            .as_array()
            .ok_or_else(|| "its `saga_ids` is not a list".to_owned())?;
        let with_open_letter = self
            .scratch
            .noted(self.dead_letters.open_groups(&self.scratch))?;
        let with_open_request = self
            .scratch
            .noted(self.approvals.open_groups(&self.scratch))?;
        let mut pruned = BTreeMap::new();
        let mut n_counted = 0_i64;
        for saga_id in listed {
            let saga_id = saga_id
                .as_str()
                .ok_or_else(|| "its `saga_ids` holds something other than text".to_owned())?;
            if pruned
                .keys()
                .next_back()
                .is_some_and(|last: &&str| *last >= saga_id)
            {
                return Err("its `saga_ids` are not in ascending order".to_owned());
            }
            let saga = self
                .scratch
                .noted(self.sagas.get(&self.scratch, &id_key(saga_id)))?
                .ok_or_else(|| format!("it prunes saga {saga_id}, which does not exist"))?;
            if !matches!(
                saga.state,
                SagaState::Done | SagaState::FailedRolledBack | SagaState::Undone
            ) {
                return Err(format!(
                    "it prunes saga {saga_id}, which is {}, not finished and settled",
                    saga.state
                ));
            }
            if saga.updated_at_ms.is_some_and(|at_ms| at_ms >= before_ms) {
                return Err(format!(
                    "it prunes saga {saga_id}, last changed after its horizon"
                ));
            }
            if with_open_letter.contains(saga_id) {
                return Err(format!(
                    "it prunes saga {saga_id}, which has an open dead letter"
                ));
            }
            if with_open_request.contains(saga_id) {
                return Err(format!(
                    "it prunes saga {saga_id}, which has an open approval request"
                ));
            }
            n_counted += saga.n_known_steps;
            pruned.insert(saga_id, saga.records.clone());
        }
        if n_counted != n_steps {
            return Err(format!(
                "it counts {n_steps} steps, but the sagas it prunes have {n_counted}"
            ));
        }
        let ids: Vec<String> = pruned.keys().map(|saga_id| (*saga_id).to_owned()).collect();
        if crate::store::prune::records_sha256(pruned) != records_sha256 {
            return Err(
                "its `records_sha256` is not the hash of the pruned sagas' records".to_owned(),
            );
        }
        let scratch = &mut self.scratch;
        let mut removed = Ok(());
        for saga_id in &ids {
            removed = removed.and_then(|()| self.sagas.remove(scratch, &id_key(saga_id)));
        }
        let removed = removed
            .and_then(|()| self.steps.remove_groups(scratch, &ids))
            .and_then(|()| self.keys.remove_groups(scratch, &ids))
            .and_then(|()| self.approvals.remove_groups(scratch, &ids))
            .and_then(|()| self.dead_letters.remove_groups(scratch, &ids));
        scratch.noted(removed)
    }

    pub(super) fn genesis(&mut self, record: &Record, body: &Body<'_>) -> Result<(), String> {
        if record.seq != 1 {
            return Err("a Genesis record can only start the chain".to_owned());
        }
        for (saga_id, saga) in body.object("sagas")?.0 {
            let saga = saga
                .as_object()
                .map(Body)
                .ok_or_else(|| format!("its saga {saga_id} is not an object"))?;
            let mut steps = BTreeMap::new();
            let listed = saga
                .field("steps")?
                .as_array()
                .ok_or_else(|| format!("the steps of its saga {saga_id} are not a list"))?;
            for step in listed {
                let (step_seq, status) = match step.as_array().map(Vec::as_slice) {
                    Some([Value::Number(step_seq), Value::String(status)]) => {
                        (step_seq.as_i64(), status.parse::<StepStatus>().ok())
                    }
                    _ => (None, None),
                };
                let (Some(step_seq), Some(status)) = (step_seq, status) else {
                    return Err(format!("a step of its saga {saga_id} is malformed"));
                };
                steps.insert(
                    step_seq,
                    StepModel {
                        last_seq: record.seq,
                        status,
                        content: None,
                        output_sha256: None,
                        error_sha256: None,
                        compensation_sha256: None,
                        created_at_ms: None,
                        updated_at_ms: None,
                    },
                );
            }
            let n_known_steps = i64::try_from(steps.len()).unwrap_or(i64::MAX);
            for (step_seq, step) in steps {
                Self::put(
                    &mut self.scratch,
                    &mut self.steps,
                    (saga_id.clone(), step_seq),
                    step,
                )?;
            }
            let model = SagaModel {
                last_seq: record.seq,
                state: saga.state("state")?,
                owner: None,
                n_steps: None,
                // No log before schema version 3 holds a dry run.
                dry_run: Some(false),
                name: None,
                actor: None,
                created_at_ms: None,
                updated_at_ms: None,
                n_known_steps,
                records: SagaRecords::default(),
            };
            Self::put(&mut self.scratch, &mut self.sagas, id_key(saga_id), model)?;
        }
        for (key, binding) in body.object("idempotency_keys")?.0 {
            let binding = binding
                .as_object()
                .map(Body)
                .ok_or_else(|| format!("its idempotency key {key} is not an object"))?;
            let binding = KeyModel {
                last_seq: record.seq,
                args_hash: binding.str("args_hash")?.to_owned(),
                saga_id: binding.str("saga_id")?.to_owned(),
                step_seq: binding.int("step_seq")?,
            };
            Self::put(&mut self.scratch, &mut self.keys, id_key(key), binding)?;
        }
        Ok(())
    }

    /// The entry of `map` (a field of `self`) under `key`, for the comparison with the
    /// tables: a failure of the scratch database is noted and becomes a read error.
    pub(super) fn lookup<'a, V: Entry + Clone>(
        &'a self,
        map: &'a Spill<V>,
        key: &Key,
    ) -> Result<Option<Cow<'a, V>>, SqlError> {
        self.scratch
            .noted(map.get(&self.scratch, key))
            .map_err(SqlError::Database)
    }

    /// Calls `each` with every entry of `map` (a field of `self`).
    pub(super) fn each<V: Entry>(
        &self,
        map: &Spill<V>,
        each: &mut dyn FnMut(&Key, &V) -> Result<(), SqlError>,
    ) -> Result<(), SqlError> {
        map.for_each(&self.scratch, &mut |key, value| {
            each(key, value).map_err(Fault::Log)
        })
        .map_err(|fault| match fault {
            Fault::Log(err) => err,
            Fault::Scratch(err) => SqlError::Database(self.scratch.note(&err)),
        })
    }
}
