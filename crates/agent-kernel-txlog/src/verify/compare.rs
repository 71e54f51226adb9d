//! Comparing the model the chain built with the tables, row by row.

#[allow(clippy::wildcard_imports)]
use super::*;

impl Replay {
    /// Compares the tables with the replayed chain; the problem at the earliest record, if
    /// any. `last_seq` is the chain's newest record.
    pub(super) fn compare(
        &self,
        conn: &dyn Db,
        tables: Tables,
        last_seq: i64,
    ) -> Option<BadRecord> {
        let mut found = Found {
            first: None,
            unaccounted_seq: last_seq + 1,
        };
        if let Err(err) = self.compare_sagas(conn, tables, &mut found) {
            found.note(
                last_seq + 1,
                format!("the sagas table cannot be read: {err}"),
            );
        }
        if let Err(err) = self.compare_steps(conn, tables, &mut found) {
            found.note(
                last_seq + 1,
                format!("the saga_steps table cannot be read: {err}"),
            );
        }
        if let Err(err) = self.compare_keys(conn, &mut found) {
            found.note(
                last_seq + 1,
                format!("the idempotency_keys table cannot be read: {err}"),
            );
        }
        if tables.approvals
            && let Err(err) = self.compare_approvals(conn, &mut found)
        {
            found.note(
                last_seq + 1,
                format!("the approvals table cannot be read: {err}"),
            );
        }
        if tables.dead_letters
            && let Err(err) = self.compare_dead_letters(conn, &mut found)
        {
            found.note(
                last_seq + 1,
                format!("the dead_letters table cannot be read: {err}"),
            );
        }
        found.first
    }

    pub(super) fn compare_approvals(
        &self,
        conn: &dyn Db,
        found: &mut Found,
    ) -> Result<(), SqlError> {
        let mut n_seen = 0_usize;
        let sha256_of = |text: Option<String>| text.map(|text| sha256_hex(text.as_bytes()));
        conn.query_each(
            "SELECT approval_id, saga_id, step_seq, tool_id, args, idempotency_key, digest, rest,
                 status, requested_at_ms, expires_at_ms, decided_at_ms, note, decided_by,
                 decision_seq, operator_key_check
             FROM approvals",
            params![],
            &mut |row| {
            let approval_id: String = row.get(0)?;
            let Some(known) = self.lookup(&self.approvals, &id_key(&approval_id))? else {
                found.unaccounted(format!(
                    "approval {approval_id} is in the approvals table, but no audit record requests it"
                ));
                return Ok(true);
            };
            n_seen += 1;
            let actual = ApprovalModel {
                last_seq: known.last_seq,
                saga_id: row.get(1)?,
                step_seq: row.get(2)?,
                tool_id: row.get(3)?,
                args_sha256: sha256_hex(row.get::<_, String>(4)?.as_bytes()),
                idempotency_key: row.get(5)?,
                digest: row.get(6)?,
                rest_sha256: sha256_of(row.get(7)?),
                status: row.get(8)?,
                requested_at_ms: row.get(9)?,
                expires_at_ms: row.get(10)?,
                decided_at_ms: row.get(11)?,
                decided_by: row
                    .get::<_, Option<String>>(13)?
                    .map(|by| audit::quote(&by, audit::QUOTE_BYTES_MAX)),
                note_sha256: sha256_of(row.get(12)?),
                decision_seq: row.get(14)?,
                operator_key_check: row.get(15)?,
            };
            if actual != *known {
                found.note(
                    known.last_seq,
                    format!(
                        "approval {approval_id} in the approvals table differs from the audit chain (its step, arguments, digest, status or decision)"
                    ),
                );
            }
                Ok(true)
            },
        )?;
        if n_seen < self.approvals.len() {
            self.note_missing_rows(
                conn,
                found,
                ("approvals", "approval_id", "approval"),
                &self.approvals,
                |known| known.last_seq,
            )?;
        }
        Ok(())
    }

    pub(super) fn compare_dead_letters(
        &self,
        conn: &dyn Db,
        found: &mut Found,
    ) -> Result<(), SqlError> {
        let mut n_seen = 0_usize;
        conn.query_each(
            "SELECT letter_id, saga_id, step_seq, tool_id, error, attempts, first_failed_at_ms,
                 last_failed_at_ms, next_retry_at_ms, status, settled_at_ms, settled_by, note
             FROM dead_letters",
            params![],
            &mut |row| {
            let letter_id: String = row.get(0)?;
            let Some(known) = self.lookup(&self.dead_letters, &id_key(&letter_id))? else {
                found.unaccounted(format!(
                    "dead letter {letter_id} is in the dead_letters table, but no audit record writes it"
                ));
                return Ok(true);
            };
            n_seen += 1;
            let actual = DeadLetterModel {
                last_seq: known.last_seq,
                saga_id: row.get(1)?,
                step_seq: row.get(2)?,
                tool_id: row.get(3)?,
                error_sha256: sha256_hex(row.get::<_, String>(4)?.as_bytes()),
                attempts: row.get(5)?,
                first_failed_at_ms: row.get(6)?,
                last_failed_at_ms: row.get(7)?,
                next_retry_at_ms: row.get(8)?,
                status: row.get(9)?,
                settled_at_ms: row.get(10)?,
                settled_by: row
                    .get::<_, Option<String>>(11)?
                    .map(|by| audit::quote(&by, audit::QUOTE_BYTES_MAX)),
                note_sha256: row
                    .get::<_, Option<String>>(12)?
                    .map(|note| sha256_hex(note.as_bytes())),
            };
            if actual != *known {
                found.note(
                    known.last_seq,
                    format!(
                        "dead letter {letter_id} in the dead_letters table differs from the audit chain (its step, error, attempts, status or settlement)"
                    ),
                );
            }
                Ok(true)
            },
        )?;
        if n_seen < self.dead_letters.len() {
            self.note_missing_rows(
                conn,
                found,
                ("dead_letters", "letter_id", "dead letter"),
                &self.dead_letters,
                |known| known.last_seq,
            )?;
        }
        Ok(())
    }

    pub(super) fn compare_sagas(
        &self,
        conn: &dyn Db,
        tables: Tables,
        found: &mut Found,
    ) -> Result<(), SqlError> {
        // Logs of schema version 2 have no `dry_run` column: none of their sagas is one.
        let dry_run_column = if tables.dry_run { "dry_run" } else { "0" };
        let mut n_seen = 0_usize;
        conn.query_each(
            &format!(
                "SELECT saga_id, state, owner_host, owner_boot_id, owner_pid, owner_start_ticks,
                 n_steps, name, actor, created_at_ms, updated_at_ms, {dry_run_column}
             FROM sagas"
            ),
            params![],
            &mut |row| {
                let saga_id: String = row.get(0)?;
                let Some(saga) = self.lookup(&self.sagas, &id_key(&saga_id))? else {
                    found.unaccounted(format!(
                        "saga {saga_id} is in the sagas table, but no audit record creates it"
                    ));
                    return Ok(true);
                };
                n_seen += 1;
                let state: String = row.get(1)?;
                let owner = OwnerModel {
                    host: row.get(2)?,
                    boot_id: row.get(3)?,
                    pid: row.get(4)?,
                    start_ticks: row.get(5)?,
                };
                let n_steps: i64 = row.get(6)?;
                let name: Option<String> = row.get(7)?;
                let actor: Option<String> = row.get(8)?;
                let created_at_ms: i64 = row.get(9)?;
                let updated_at_ms: i64 = row.get(10)?;
                let dry_run: i64 = row.get(11)?;
                let mut differences = Vec::new();
                if state != saga.state.as_str() {
                    differences.push("state");
                }
                if saga.owner.as_ref().is_some_and(|known| *known != owner) {
                    differences.push("owner");
                }
                if saga.n_steps.is_some_and(|known| known != n_steps) {
                    differences.push("n_steps");
                }
                if saga
                    .dry_run
                    .is_some_and(|known| i64::from(known) != dry_run)
                {
                    differences.push("dry_run");
                }
                if saga.name.as_ref().is_some_and(|known| *known != name) {
                    differences.push("name");
                }
                if saga.actor.as_ref().is_some_and(|known| *known != actor) {
                    differences.push("actor");
                }
                if saga
                    .created_at_ms
                    .is_some_and(|known| known != created_at_ms)
                {
                    differences.push("created_at_ms");
                }
                if saga
                    .updated_at_ms
                    .is_some_and(|known| known != updated_at_ms)
                {
                    differences.push("updated_at_ms");
                }
                if !differences.is_empty() {
                    found.note(
                    saga.last_seq,
                    format!(
                        "saga {saga_id} in the sagas table differs from the audit chain in its {}",
                        differences.join(", ")
                    ),
                );
                }
                Ok(true)
            },
        )?;
        if n_seen < self.sagas.len() {
            self.note_missing_rows(
                conn,
                found,
                ("sagas", "saga_id", "saga"),
                &self.sagas,
                |saga| saga.last_seq,
            )?;
        }
        Ok(())
    }

    pub(super) fn compare_steps(
        &self,
        conn: &dyn Db,
        tables: Tables,
        found: &mut Found,
    ) -> Result<(), SqlError> {
        let mut n_seen = 0_usize;
        let sha256_of = |text: Option<String>| text.map(|text| sha256_hex(text.as_bytes()));
        // Logs of schema version 7 and older keep no resources in the step rows: there
        // they are not compared.
        let resources_column = if tables.step_resources {
            "resources"
        } else {
            "NULL"
        };
        conn.query_each(
            &format!(
                "SELECT saga_id, step_seq, status, tool_id, tool_version, effect, idempotency_key,
                     args, args_hash, undo, undo_blob, output, error, reused_from_saga,
                     reused_from_seq, compensation, created_at_ms, updated_at_ms,
                     {resources_column}
                 FROM saga_steps"
            ),
            params![],
            &mut |row| {
            let saga_id: String = row.get(0)?;
            let step_seq: i64 = row.get(1)?;
            let Some(step) = self.lookup(&self.steps, &(saga_id.clone(), step_seq))? else {
                found.unaccounted(format!(
                    "step {step_seq} of saga {saga_id} is in the saga_steps table, but no audit record begins it"
                ));
                return Ok(true);
            };
            n_seen += 1;
            let mut differences = Vec::new();
            if row.get::<_, String>(2)? != step.status.as_str() {
                differences.push("status");
            }
            if let Some(content) = &step.content {
                let reused_from = match (
                    row.get::<_, Option<String>>(13)?,
                    row.get::<_, Option<i64>>(14)?,
                ) {
                    (Some(saga), Some(seq)) => Some((saga, seq)),
                    _ => None,
                };
                let actual = StepContent {
                    tool_id: row.get(3)?,
                    tool_version: row.get(4)?,
                    effect: row.get(5)?,
                    idempotency_key: row.get(6)?,
                    args_sha256: sha256_hex(row.get::<_, String>(7)?.as_bytes()),
                    args_hash: row.get(8)?,
                    undo_sha256: sha256_hex(row.get::<_, String>(9)?.as_bytes()),
                    undo_blob_sha256: row
                        .get::<_, Option<Vec<u8>>>(10)?
                        .map(|blob| sha256_hex(&blob)),
                    reused_from,
                    resources: if tables.step_resources {
                        sorted_resources(row.get(18)?)
                    } else {
                        content.resources.clone()
                    },
                };
                if actual != *content {
                    differences.push("content (tool, arguments, undo data, reuse or resources)");
                }
            }
            let columns = [
                (&step.output_sha256, 11, "output"),
                (&step.error_sha256, 12, "error"),
                (&step.compensation_sha256, 15, "compensation"),
            ];
            for (known, idx, what) in columns {
                if let Some(known) = known
                    && *known != sha256_of(row.get(idx)?)
                {
                    differences.push(what);
                }
            }
            let created_at_ms: i64 = row.get(16)?;
            let updated_at_ms: i64 = row.get(17)?;
            if step
                .created_at_ms
                .is_some_and(|known| known != created_at_ms)
            {
                differences.push("created_at_ms");
            }
            if step
                .updated_at_ms
                .is_some_and(|known| known != updated_at_ms)
            {
                differences.push("updated_at_ms");
            }
            if !differences.is_empty() {
                found.note(
                    step.last_seq,
                    format!(
                        "step {step_seq} of saga {saga_id} in the saga_steps table differs from the audit chain in its {}",
                        differences.join(", ")
                    ),
                );
            }
                Ok(true)
            },
        )?;
        if n_seen < self.steps.len() {
            self.each(&self.steps, &mut |(saga_id, step_seq), step| {
                let exists: bool = conn.query_row(
                    "SELECT EXISTS (SELECT 1 FROM saga_steps WHERE saga_id = ?1 AND step_seq = ?2)",
                    params![saga_id, step_seq],
                    |row| row.get(0),
                )?;
                if !exists {
                    found.note(
                        step.last_seq,
                        format!(
                            "step {step_seq} of saga {saga_id} is in the audit chain but not in the saga_steps table"
                        ),
                    );
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    pub(super) fn compare_keys(&self, conn: &dyn Db, found: &mut Found) -> Result<(), SqlError> {
        let mut n_seen = 0_usize;
        conn.query_each(
            "SELECT key, args_hash, saga_id, step_seq FROM idempotency_keys",
            params![],
            &mut |row| {
                let key: String = row.get(0)?;
                let Some(binding) = self.lookup(&self.keys, &id_key(&key))? else {
                    found.unaccounted(format!(
                        "idempotency key `{key}` is in the idempotency_keys table, but no audit record claims it"
                    ));
                    return Ok(true);
                };
                n_seen += 1;
                if row.get::<_, String>(1)? != binding.args_hash
                    || row.get::<_, String>(2)? != binding.saga_id
                    || row.get::<_, i64>(3)? != binding.step_seq
                {
                    found.note(
                        binding.last_seq,
                        format!(
                            "idempotency key `{key}` is bound to other arguments or another step in the idempotency_keys table than the audit chain says"
                        ),
                    );
                }
                Ok(true)
            },
        )?;
        if n_seen < self.keys.len() {
            self.each(&self.keys, &mut |(key, _), binding| {
                let exists: bool = conn.query_row(
                    "SELECT EXISTS (SELECT 1 FROM idempotency_keys WHERE key = ?1)",
                    params![key],
                    |row| row.get(0),
                )?;
                if !exists {
                    found.note(
                        binding.last_seq,
                        format!(
                            "idempotency key `{key}` is in the audit chain but not in the idempotency_keys table"
                        ),
                    );
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Notes each row the chain describes in `known` (a map keyed by one id, with the
    /// record that last set each) that the table, named with its key column and what a row
    /// is, does not hold.
    pub(super) fn note_missing_rows<V: Entry>(
        &self,
        conn: &dyn Db,
        found: &mut Found,
        (table, key_column, what): (&str, &str, &str),
        known: &Spill<V>,
        last_seq: impl Fn(&V) -> i64,
    ) -> Result<(), SqlError> {
        let exists_sql = format!("SELECT EXISTS (SELECT 1 FROM {table} WHERE {key_column} = ?1)");
        self.each(known, &mut |(id, _), value| {
            let exists: bool = conn.query_row(&exists_sql, params![id], |row| row.get(0))?;
            if !exists {
                found.note(
                    last_seq(value),
                    format!("{what} {id} is in the audit chain but not in the {table} table"),
                );
            }
            Ok(())
        })
    }
}

/// A step row's `resources` column, sorted: empty when NULL; a value that is not a JSON
/// array of text is kept as one item, so that it differs from what any record declares.
fn sorted_resources(column: Option<String>) -> Vec<String> {
    let Some(text) = column else {
        return Vec::new();
    };
    match serde_json::from_str::<Vec<String>>(&text) {
        Ok(mut resources) => {
            resources.sort_unstable();
            resources
        }
        Err(_) => vec![text],
    }
}
