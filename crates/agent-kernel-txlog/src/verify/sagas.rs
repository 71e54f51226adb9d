//! Replaying the records of sagas and their steps' outcomes, by the rules the write path
//! keeps (`transitions`).

#[allow(clippy::wildcard_imports)]
use super::*;
use crate::transitions::{COMPENSATION_NEVER_OVER, OUTCOME_FROM};

impl Replay {
    pub(super) fn create_saga(
        &mut self,
        saga_id: &str,
        body: &Body<'_>,
        seq: i64,
        at_ms: i64,
    ) -> Result<(), String> {
        if self.has_saga(saga_id)? {
            return Err(format!("it creates saga {saga_id}, which already exists"));
        }
        let n_steps = body.int("n_steps")?;
        if n_steps < 0 || (n_steps == 0 && body.flag("dry_run")?) {
            return Err(format!(
                "it creates a saga of {n_steps} steps (0 only for a live saga, never for a dry run)"
            ));
        }
        let saga = SagaModel {
            last_seq: seq,
            state: body.state("state")?,
            owner: Some(body.owner("owner")?),
            n_steps: Some(n_steps),
            dry_run: Some(body.flag("dry_run")?),
            name: Some(body.opt_str("name")?),
            actor: Some(body.opt_str("actor")?),
            created_at_ms: Some(at_ms),
            updated_at_ms: Some(at_ms),
            n_known_steps: 0,
            records: SagaRecords::default(),
        };
        Self::put_new(&mut self.scratch, &mut self.sagas, id_key(saga_id), saga)
    }

    pub(super) fn take_over(
        &mut self,
        saga_id: &str,
        body: &Body<'_>,
        seq: i64,
        at_ms: i64,
    ) -> Result<(), String> {
        let state = body.state("state")?;
        let from = body.owner("from_owner")?;
        let to = body.owner("to_owner")?;
        let saga = self.saga_mut(saga_id)?;
        if saga.state != state {
            return Err(format!(
                "it takes over saga {saga_id} in state {state}, but the saga was {}",
                saga.state
            ));
        }
        if saga.owner.as_ref().is_some_and(|owner| *owner != from) {
            return Err(format!(
                "it takes over saga {saga_id} from a process that did not own it"
            ));
        }
        saga.owner = Some(to);
        saga.updated_at_ms = Some(at_ms);
        saga.last_seq = seq;
        Ok(())
    }

    /// A step's `COMMIT` or `FAIL`, over a step in one of [`OUTCOME_FROM`].
    pub(super) fn step_outcome(
        &mut self,
        record: &Record,
        body: &Body<'_>,
        saga_id: &str,
    ) -> Result<(), String> {
        let commits = record.kind == KIND_COMMIT_STEP;
        let (expected, digest_field, verb) = if commits {
            (StepStatus::Commit, "output_sha256", "commits")
        } else {
            (StepStatus::Fail, "error_sha256", "fails")
        };
        let status = body.status("status")?;
        let digest = body.str(digest_field)?.to_owned();
        let step = self.step_mut(saga_id, body.int("step_seq")?)?;
        if status != expected || !OUTCOME_FROM.contains(&step.status) {
            return Err(format!(
                "it {verb} a step that was {}, not BEGIN",
                step.status.as_str()
            ));
        }
        step.status = status;
        if commits {
            step.output_sha256 = Some(Some(digest));
        } else {
            step.error_sha256 = Some(Some(digest));
        }
        step.updated_at_ms = Some(record.at_ms);
        step.last_seq = record.seq;
        Ok(())
    }

    /// A compensation's outcome, never over [`COMPENSATION_NEVER_OVER`].
    pub(super) fn compensation(
        &mut self,
        saga_id: &str,
        body: &Body<'_>,
        seq: i64,
        at_ms: i64,
    ) -> Result<(), String> {
        let status = body.status("status")?;
        let compensation_sha256 = body.str("compensation_sha256")?.to_owned();
        let step = self.step_mut(saga_id, body.int("step_seq")?)?;
        if !matches!(
            status,
            StepStatus::Compensated | StepStatus::CompensationFailed
        ) {
            return Err(format!("its compensation sets status {}", status.as_str()));
        }
        if step.status == COMPENSATION_NEVER_OVER {
            return Err("it compensates a step that was already COMPENSATED".to_owned());
        }
        step.status = status;
        step.compensation_sha256 = Some(Some(compensation_sha256));
        step.updated_at_ms = Some(at_ms);
        step.last_seq = seq;
        Ok(())
    }
}
