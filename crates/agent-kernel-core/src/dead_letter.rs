//! Dead letters (reference §10): every compensation that still fails after its retries, and
//! every step of unknown outcome left to an operator, is kept as a dead letter until a retry
//! compensates it or an operator resolves it by hand; when none of a saga's remains, the
//! saga is `FailedRolledBack`.

use agent_kernel_api::{
    DeadLetter, DeadLetterStatus, LogWrite, MAX_DECISION_NOTE_BYTES, RecordDeadLetter, SagaId,
    SagaState, SettleDeadLetter, StepRecord, StepStatus, ToolError, WriteOutcome,
};
use tracing::{info, warn};

use crate::KernelError;
use crate::compensation::WhenChanged;
use crate::kernel::Kernel;

/// The first backoff before a failed compensation is due to be retried (`dlq retry --due`).
pub const DEAD_LETTER_BACKOFF_BASE_MS: i64 = 60_000;

/// The longest backoff between retries of a dead letter: it doubles per attempt up to this.
pub const DEAD_LETTER_BACKOFF_MAX_MS: i64 = 3_600_000;

/// The backoff after the `attempts`-th failure.
pub fn dead_letter_backoff_ms(attempts: u32) -> i64 {
    DEAD_LETTER_BACKOFF_BASE_MS
        .saturating_mul(1_i64 << attempts.saturating_sub(1).min(32))
        .min(DEAD_LETTER_BACKOFF_MAX_MS)
}

/// What a retry of a dead letter came to.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RetryOutcome {
    /// The letter as it now stands (`retried`, or `open` with one more attempt).
    pub letter: DeadLetter,
    /// The saga's state afterwards: `FailedRolledBack` once none of its letters is open.
    pub saga_state: SagaState,
    /// The compensation's note, or its error.
    pub detail: String,
}

impl RetryOutcome {
    /// Whether the compensation succeeded this time.
    pub fn compensated(&self) -> bool {
        self.letter.status == DeadLetterStatus::Retried
    }
}

/// The first step of `steps` later than `step` that shares a resource with it and whose
/// dead letter is open (its step in `open`), with that resource.
fn later_not_undone<'s>(
    steps: &'s [StepRecord],
    step: &StepRecord,
    open: &[u32],
) -> Option<(u32, &'s str)> {
    steps
        .iter()
        .filter(|later| later.step_seq > step.step_seq && open.contains(&later.step_seq))
        .find_map(|later| {
            later
                .resources
                .iter()
                .find(|resource| step.resources.contains(resource))
                .map(|resource| (later.step_seq, resource.as_str()))
        })
}

impl Kernel {
    /// The dead letter to record with a failed compensation of `step`: a new letter, or the
    /// step's open one with its attempts counted on, due again after the backoff.
    pub(crate) async fn dead_letter_for(
        &self,
        saga_id: &SagaId,
        step: &StepRecord,
        error: &ToolError,
    ) -> Result<LogWrite, KernelError> {
        let attempts = self
            .log
            .open_dead_letters(Some(saga_id))
            .await?
            .iter()
            .find(|letter| letter.step_seq == step.step_seq)
            .map_or(1, |letter| letter.attempts.saturating_add(1));
        Ok(LogWrite::RecordDeadLetter(RecordDeadLetter {
            letter_id: self.env.ids.new_record_id(),
            saga_id: saga_id.clone(),
            step_seq: step.step_seq,
            tool_id: step.tool_id.clone(),
            error: error.to_string(),
            next_retry_at_ms: self
                .env
                .clock
                .now_ms()
                .saturating_add(dead_letter_backoff_ms(attempts)),
        }))
    }

    /// The open dead letters, of one saga or of all, oldest first.
    ///
    /// # Errors
    ///
    /// [`KernelError::Log`] when the log cannot be read.
    pub async fn dead_letters(
        &self,
        saga_id: Option<&SagaId>,
    ) -> Result<Vec<DeadLetter>, KernelError> {
        Ok(self.log.open_dead_letters(saga_id).await?)
    }

    /// One dead letter, open or settled.
    ///
    /// # Errors
    ///
    /// [`KernelError::DeadLetterNotFound`]; [`KernelError::Log`].
    pub async fn dead_letter(&self, letter_id: &str) -> Result<DeadLetter, KernelError> {
        self.log
            .dead_letter(letter_id)
            .await?
            .ok_or_else(|| KernelError::DeadLetterNotFound(letter_id.to_owned()))
    }

    /// Runs an open dead letter's compensation again, from its step's log record, under
    /// the tools and policy of this kernel. Compensated: the letter is `retried`, the step
    /// `COMPENSATED`, and, when no letter of the saga is left open, the saga
    /// `FailedRolledBack`, all in one transaction. Failed again: the letter stays open with
    /// one more attempt. The command is in the audit chain before it acts (`dlq retry`).
    ///
    /// # Errors
    ///
    /// [`KernelError::DeadLetterNotFound`]; [`KernelError::DeadLetterClosed`] for a letter
    /// already settled; [`KernelError::InvalidRequest`] while the saga's rollback has not
    /// finished, or while a later step of the saga on one of the step's resources has an
    /// open letter (compensations run last first; `force` runs it anyway); [`KernelError::MissingTools`] when this program lacks the step's tool
    /// (nothing is changed); [`KernelError::Log`].
    pub async fn retry_dead_letter(
        &self,
        letter_id: &str,
        user: Option<String>,
    ) -> Result<RetryOutcome, KernelError> {
        self.retry_dead_letter_with(letter_id, user, false).await
    }

    /// [`Kernel::retry_dead_letter`], and with `force` the compensation runs even when what
    /// its step left has changed since (`dlq retry --force`): the letter of a rollback
    /// that refused to clobber a later change, which the operator has looked at. Without
    /// `force`, a step still changed fails again with a `changed since:` error.
    ///
    /// # Errors
    ///
    /// As [`Kernel::retry_dead_letter`].
    pub async fn retry_dead_letter_with(
        &self,
        letter_id: &str,
        user: Option<String>,
        force: bool,
    ) -> Result<RetryOutcome, KernelError> {
        let letter = self.dead_letter(letter_id).await?;
        if !force && letter.status == DeadLetterStatus::Open {
            self.refuse_out_of_order(&letter).await?;
        }
        let options = if force {
            vec!["--force".to_owned()]
        } else {
            Vec::new()
        };
        self.record_operator_command_with("dlq retry", Some(&letter.saga_id), options)
            .await?;
        let letter = self.open_letter(letter_id).await?;
        let mut record = self.load(&letter.saga_id).await?;
        refuse_unsettled(&record)?;
        self.own_settled(&mut record).await?;
        let step = record
            .steps
            .iter()
            .find(|step| step.step_seq == letter.step_seq)
            .ok_or_else(|| KernelError::Inconsistent {
                saga_id: letter.saga_id.clone(),
                reason: format!(
                    "dead letter {letter_id} names step {}, which the log does not hold",
                    letter.step_seq
                ),
            })?;
        if step.status == StepStatus::Compensated {
            return Err(KernelError::Inconsistent {
                saga_id: letter.saga_id.clone(),
                reason: format!(
                    "dead letter {letter_id} is open, but step {} is already COMPENSATED",
                    step.step_seq
                ),
            });
        }
        // An unavailable upstream server fails the compensation below, naming it.
        let unavailable = self.tools.load(&step.tool_id).await.is_err();
        if self.tools.get(&step.tool_id).is_none() && !unavailable {
            return Err(KernelError::MissingTools {
                saga_id: letter.saga_id.clone(),
                tools: vec![step.tool_id.clone()],
            });
        }
        self.log.effect_allowed()?;
        // A later saga's effect may cover the step's (an undo's letter): not run, unless
        // forced, as a change since.
        let covered = if force {
            None
        } else {
            self.covered_by(&letter.saga_id, step).await?
        };
        let result = match covered {
            Some(reason) => Err(ToolError::changed(crate::compensation::covered_error(
                &reason,
            ))),
            None => {
                self.compensate_step(
                    &letter.saga_id,
                    record.saga.actor.as_deref(),
                    step,
                    if force {
                        WhenChanged::Force
                    } else {
                        WhenChanged::Refuse
                    },
                )
                .await
            }
        };
        let detail = match &result {
            Ok(note) => note.clone(),
            Err(error) => error.to_string(),
        };
        let mut batch = Vec::new();
        match &result {
            Ok(note) => {
                info!(letter_id, saga_id = %letter.saga_id, step_seq = step.step_seq, "dead letter retried: compensated");
                batch.push(self.settlement(letter_id, DeadLetterStatus::Retried, user, note));
            }
            Err(error) => {
                warn!(letter_id, saga_id = %letter.saga_id, step_seq = step.step_seq, %error, "dead letter retried: failed again");
                batch.push(self.dead_letter_for(&letter.saga_id, step, error).await?);
            }
        }
        batch.insert(
            0,
            LogWrite::Compensation {
                saga_id: letter.saga_id.clone(),
                step_seq: step.step_seq,
                result,
            },
        );
        let saga_state = self
            .settle_saga_if_clear(&letter.saga_id, letter_id, batch)
            .await?;
        Ok(RetryOutcome {
            letter: self.dead_letter(letter_id).await?,
            saga_state,
            detail,
        })
    }

    /// Refuses the retry of `letter` while a later step of its saga on one of its step's
    /// resources has an open letter: compensations run last first, and this one would act
    /// under that step's effect. Checked before the command is recorded: nothing is done.
    async fn refuse_out_of_order(&self, letter: &DeadLetter) -> Result<(), KernelError> {
        let record = self.load(&letter.saga_id).await?;
        let Some(step) = record
            .steps
            .iter()
            .find(|step| step.step_seq == letter.step_seq)
        else {
            return Ok(());
        };
        let open: Vec<u32> = self
            .log
            .open_dead_letters(Some(&letter.saga_id))
            .await?
            .iter()
            .map(|open| open.step_seq)
            .collect();
        match later_not_undone(&record.steps, step, &open) {
            Some((later, resource)) => Err(KernelError::InvalidRequest(format!(
                "step {later} of saga {}, later on the same resource `{resource}`, is not compensated (its dead letter is open): retry that one first, or use --force to run this compensation anyway; nothing was done",
                record.saga.saga_id
            ))),
            None => Ok(()),
        }
    }

    /// Settles an open dead letter by hand: the operator says what was done (`note`); the
    /// step stays as the log has it. When no letter of the saga is left open, the saga is
    /// `FailedRolledBack`. The command is in the audit chain before it acts.
    ///
    /// # Errors
    ///
    /// [`KernelError::DeadLetterNotFound`]; [`KernelError::DeadLetterClosed`];
    /// [`KernelError::InvalidRequest`] for an empty or over-long note; [`KernelError::Log`].
    pub async fn resolve_dead_letter(
        &self,
        letter_id: &str,
        note: String,
        user: Option<String>,
    ) -> Result<RetryOutcome, KernelError> {
        if note.trim().is_empty() || note.len() > MAX_DECISION_NOTE_BYTES {
            return Err(KernelError::InvalidRequest(format!(
                "a resolution needs a note of 1 to {MAX_DECISION_NOTE_BYTES} bytes saying how the step was settled"
            )));
        }
        let letter = self.dead_letter(letter_id).await?;
        self.record_operator_command("dlq resolve", Some(&letter.saga_id))
            .await?;
        let letter = self.open_letter(letter_id).await?;
        let record = self.load(&letter.saga_id).await?;
        refuse_unsettled(&record)?;
        // Nothing a dead retry started may act after the letter is settled.
        self.stop_programs_of_dead_owner(&record).await?;
        let batch = vec![self.settlement(letter_id, DeadLetterStatus::Resolved, user, &note)];
        let saga_state = self
            .settle_saga_if_clear(&letter.saga_id, letter_id, batch)
            .await?;
        Ok(RetryOutcome {
            letter: self.dead_letter(letter_id).await?,
            saga_state,
            detail: note,
        })
    }

    /// The record settling `letter_id` as `status`, by this process and `user`.
    pub(crate) fn settlement(
        &self,
        letter_id: &str,
        status: DeadLetterStatus,
        user: Option<String>,
        note: &str,
    ) -> LogWrite {
        LogWrite::SettleDeadLetter(SettleDeadLetter {
            letter_id: letter_id.to_owned(),
            status,
            by: self.env.owner.clone(),
            uid: self.operator_uid(),
            user,
            note: Some(note.to_owned()),
        })
    }

    /// The letter, if it is still open.
    async fn open_letter(&self, letter_id: &str) -> Result<DeadLetter, KernelError> {
        let letter = self.dead_letter(letter_id).await?;
        if letter.status != DeadLetterStatus::Open {
            return Err(KernelError::DeadLetterClosed {
                letter_id: letter_id.to_owned(),
                status: letter.status,
            });
        }
        Ok(letter)
    }

    /// Writes `batch` (which settles `letter_id`, or keeps it open) in one transaction, in
    /// which the log also moves the saga from `FailedRollbackPartial` to `FailedRolledBack`
    /// once no letter of it is left open; returns the saga's state.
    async fn settle_saga_if_clear(
        &self,
        saga_id: &SagaId,
        letter_id: &str,
        batch: Vec<LogWrite>,
    ) -> Result<SagaState, KernelError> {
        let settles = batch
            .iter()
            .position(|write| matches!(write, LogWrite::SettleDeadLetter(_)));
        let outcomes = self.log.write(batch).await?;
        if let Some(idx) = settles
            && let Some(WriteOutcome::NotOpen(status)) = outcomes.get(idx)
        {
            // Another operator settled it first.
            return Err(KernelError::DeadLetterClosed {
                letter_id: letter_id.to_owned(),
                status: *status,
            });
        }
        Ok(self.load(saga_id).await?.saga.state)
    }
}

/// Refuses to settle a letter of a saga whose rollback or undo has not finished: only a
/// `FailedRollbackPartial` saga is left to an operator. One still compensating (`Done`
/// while an undo runs or after one was killed, or not yet settled) is finished by its
/// process or by `recover`, which may still compensate the letter's step: a letter settled
/// before would leave it stuck, or be overruled.
fn refuse_unsettled(record: &agent_kernel_api::SagaRecord) -> Result<(), KernelError> {
    let saga = &record.saga;
    if saga.state == SagaState::FailedRollbackPartial {
        return Ok(());
    }
    let what = if saga.state.is_terminal() {
        "an undo of it has not finished"
    } else {
        "its rollback has not finished"
    };
    Err(KernelError::InvalidRequest(format!(
        "saga {} is still {}: {what}; let its process finish it, or run `agent-kernel recover` if that process is gone; nothing was done",
        saga.saga_id, saga.state
    )))
}
