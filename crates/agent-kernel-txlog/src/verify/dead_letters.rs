//! Replaying the records of dead letters, by the rules the write path keeps
//! (`transitions`).

#[allow(clippy::wildcard_imports)]
use super::*;
use crate::transitions::{CLEARED_BY_LAST_LETTER, settles};

impl Replay {
    /// A dead letter recorded, or reopened with one more attempt, for a step an earlier
    /// record began.
    pub(super) fn dead_letter(
        &mut self,
        saga_id: &str,
        body: &Body<'_>,
        seq: i64,
        at_ms: i64,
    ) -> Result<(), String> {
        let step_seq = body.int("step_seq")?;
        self.saga_mut(saga_id)?;
        if !self.has_step(saga_id, step_seq)? {
            return Err(format!(
                "it records a dead letter for step {step_seq} of saga {saga_id}, which no earlier record began"
            ));
        }
        let letter_id = body.str("letter_id")?.to_owned();
        let attempts = body.int("attempts")?;
        let first_failed_at_ms = body.int("first_failed_at_ms")?;
        let model = DeadLetterModel {
            last_seq: seq,
            saga_id: saga_id.to_owned(),
            step_seq,
            tool_id: body.str("tool")?.to_owned(),
            error_sha256: body.str("error_sha256")?.to_owned(),
            attempts,
            first_failed_at_ms,
            last_failed_at_ms: at_ms,
            next_retry_at_ms: body.int("next_retry_at_ms")?,
            status: DeadLetterStatus::Open.as_str().to_owned(),
            settled_at_ms: None,
            settled_by: None,
            note_sha256: None,
        };
        let expected_attempts = self.expected_attempts(saga_id, step_seq, &letter_id, at_ms)?;
        if (attempts, first_failed_at_ms) != expected_attempts {
            return Err(format!(
                "it counts {attempts} attempts since {first_failed_at_ms} for dead letter {letter_id}, where the chain says {} since {}",
                expected_attempts.0, expected_attempts.1
            ));
        }
        Self::put(
            &mut self.scratch,
            &mut self.dead_letters,
            id_key(&letter_id),
            model,
        )
    }

    /// The attempts and first failure a record of `letter_id` must count: its first, or one
    /// more than the letter the chain holds for the same step.
    fn expected_attempts(
        &mut self,
        saga_id: &str,
        step_seq: i64,
        letter_id: &str,
        at_ms: i64,
    ) -> Result<(i64, i64), String> {
        let known = self.dead_letters.get(&self.scratch, &id_key(letter_id));
        match self.scratch.noted(known)?.as_deref() {
            None => {
                let of_saga = self.dead_letters.group_entries(&self.scratch, saga_id);
                if let Some(((other, _), _)) = self
                    .scratch
                    .noted(of_saga)?
                    .into_iter()
                    .find(|(_, letter)| letter.step_seq == step_seq)
                {
                    return Err(format!(
                        "it records dead letter {letter_id} for a step that has letter {other}"
                    ));
                }
                Ok((1, at_ms))
            }
            Some(known) if known.saga_id == saga_id && known.step_seq == step_seq => {
                Ok((known.attempts + 1, known.first_failed_at_ms))
            }
            Some(_) => Err(format!(
                "it records dead letter {letter_id} for another step than its own"
            )),
        }
    }

    /// A dead letter settled ([`settles`]), and the saga cleared when it was the last open
    /// one ([`CLEARED_BY_LAST_LETTER`]).
    pub(super) fn dead_letter_settled(
        &mut self,
        saga_id: &str,
        body: &Body<'_>,
        seq: i64,
        at_ms: i64,
    ) -> Result<(), String> {
        body.object("by")?;
        let status: DeadLetterStatus = body.parsed("status")?;
        let note_sha256 = body.opt_str("note_sha256")?;
        let settled_by = body.opt_str("settled_by")?;
        let letter_id = body.str("letter_id")?;
        let found = self
            .dead_letters
            .get_mut(&mut self.scratch, &id_key(letter_id));
        let letter = self.scratch.noted(found)?.ok_or_else(|| {
            format!("it settles dead letter {letter_id}, which no earlier record wrote")
        })?;
        let current: DeadLetterStatus = letter.status.parse()?;
        if letter.saga_id != saga_id || !settles(current, status) {
            return Err(format!(
                "it settles dead letter {letter_id} of saga {} ({}) as {status}",
                letter.saga_id, letter.status
            ));
        }
        letter.status = status.as_str().to_owned();
        letter.settled_at_ms = Some(at_ms);
        letter.settled_by = settled_by;
        letter.note_sha256 = note_sha256;
        letter.last_seq = seq;
        self.clear_after_settling(saga_id, body, seq, at_ms)
    }

    /// The saga's move when a letter of it is settled: out of
    /// `CLEARED_BY_LAST_LETTER.0` once none is open, else none.
    fn clear_after_settling(
        &mut self,
        saga_id: &str,
        body: &Body<'_>,
        seq: i64,
        at_ms: i64,
    ) -> Result<(), String> {
        let of_saga = self.dead_letters.group_entries(&self.scratch, saga_id);
        let still_open = self
            .scratch
            .noted(of_saga)?
            .iter()
            .any(|(_, letter)| letter.open());
        let saga = self.saga_mut(saga_id)?;
        let (from, to) = CLEARED_BY_LAST_LETTER;
        let clears = !still_open && saga.state == from;
        match body.opt_str("saga_state")? {
            Some(state) if clears && state == to.as_str() => {
                saga.state = to;
                saga.updated_at_ms = Some(at_ms);
                saga.last_seq = seq;
                Ok(())
            }
            None if !clears => Ok(()),
            other => Err(format!(
                "it moves saga {saga_id} to {other:?} as its dead letters are settled, where the chain says {}",
                if clears { to.as_str() } else { "no move" }
            )),
        }
    }
}
