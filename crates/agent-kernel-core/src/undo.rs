//! Undo (reference §10): an operator compensates a `Done` saga's steps, last first, within
//! their undo windows, and the saga ends `Undone`. `recover` never starts one; it only finishes an undo
//! whose process was killed after it began (`Kernel::recover`).

use agent_kernel_api::{
    EffectClass, LogWrite, MAX_DECISION_NOTE_BYTES, Reversibility, SagaId, SagaState, StepStatus,
    TxError, format_rfc3339_ms,
};
use std::collections::BTreeMap;

use agent_kernel_fsm::{Event, Facts};
use tracing::{Instrument, info, info_span, warn};

use crate::KernelError;
use crate::compensation::WhenChanged;
use crate::kernel::Kernel;
use crate::owner::Liveness;
use crate::report::{Observer, RecoveryAction, RecoveryReport, SagaReport};

/// How an undo is asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UndoRequest {
    /// Why, recorded in the audit chain.
    pub reason: String,
    /// Undo a step even when what it left has changed since (another writer's work is then
    /// overwritten). Irreversible steps and closed windows are refused all the same.
    pub force: bool,
    /// Who asks, as recorded with the request (`--operator NAME` among its options) when
    /// the caller names its operator, as the console does; the operator's uid is recorded
    /// either way.
    pub by: Option<String>,
}

/// What [`Kernel::undo`] would do to one step, found without changing anything.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum UndoVerdict {
    /// Its compensation would run.
    Undoable,
    /// Its tool cannot take its effect back (reversibility `none`).
    Irreversible,
    /// Its undo window has closed.
    WindowClosed {
        /// The window (`7d`).
        window: String,
    },
    /// What it left has changed since (another writer's work would be overwritten): undone
    /// only with `force`.
    Changed {
        /// What changed, as its tool tells.
        change: String,
    },
    /// Whether what it left has changed cannot be told.
    Unknown {
        /// Why.
        error: String,
    },
    /// This program lacks its tool.
    MissingTool,
}

/// Why a saga in `state` (not `Done`) is not undone.
fn not_done(state: SagaState) -> String {
    format!(
        "only a Done saga is undone; it is {state} (an unfinished saga is rolled back by `recover` or `rollback`)"
    )
}

impl UndoStepPreview {
    /// Why [`Kernel::undo`] refuses this step; empty when it does not (an undoable step, or
    /// one whose tool is missing here, which the undo itself reports).
    pub fn refusal(&self) -> String {
        match &self.verdict {
            UndoVerdict::Irreversible => {
                "its tool is irreversible (reversibility none): its effect cannot be undone"
                    .to_owned()
            }
            UndoVerdict::WindowClosed { window } => format!(
                "its undo window of {window} closed at {}",
                format_rfc3339_ms(self.window_closes_at_ms.unwrap_or_default())
            ),
            UndoVerdict::Changed { change } => {
                format!("{change}; undoing it would destroy that (pass --force to undo anyway)")
            }
            UndoVerdict::Unknown { error } => {
                format!("whether what it left has changed cannot be told: {error}")
            }
            UndoVerdict::Undoable | UndoVerdict::MissingTool => String::new(),
        }
    }
}

/// One step of an [`UndoPreview`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct UndoStepPreview {
    /// The step.
    pub step_seq: u32,
    /// Its tool.
    pub tool_id: String,
    /// When its undo window closes (ms since the Unix epoch), when its tool is known.
    pub window_closes_at_ms: Option<i64>,
    /// What compensating it would put back, as its tool says from the step's record
    /// ("puts back the previous 12 bytes of `ws/a.txt`"), when the tool can say.
    pub restores: Option<String>,
    /// What an undo would do to it.
    #[serde(flatten)]
    pub verdict: UndoVerdict,
}

/// What [`Kernel::undo`] would do to a saga, step by step, last first: the steps an undo
/// compensates (committed, not reused, not read-only), each with its verdict, and why the
/// whole saga would be refused, if it would. Nothing is written and nothing is compensated
/// to find it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct UndoPreview {
    /// The saga.
    pub saga_id: SagaId,
    /// Its state.
    pub state: SagaState,
    /// Nothing to undo: the saga is `Undone` already, or a dry run (an undo succeeds and
    /// changes nothing).
    pub nothing_to_undo: bool,
    /// Why an undo of the whole saga would be refused before any step is looked at (it is
    /// not `Done`; the FSM table has no undo row), if it would.
    pub refused: Option<String>,
    /// The steps an undo would compensate, last first.
    pub steps: Vec<UndoStepPreview>,
}

impl UndoPreview {
    /// Whether [`Kernel::undo`] would succeed: nothing to undo, or the saga may be undone
    /// and every step is undoable (with `force`, a changed step counts as undoable).
    pub fn undoable(&self, force: bool) -> bool {
        self.nothing_to_undo
            || (self.refused.is_none()
                && self.steps.iter().all(|step| match step.verdict {
                    UndoVerdict::Undoable => true,
                    UndoVerdict::Changed { .. } => force,
                    _ => false,
                }))
    }
}

impl Kernel {
    /// What compensating `step` would put back, in words, as its tool says (`None` when
    /// the tool is missing here or does not say): for a dead letter's page. Reads only.
    pub async fn step_restores(&self, step: &agent_kernel_api::StepRecord) -> Option<String> {
        // An upstream server's tool is known once the server is asked.
        let _ = self.tools.load(&step.tool_id).await;
        self.tools
            .get(&step.tool_id)?
            .restores(&step.args, &step.undo, step.output.as_ref())
    }

    /// What [`Kernel::undo`] would do to `saga_id`, without doing it: for each step it
    /// would compensate, last first, whether it can (its tool's reversibility, its undo
    /// window, whether what it left has changed since). Nothing is written; each tool's
    /// `changed_since` reads the world.
    ///
    /// # Errors
    ///
    /// [`KernelError::SagaNotFound`]; [`KernelError::Log`].
    pub async fn undo_preview(&self, saga_id: &SagaId) -> Result<UndoPreview, KernelError> {
        let record = self.load(saga_id).await?;
        let state = record.saga.state;
        let mut preview = UndoPreview {
            saga_id: saga_id.clone(),
            state,
            nothing_to_undo: record.saga.dry_run || state == SagaState::Undone,
            refused: None,
            steps: Vec::new(),
        };
        if preview.nothing_to_undo {
            return Ok(preview);
        }
        if state != SagaState::Done {
            preview.refused = Some(not_done(state));
            return Ok(preview);
        }
        if let Err(denial) =
            self.fsm
                .apply(SagaState::Done, Event::UndoRequested, &Facts::default())
        {
            preview.refused = Some(format!("the FSM table denies an undo: {denial}"));
            return Ok(preview);
        }
        Ok(self.preview_steps(&record).await)
    }

    /// The verdict on each step of a `Done` saga an undo would compensate, last first.
    async fn preview_steps(&self, record: &agent_kernel_api::SagaRecord) -> UndoPreview {
        let saga_id = &record.saga.saga_id;
        let now_ms = self.env.clock.now_ms();
        let mut steps = Vec::new();
        for step in record.steps.iter().rev() {
            if step.status != StepStatus::Commit
                || step.reused_from.is_some()
                || step.effect == EffectClass::ReadOnly
            {
                continue;
            }
            let mut preview = UndoStepPreview {
                step_seq: step.step_seq,
                tool_id: step.tool_id.clone(),
                window_closes_at_ms: None,
                restores: None,
                verdict: UndoVerdict::Undoable,
            };
            // An upstream server's tool is known once the server is asked.
            let _ = self.tools.load(&step.tool_id).await;
            let Some(tool) = self.tools.get(&step.tool_id) else {
                preview.verdict = UndoVerdict::MissingTool;
                steps.push(preview);
                continue;
            };
            // Counted from the step's commit, which a take-over does not move.
            let window = self.tools.limits().undo_window_for(tool.as_ref());
            let closes_at = step
                .updated_at_ms
                .saturating_add(i64::try_from(window.as_ms()).unwrap_or(i64::MAX));
            preview.window_closes_at_ms = Some(closes_at);
            preview.restores = tool.restores(&step.args, &step.undo, step.output.as_ref());
            preview.verdict = if tool.reversibility() == Reversibility::None {
                UndoVerdict::Irreversible
            } else if now_ms > closes_at {
                UndoVerdict::WindowClosed {
                    window: window.to_string(),
                }
            } else {
                let ctx = self.context(
                    saga_id,
                    step.step_seq,
                    &step.tool_id,
                    step.idempotency_key.as_deref(),
                    record.saga.actor.as_deref(),
                );
                match self
                    .tools
                    .changed_since(&ctx, &step.args, &step.undo, step.output.as_ref())
                    .await
                {
                    Ok(None) => match self.covered_by(saga_id, step).await {
                        Ok(None) => UndoVerdict::Undoable,
                        Ok(Some(change)) => UndoVerdict::Changed { change },
                        Err(error) => UndoVerdict::Unknown {
                            error: error.to_string(),
                        },
                    },
                    Ok(Some(change)) => UndoVerdict::Changed { change },
                    Err(error) => UndoVerdict::Unknown {
                        error: error.to_string(),
                    },
                }
            };
            steps.push(preview);
        }
        UndoPreview {
            saga_id: saga_id.clone(),
            state: record.saga.state,
            nothing_to_undo: false,
            refused: None,
            steps,
        }
    }

    /// Undoes a `Done` saga: every step it committed is compensated, last first, through the
    /// tools of this kernel under the policy in force, and the saga ends `Undone` (the FSM's
    /// `Done --UndoRequested--> Undone`). The request, its reason and the operator are in
    /// the audit chain before anything else.
    ///
    /// Nothing is undone when a step that would be is refused: its tool is irreversible
    /// (reversibility `none`), its undo window (the tool's own, else `[limits] undo_window`,
    /// counted from the step's commit) has passed, or what it left has changed since
    /// ([`changed_since`](agent_kernel_api::Compensate::changed_since)), unless
    /// `force` (only for that last case). A compensation that fails leaves a dead letter and
    /// the saga `FailedRollbackPartial`. An undo cut short (a crash) is finished by
    /// [`Kernel::recover`], or by running it again: the steps already compensated are
    /// skipped.
    ///
    /// # Errors
    ///
    /// [`KernelError::UndoRefused`] (nothing undone); [`KernelError::SagaNotFound`];
    /// [`KernelError::InvalidRequest`] for an empty or over-long reason;
    /// [`KernelError::MissingTools`]; [`KernelError::Denied`] when the FSM table has no
    /// undo row; [`KernelError::TakenOver`] when another undo of it runs; [`KernelError::Log`].
    pub async fn undo(
        &self,
        saga_id: &SagaId,
        request: &UndoRequest,
        observer: &dyn Observer,
    ) -> Result<SagaReport, KernelError> {
        self.undo_taken_from(saga_id, request, observer, None).await
    }

    /// [`Kernel::undo`]; with `from`, only of a saga that owner still holds
    /// ([`KernelError::TakenOver`] otherwise): recovery finishing a dead process's undo
    /// never takes the saga from a process that took it first.
    pub(crate) async fn undo_taken_from(
        &self,
        saga_id: &SagaId,
        request: &UndoRequest,
        observer: &dyn Observer,
        from: Option<&agent_kernel_api::Owner>,
    ) -> Result<SagaReport, KernelError> {
        if request.reason.trim().is_empty() || request.reason.len() > MAX_DECISION_NOTE_BYTES {
            return Err(KernelError::InvalidRequest(format!(
                "an undo needs a reason of 1 to {MAX_DECISION_NOTE_BYTES} bytes"
            )));
        }
        let mut options = vec!["--reason".to_owned(), request.reason.clone()];
        if request.force {
            options.push("--force".to_owned());
        }
        if let Some(by) = &request.by {
            options.extend(["--operator".to_owned(), by.clone()]);
        }
        self.record_operator_command_with("undo", Some(saga_id), options)
            .await?;
        let mut record = self.load(saga_id).await?;
        if from.is_some_and(|from| record.saga.owner != *from) {
            return Err(KernelError::TakenOver(saga_id.clone()));
        }
        let refuse = |step: Option<(u32, &str)>, reason: String| KernelError::UndoRefused {
            saga_id: saga_id.clone(),
            step: step.map(|(seq, tool)| (seq, tool.to_owned())),
            reason,
        };
        if record.saga.dry_run || record.saga.state == SagaState::Undone {
            // Nothing ran, or it is undone already.
            return Ok(SagaReport::from_record(&record, None));
        }
        if record.saga.state != SagaState::Done {
            return Err(refuse(None, not_done(record.saga.state)));
        }
        let undone = self
            .fsm
            .apply(SagaState::Done, Event::UndoRequested, &Facts::default())
            .map_err(|denial| KernelError::Denied {
                saga_id: Some(saga_id.clone()),
                denial,
            })?;
        // Finishing an undo a dead process began (`settle_interrupted_undos`, which has made
        // sure this program has the tools): part of the world may be undone already (a
        // compensation the kill hid included, which no record shows), so no step's verdict
        // refuses the whole; each step is compensated or, when it cannot be (changed
        // since), left to an operator as a dead letter, as a rollback does.
        let previewed = if from.is_some() {
            Vec::new()
        } else {
            self.preview_steps(&record).await.steps
        };
        let mut missing = Vec::new();
        for step in &previewed {
            let at = Some((step.step_seq, step.tool_id.as_str()));
            match &step.verdict {
                UndoVerdict::Undoable => {}
                UndoVerdict::MissingTool => missing.push(step.tool_id.clone()),
                UndoVerdict::Changed { change } if request.force => {
                    warn!(saga_id = %saga_id, step_seq = step.step_seq, %change, "undoing a changed step: --force");
                }
                _ => return Err(refuse(at, step.refusal())),
            }
        }
        if !missing.is_empty() {
            missing.sort();
            missing.dedup();
            return Err(KernelError::MissingTools {
                saga_id: saga_id.clone(),
                tools: missing,
            });
        }
        // One undo at a time: a compare-and-swap on the owner of the finished saga, which
        // claims again what its steps touched, until it is settled again.
        if record.saga.owner != self.env.owner {
            self.check_owner_gone(&record).await?;
            // What a killed undo or retry of it started stops before this one acts.
            self.stop_programs_of_dead_owner(&record).await?;
        }
        let claim = vec![LogWrite::ClaimLocks {
            saga_id: saga_id.clone(),
        }];
        match self.take_over_then(&mut record, claim).await {
            Err(KernelError::Log(TxError::Conflict(holder))) => {
                let conflict = self.conflict("undo", *holder, 0).await?;
                return Err(KernelError::Conflict(Box::new(conflict)));
            }
            other => other?,
        }
        let span = info_span!("saga", saga_id = %saga_id, undo = true);
        let ended = async {
            info!(reason = %request.reason, force = request.force, "undoing a Done saga");
            // Checked above: a change since then (a writer racing the undo) is refused
            // step by step, unless forced.
            let when_changed = if request.force {
                WhenChanged::Force
            } else {
                WhenChanged::Refuse
            };
            // A later saga that claimed a step's resource since is checked again here, once
            // the claim keeps every other saga off them.
            let covered = if request.force {
                BTreeMap::new()
            } else {
                self.covered_steps(&record).await?
            };
            let (any_failed, mut last) = self
                .compensate_steps(&record, observer, when_changed, &covered)
                .await?;
            let state = if any_failed {
                SagaState::FailedRollbackPartial
            } else {
                undone
            };
            last.push(LogWrite::SetState {
                saga_id: saga_id.clone(),
                state,
            });
            self.log.write(last).await?;
            info!(%state, "undo finished");
            let record = self.load(saga_id).await?;
            Ok(SagaReport::from_record(&record, None))
        }
        .instrument(span)
        .await;
        if ended
            .as_ref()
            .is_err_and(|error| !matches!(error, KernelError::Log(_)))
        {
            // Stopped after its claim by a refusal: what the saga holds again goes now, if
            // it is still settled and still this process's. After a failed write nothing
            // more is written: the claimed locks stay, and a `recover` finishes the undo
            // once this process is gone.
            let release = vec![LogWrite::ReleaseLocks {
                saga_id: saga_id.clone(),
                owner: self.env.owner.clone(),
            }];
            if let Err(error) = self.log.write(release).await {
                warn!(%saga_id, %error, "the undo's locks could not be released");
            }
        }
        ended
    }
}

/// The reason recorded when `recover` finishes an undo whose process died.
pub const INTERRUPTED_UNDO_REASON: &str =
    "finishing an undo whose process died before it settled the saga";

impl Kernel {
    /// Settles what an `undo` killed after its claim left: a `Done` saga of a dead owner
    /// that holds its locks again. Its compensations may have begun (the world partly
    /// undone while the log still says `Done`), so the undo is finished, as the operator
    /// asked: the steps already compensated are skipped, the one whose outcome the kill
    /// hid runs again (its tool's `changed_since` accepts what it restores), and the saga
    /// ends `Undone`. A step that cannot be compensated (changed since) is left to an
    /// operator as a dead letter, the others are compensated, and the saga ends
    /// `FailedRollbackPartial`, as a rollback that meets such a step does: the log never
    /// says `Done` over a world partly undone. A saga whose tools this program lacks is left
    /// as it is, its locks held, reported as missing them, for a program that has them. The
    /// undo window and `force` are not looked at again: the operator asked within the
    /// window, and a step an operator forced becomes a dead letter (`dlq retry --force`).
    /// Other settled sagas that hold locks only have them released.
    pub(crate) async fn settle_interrupted_undos(
        &self,
        observer: &dyn Observer,
        report: &mut RecoveryReport,
    ) -> Result<(), KernelError> {
        for saga in self.log.settled_lock_holders().await? {
            if self.live.contains(&saga.saga_id)
                || self.owner_liveness(&saga.owner).await? != Liveness::Dead
            {
                continue;
            }
            if saga.state == SagaState::Done {
                // What the killed undo started (a command tool's compensation) stops first.
                if !self
                    .stop_programs_of_owners(std::iter::once(saga.owner.clone()))
                    .await
                    .is_empty()
                {
                    report.sagas.push(RecoveryAction::Failed {
                        saga_id: saga.saga_id.clone(),
                        error: "an undo of it was killed, and the programs it started could not be stopped; left as it is".to_owned(),
                    });
                    continue;
                }
                // Left as it is, its locks held, for a program that has the tools its
                // compensations need (as recovery leaves a saga): nothing written.
                let record = self.load(&saga.saga_id).await?;
                let tools = self.missing_tools(&record);
                if !tools.is_empty() {
                    report.sagas.push(RecoveryAction::MissingTools {
                        saga_id: saga.saga_id.clone(),
                        tools,
                    });
                    continue;
                }
                info!(saga_id = %saga.saga_id, "finishing an undo whose process died");
                let request = UndoRequest {
                    reason: INTERRUPTED_UNDO_REASON.to_owned(),
                    force: false,
                    by: Some("agent-kernel recover".to_owned()),
                };
                let finished = self
                    .undo_taken_from(&saga.saga_id, &request, observer, Some(&saga.owner))
                    .await;
                match finished {
                    Ok(finished) => {
                        report
                            .sagas
                            .push(RecoveryAction::RolledBack(Box::new(finished)));
                        continue;
                    }
                    Err(KernelError::Log(error)) => return Err(KernelError::Log(error)),
                    Err(KernelError::TakenOver(_) | KernelError::SagaBusy { .. }) => {
                        // Another process (a recovery beside this one, an `undo` run
                        // again) holds it now and finishes it: its locks stay.
                        report.sagas.push(RecoveryAction::SkippedTakenOver {
                            saga_id: saga.saga_id.clone(),
                        });
                        continue;
                    }
                    Err(error) => {
                        warn!(saga_id = %saga.saga_id, %error, "the interrupted undo cannot be finished");
                        report.sagas.push(RecoveryAction::Failed {
                            saga_id: saga.saga_id.clone(),
                            error: format!(
                                "an undo of it was killed and cannot be finished ({error}); its locks are released"
                            ),
                        });
                    }
                }
            }
            // Released only while the dead process still owns it, decided in the write's
            // transaction: another process may have taken it over since it was listed, to
            // undo it again, and holds its locks for that undo.
            info!(saga_id = %saga.saga_id, state = %saga.state, "releasing the locks of a settled saga whose undo died");
            self.log
                .write(vec![LogWrite::ReleaseLocks {
                    saga_id: saga.saga_id.clone(),
                    owner: saga.owner.clone(),
                }])
                .await?;
        }
        Ok(())
    }
}
