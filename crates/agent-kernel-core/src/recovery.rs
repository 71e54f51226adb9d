//! Recovery and operator rollback: taking over the unfinished sagas of dead processes (and
//! only those whose every tool this kernel has), moving them to `Compensating` from their
//! persisted state, and compensating them.

use agent_kernel_api::{
    ApprovalDecision, ApprovalStatus, DecideApproval, EffectClass, LeaseStatus, LogWrite, SagaId,
    SagaRecord, SagaState, SagaSummary,
};
use agent_kernel_fsm::{Denial, Rule};
use std::collections::{HashMap, HashSet};

use tracing::{Instrument, info, info_span, warn};

use crate::KernelError;
use crate::kernel::Kernel;
use crate::owner::Liveness;
use crate::report::{Failure, Observer, RecoveryAction, RecoveryReport, SagaReport};

mod turns;

use turns::places_and_turns;

/// Most sagas [`Kernel::recover`] takes over at once, and so most it compensates at once.
/// The group's take-overs are written concurrently, so they share synced commits; its
/// sagas are then compensated at the same time where they act on different resources, and
/// newest first where they share one; within a saga, each outcome is durable before the
/// next compensation acts.
pub const RECOVER_GROUP_SAGAS: usize = 64;

/// What taking one saga over for recovery came to.
enum Prepared {
    /// Nothing to compensate: what the report says of it, if anything.
    Done(Option<RecoveryAction>),
    /// Taken over and in `Compensating`, as read before (read again unless its owner was
    /// known gone then), with what its report says started the rollback.
    Ready(Box<(SagaRecord, Option<Failure>)>),
}

/// What checking one saga for recovery came to.
enum Checked {
    /// Nothing to take over: what the report says of it, if anything.
    Done(Option<RecoveryAction>),
    /// To be taken over, with what its move to `Compensating` writes besides the move, and
    /// what its report says started the rollback.
    Ready(Box<(SagaRecord, Vec<LogWrite>, Option<Failure>)>),
}

/// What a group's report says of one saga.
enum Slot {
    Done(RecoveryAction),
    /// Compensated; its outcomes are written.
    Compensated(SagaId, Option<Failure>),
}

impl Kernel {
    /// The tools that compensating `record` needs and this kernel does not have, sorted.
    pub(crate) fn missing_tools(&self, record: &SagaRecord) -> Vec<String> {
        if record.saga.dry_run {
            return Vec::new();
        }
        let mut missing: Vec<String> = record
            .steps
            .iter()
            .filter(|step| {
                Self::needs_compensation(step)
                    && step.reused_from.is_none()
                    && step.effect != EffectClass::ReadOnly
                    && self.tools.get(&step.tool_id).is_none()
                    // An upstream server the tools file no longer declares: its steps
                    // become dead letters (reference §11) rather than wait for it.
                    && step.tool_version != agent_kernel_api::UPSTREAM_TOOL_VERSION
            })
            .map(|step| step.tool_id.clone())
            .collect();
        missing.sort();
        missing.dedup();
        missing
    }

    /// Whether a person may still act on `approval` (pending or approved, not expired): its
    /// saga, left waiting on purpose, is not recovered meanwhile.
    pub(crate) fn still_open(&self, approval: &agent_kernel_api::ApprovalRecord) -> bool {
        matches!(
            approval.status_at(self.env.clock.now_ms()),
            ApprovalStatus::Pending | ApprovalStatus::Approved
        )
    }

    /// Whether `owner` is alive: by its lease on a log that keeps leases, else by the
    /// probe.
    pub(crate) async fn owner_liveness(
        &self,
        owner: &agent_kernel_api::Owner,
    ) -> Result<Liveness, KernelError> {
        // A log shared across machines knows its owners by their leases; SQLite's by pid.
        Ok(match self.log.owner_lease(owner).await? {
            Some(LeaseStatus::Live) if self.gone_from_this_machine(owner) => {
                // Its process is gone and can never renew: its lease ends now, rather than
                // its sagas waiting for it to run out.
                self.log.end_lease(owner).await?;
                info!(
                    pid = owner.pid,
                    "the owner's process is gone from this machine; its lease is ended"
                );
                Liveness::Dead
            }
            Some(LeaseStatus::Live) => Liveness::Alive,
            Some(LeaseStatus::Expired) => Liveness::Dead,
            None => self.env.liveness.liveness(owner),
        })
    }

    /// Whether `owner` ran on this machine, in this boot, and its process is gone (by the
    /// probe: its pid and start time name no running process).
    fn gone_from_this_machine(&self, owner: &agent_kernel_api::Owner) -> bool {
        owner.host == self.env.owner.host
            && owner.boot_id == self.env.owner.boot_id
            && *owner != self.env.owner
            && !owner.is_detached()
            && self.env.liveness.liveness(owner) == Liveness::Dead
    }

    /// Refuses a saga owned by another process that is alive (or cannot be checked).
    pub(crate) async fn check_owner_gone(&self, record: &SagaRecord) -> Result<(), KernelError> {
        let saga = &record.saga;
        if self.live.contains(&saga.saga_id) {
            // An open live saga of this very process: its driver holds it.
            return Err(KernelError::SagaBusy {
                saga_id: saga.saga_id.clone(),
                state: saga.state,
                owner: saga.owner.clone(),
            });
        }
        if saga.owner == self.env.owner || saga.owner.is_detached() {
            return Ok(());
        }
        if saga.state.is_terminal() {
            // Settled: its owner will not write to it again, so on SQLite it is taken
            // whoever owns it (two undos are kept apart by the operator lock). A log that
            // keeps leases takes it only from an owner whose lease has ended: a live one may
            // be another undo under way. Asking ends the lease of an owner gone from this
            // machine (the `run` that finished it), so its saga is not kept waiting.
            if self.log.owner_lease(&saga.owner).await?.is_some()
                && self.owner_liveness(&saga.owner).await? != Liveness::Dead
            {
                return Err(KernelError::SagaBusy {
                    saga_id: saga.saga_id.clone(),
                    state: saga.state,
                    owner: saga.owner.clone(),
                });
            }
            return Ok(());
        }
        if self.owner_liveness(&saga.owner).await? != Liveness::Dead {
            return Err(KernelError::SagaBusy {
                saga_id: saga.saga_id.clone(),
                state: saga.state,
                owner: saga.owner.clone(),
            });
        }
        Ok(())
    }

    /// Stops what the dead owner of `record`'s saga started and may still run (the
    /// compensation of an `undo` or a `dlq retry` killed midway) before this process acts
    /// on the saga again; whether its owner is dead. An owner that lives, this process, or
    /// one left detached is left alone (nothing of theirs is orphaned); a dead owner's
    /// programs that cannot be stopped refuse the action, with nothing done.
    pub(crate) async fn stop_programs_of_dead_owner(
        &self,
        record: &SagaRecord,
    ) -> Result<bool, KernelError> {
        let owner = &record.saga.owner;
        if *owner == self.env.owner
            || owner.is_detached()
            || self.owner_liveness(owner).await? != Liveness::Dead
        {
            return Ok(false);
        }
        if self
            .stop_programs_of_owners(std::iter::once(owner.clone()))
            .await
            .is_empty()
        {
            return Ok(true);
        }
        Err(KernelError::InvalidRequest(format!(
            "saga {}: the programs its dead owner (pid {}) started could not be stopped; nothing was done",
            record.saga.saga_id, owner.pid
        )))
    }

    /// Makes a settled saga of a dead owner this process's before it acts on it again (a
    /// dead letter's retry): that owner's programs stopped first, then the saga taken over,
    /// so that a retry killed in turn leaves its own programs to the next one to stop. A
    /// saga whose owner lives (the process that ran it, still serving) stays its owner's.
    pub(crate) async fn own_settled(&self, record: &mut SagaRecord) -> Result<(), KernelError> {
        if self.stop_programs_of_dead_owner(record).await? {
            self.take_over_then(record, Vec::new()).await?;
        }
        Ok(())
    }

    /// Before a saga of a dead process is taken over: its owner must be gone, and this
    /// kernel must have every tool its compensation needs. A saga that fails either check
    /// is left exactly as it is.
    async fn check_recoverable(&self, record: &SagaRecord) -> Result<(), KernelError> {
        self.check_recoverable_knowing(record, false).await
    }

    /// [`check_recoverable`](Self::check_recoverable), its owner not asked again where
    /// `owner_known_dead` (found dead moments before, for the whole group): a dead owner
    /// never comes back (its lease is never renewed, its process never runs again).
    async fn check_recoverable_knowing(
        &self,
        record: &SagaRecord,
        owner_known_dead: bool,
    ) -> Result<(), KernelError> {
        if !owner_known_dead || self.live.contains(&record.saga.saga_id) {
            self.check_owner_gone(record).await?;
        }
        let tools = self.missing_tools(record);
        if !tools.is_empty() {
            return Err(KernelError::MissingTools {
                saga_id: record.saga.saga_id.clone(),
                tools,
            });
        }
        Ok(())
    }

    /// Takes a saga over from its owner (who must be dead, or the saga terminal), or fails;
    /// `record` then names this process its owner, as the log does.
    pub(crate) async fn take_over(&self, record: &mut SagaRecord) -> Result<(), KernelError> {
        if record.saga.owner == self.env.owner {
            return Ok(());
        }
        self.check_owner_gone(record).await?;
        self.take_over_then(record, Vec::new()).await
    }

    /// Takes a saga over (the caller checked its owner is gone) and writes `then` in the
    /// same transaction, or writes only `then` if the saga is this process's already; fails
    /// with nothing written if another process took it first, or it moved on since `record`
    /// was read. `record` then names this process its owner, as the log does.
    pub(crate) async fn take_over_then(
        &self,
        record: &mut SagaRecord,
        then: Vec<LogWrite>,
    ) -> Result<(), KernelError> {
        let saga = &record.saga;
        if saga.owner == self.env.owner {
            if !then.is_empty() {
                self.log.write(then).await?;
            }
            return Ok(());
        }
        if self
            .log
            .take_over_and_write(
                &saga.saga_id,
                &saga.owner,
                saga.state,
                &self.env.owner,
                then,
            )
            .await?
        {
            record.saga.owner = self.env.owner.clone();
            Ok(())
        } else {
            Err(KernelError::TakenOver(saga.saga_id.clone()))
        }
    }

    /// Rolls one saga back on an operator's request: compensates its committed steps in
    /// reverse order.
    ///
    /// - A saga still owned by a live process is refused ([`KernelError::SagaBusy`]).
    /// - An unfinished saga of a dead process is rolled back as `recover` would, from its
    ///   persisted state.
    /// - A `FailedRolledBack` saga is already rolled back; it is reported as is.
    /// - A `Done` or `FailedRollbackPartial` saga is refused by the FSM
    ///   ([`KernelError::Denied`]): terminal states absorb every event, so a finished saga is
    ///   never reopened.
    /// - A dry run has nothing to undo: it is reported as it is (its report has `dry_run`).
    ///
    /// The request is recorded in the audit chain ([`AuditEvent::Operator`](agent_kernel_api::AuditEvent::Operator)) before anything
    /// else, whatever comes of it.
    ///
    /// # Errors
    ///
    /// [`KernelError::SagaNotFound`], [`KernelError::SagaBusy`], [`KernelError::TakenOver`],
    /// [`KernelError::Denied`], or [`KernelError::Log`].
    pub async fn rollback(
        &self,
        saga_id: &SagaId,
        observer: &dyn Observer,
    ) -> Result<SagaReport, KernelError> {
        self.record_operator_command("rollback", Some(saga_id))
            .await?;
        let record = self.load(saga_id).await?;
        if record.saga.dry_run && record.saga.state.is_terminal() {
            // Nothing ran, so the world is already as it was before the saga.
            return Ok(SagaReport::from_record(&record, None));
        }
        match record.saga.state {
            SagaState::FailedRolledBack => return Ok(SagaReport::from_record(&record, None)),
            state if state.is_terminal() => {
                // Terminal states absorb every event: a finished saga is never reopened.
                return Err(KernelError::Denied {
                    saga_id: Some(saga_id.clone()),
                    denial: Denial {
                        state,
                        event: None,
                        tool: None,
                        rule: Rule::Terminal,
                    },
                });
            }
            _ => {}
        }
        self.check_recoverable(&record).await?;
        let owner = record.saga.owner.clone();
        if !self
            .stop_programs_of_owners(std::iter::once(owner.clone()))
            .await
            .is_empty()
        {
            return Err(KernelError::InvalidRequest(format!(
                "programs that the saga's process (pid {}) started still run after being killed and waited for; nothing was compensated",
                owner.pid
            )));
        }
        info!(saga_id = %saga_id, from = %record.saga.state, "operator rollback");
        let (batch, failure) = self.persisted_entry(&record).await?;
        // Read again: steps its owner wrote after the read, before it died, are compensated
        // too.
        self.take_over_into_compensation(record, batch).await?;
        let record = self.load(saga_id).await?;
        let span = info_span!("saga", saga_id = %saga_id, rollback = true);
        self.compensate_saga(record, failure, observer)
            .instrument(span)
            .await
    }

    /// Rolls back every saga left unfinished by a process that is no longer running.
    ///
    /// The command is recorded in the audit chain ([`AuditEvent::Operator`](agent_kernel_api::AuditEvent::Operator)) before it acts.
    ///
    /// Sagas in a terminal state are never compensated, but for a `Done` saga whose `undo`
    /// was killed after it claimed the saga: that undo is finished. Sagas whose owner is alive (or cannot
    /// be checked from this host) are skipped and reported. Each saga is taken over with a
    /// compare-and-swap on its owner, so concurrent recoveries never compensate one saga
    /// twice at once, and a recovery that is itself killed is resumed by the next one.
    ///
    /// Sagas are taken newest first: last first across sagas as within one, so when two
    /// unfinished sagas changed the same thing one after the other, the later change is
    /// undone first and the earlier saga's undo record then restores what was there before
    /// both. Sagas whose steps name different resources are compensated at the same time,
    /// up to [`RECOVER_GROUP_SAGAS`] at once.
    ///
    /// # Errors
    ///
    /// [`KernelError::Log`] when the log fails.
    pub async fn recover(&self, observer: &dyn Observer) -> Result<RecoveryReport, KernelError> {
        self.record_operator_command("recover", None).await?;
        let mut report = RecoveryReport::default();
        let newest_first: Vec<SagaSummary> = self
            .log
            .unfinished_sagas()
            .await?
            .into_iter()
            .rev()
            .collect();
        let mut stopped = false;
        for (n_group, group) in newest_first.chunks(RECOVER_GROUP_SAGAS).enumerate() {
            if let Err(error) = self.recover_group(group, observer, &mut report).await {
                stopped = true;
                // A compensation stopped by the log stops recovery: an older saga undone
                // while a newer one's undo is unrecorded would have the next recovery undo
                // the newer one over the older one's undo.
                warn!(%error, "recovery stops here");
                for saga in newest_first
                    .iter()
                    .skip((n_group + 1) * RECOVER_GROUP_SAGAS)
                {
                    report.sagas.push(RecoveryAction::Failed {
                        saga_id: saga.saga_id.clone(),
                        error: format!("not attempted: recovery stopped before it ({error})"),
                    });
                }
                break;
            }
        }
        if !stopped {
            // Nothing more is written after a failed write.
            self.settle_interrupted_undos(observer, &mut report).await?;
        }
        Ok(report)
    }

    /// Recovers one group of sagas, newest first, into `report`.
    ///
    /// - Each is read, checked and taken over (moved to `Compensating`), all at once: nothing
    ///   is undone yet, so their order does not matter, and their writes share syncs. Those
    ///   whose owner was not known gone before the first read are read again, at once, once
    ///   taken over: a step their owner wrote after that read (it was alive then) is
    ///   compensated too.
    /// - Then they are compensated: a saga once every newer saga of the group that shares
    ///   a resource with it is settled, the others at the same time (a saga with a step
    ///   that does not say what it touches waits for every newer one, and every older one
    ///   for it). Within a
    ///   saga, each compensation's outcome is durable before the next one acts (never held
    ///   for a later write: a kill between two compensations would leave the log saying
    ///   neither ran, and the next recovery would run the later step's undo again over the
    ///   earlier one's).
    ///
    /// One saga that cannot be checked or taken over does not stop the others (nothing of
    /// it ran; it is reported, and left for the next recovery). A saga whose compensation
    /// stops on an error of the log stops the group: the sagas whose compensation has not
    /// begun are not compensated (each reported with what its preparation came to) and are
    /// left for the next recovery, and `Err` says why.
    async fn recover_group(
        &self,
        summaries: &[SagaSummary],
        observer: &dyn Observer,
        report: &mut RecoveryReport,
    ) -> Result<(), KernelError> {
        let group: Vec<SagaId> = summaries.iter().map(|saga| saga.saga_id.clone()).collect();
        let group = group.as_slice();
        // Before the read: the sagas no one but a take-over can change any more, whose
        // read is then current whenever their take-over holds.
        let mut gone = HashMap::new();
        let mut settled = Vec::with_capacity(summaries.len());
        for saga in summaries {
            settled.push(self.writes_nothing_more(&saga.owner, &mut gone).await);
        }
        let records = self.read_each(group).await;
        // First every saga is checked (reads only), then the take-overs are sent all at
        // once, so that they share as few commits as the writer can make them.
        let checked = futures_util::future::join_all(
            group
                .iter()
                .zip(records)
                .map(|(saga_id, record)| self.check_for_recovery(saga_id, record, &gone)),
        )
        .await;
        // Whatever the dead owners started and still runs is stopped before anything of
        // theirs is taken over, compensated or probed (a take-over would make this process
        // their owner, and the next recovery would no longer know whose programs to stop);
        // an owner whose programs would not stop keeps its sagas, left as they are.
        let checked = self.stop_programs_before_taking_over(checked).await;
        let prepared =
            futures_util::future::join_all(checked.into_iter().map(|checked| async move {
                match checked {
                    Ok(checked) => self.prepare_recovery(checked).await,
                    Err(error) => Err(error),
                }
            }))
            .await;
        // The take-over held on the owner and the state read, but an owner that was alive
        // at the read may have written steps before it died, which change neither: such a
        // saga is compensated from what the log holds now that no one else writes to it.
        let stale: Vec<SagaId> = group
            .iter()
            .zip(&prepared)
            .zip(&settled)
            .filter(|((_, prepared), settled)| {
                !**settled && matches!(prepared, Ok(Prepared::Ready(_)))
            })
            .map(|((saga_id, _), _)| saga_id.clone())
            .collect();
        let read_again = self.read_each(&stale).await;
        let (places, turns, stopped) = places_and_turns(group, prepared, settled, read_again);
        let (turn_slots, stopped_in_turn) = self.compensate_in_turns(&turns, observer).await;
        let stopped = stopped.or(stopped_in_turn);
        // The turns' slots fill the places left for them, in order.
        let mut turn_slots = turn_slots.into_iter();
        let slots: Vec<Slot> = places
            .into_iter()
            .filter_map(|place| place.or_else(|| turn_slots.next()))
            .collect();
        // The sagas rolled back are reported as the log now holds them, read at once.
        let rolled_back: Vec<SagaId> = slots
            .iter()
            .filter_map(|slot| match slot {
                Slot::Compensated(saga_id, _) => Some(saga_id.clone()),
                Slot::Done(_) => None,
            })
            .collect();
        let mut reread = self.read_each(&rolled_back).await.into_iter();
        for slot in slots {
            report.sagas.push(match slot {
                Slot::Done(action) => action,
                Slot::Compensated(saga_id, failure) => match reread.next() {
                    Some(Ok(record)) => RecoveryAction::RolledBack(Box::new(
                        SagaReport::from_record(&record, failure),
                    )),
                    Some(Err(error)) => RecoveryAction::Failed {
                        saga_id,
                        error: error.to_string(),
                    },
                    None => RecoveryAction::Failed {
                        error: KernelError::SagaNotFound(saga_id.clone()).to_string(),
                        saga_id,
                    },
                },
            });
        }
        stopped.map_or(Ok(()), Err)
    }

    /// Reads what taking one unfinished saga over for [`Kernel::recover_group`] needs, as
    /// `record` was just read: whether it is recovered now (its owner gone, every tool
    /// present), and what its move to `Compensating` writes. Writes nothing.
    async fn check_for_recovery(
        &self,
        saga_id: &SagaId,
        record: Result<SagaRecord, KernelError>,
        gone: &HashMap<agent_kernel_api::Owner, bool>,
    ) -> Result<Checked, KernelError> {
        let record = record?;
        if record.saga.state.is_terminal() {
            // Another recovery finished it since the list was read.
            return Ok(Checked::Done(None));
        }
        if record.saga.state == SagaState::AwaitingApproval && record.saga.owner.is_detached() {
            // Left waiting on purpose: it is not in flight, a person has it.
            let approval = self.waiting_approval(&record).await?;
            if self.still_open(&approval) {
                info!(saga_id = %saga_id, approval_id = %approval.request.approval_id, "waits for an approval; skipped");
                return Ok(Checked::Done(Some(RecoveryAction::SkippedWaiting {
                    saga_id: saga_id.clone(),
                    approval_id: approval.request.approval_id,
                })));
            }
        }
        let owner_known_dead = gone.get(&record.saga.owner) == Some(&true);
        if let Err(error) = self
            .check_recoverable_knowing(&record, owner_known_dead)
            .await
        {
            return self.skipped(error).await.map(Checked::Done);
        }
        let (batch, failure) = self.persisted_entry(&record).await?;
        Ok(Checked::Ready(Box::new((record, batch, failure))))
    }

    /// Takes a checked saga over and moves it to `Compensating`, in one transaction;
    /// nothing of its compensation runs yet.
    async fn prepare_recovery(&self, checked: Checked) -> Result<Prepared, KernelError> {
        let (record, batch, failure) = match checked {
            Checked::Done(action) => return Ok(Prepared::Done(action)),
            Checked::Ready(ready) => *ready,
        };
        match self.take_over_into_compensation(record, batch).await {
            Ok(record) => Ok(Prepared::Ready(Box::new((record, failure)))),
            Err(error) => self.skipped(error).await.map(Prepared::Done),
        }
    }

    /// Whether no one but a take-over can change a saga of `owner` from now on: its owner
    /// is gone (by its lease, else by the probe; `gone` keeps each owner's answer for the
    /// group), or it is left detached, whose sagas change only by a take-over. Unknown,
    /// alive, this process, or an error asking: no.
    async fn writes_nothing_more(
        &self,
        owner: &agent_kernel_api::Owner,
        gone: &mut HashMap<agent_kernel_api::Owner, bool>,
    ) -> bool {
        if owner.is_detached() {
            return true;
        }
        *owner != self.env.owner && self.owner_gone(owner, gone).await.unwrap_or(false)
    }

    /// Whether `owner` is dead, asked once per owner: `gone` keeps the answers.
    pub(crate) async fn owner_gone(
        &self,
        owner: &agent_kernel_api::Owner,
        gone: &mut HashMap<agent_kernel_api::Owner, bool>,
    ) -> Result<bool, KernelError> {
        if let Some(gone) = gone.get(owner) {
            return Ok(*gone);
        }
        let is_gone = self.owner_liveness(owner).await? == Liveness::Dead;
        gone.insert(owner.clone(), is_gone);
        Ok(is_gone)
    }

    /// `checked`, after what the owners of those ready to be taken over started was
    /// stopped; one whose owner's programs would not stop is left as it is (reported, for
    /// the next recovery).
    async fn stop_programs_before_taking_over(
        &self,
        checked: Vec<Result<Checked, KernelError>>,
    ) -> Vec<Result<Checked, KernelError>> {
        let owners: Vec<agent_kernel_api::Owner> = checked
            .iter()
            .filter_map(|checked| match checked {
                Ok(Checked::Ready(ready)) => Some(ready.0.saga.owner.clone()),
                _ => None,
            })
            .collect();
        let unstoppable = self.stop_programs_of_owners(owners.into_iter()).await;
        if unstoppable.is_empty() {
            return checked;
        }
        checked
            .into_iter()
            .map(|checked| match checked {
                Ok(Checked::Ready(ready)) if unstoppable.contains(&ready.0.saga.owner) => {
                    let saga = &ready.0.saga;
                    Ok(Checked::Done(Some(RecoveryAction::Failed {
                        saga_id: saga.saga_id.clone(),
                        error: format!(
                            "programs that its process (pid {}) started still run, or cannot be looked at, after being killed and waited for; it is left as it is while they may act (the next recovery tries again)",
                            saga.owner.pid
                        ),
                    })))
                }
                other => other,
            })
            .collect()
    }

    /// Stops what each of `owners` (dead, or this process's or detached, which are
    /// skipped) started and still runs, once per owner, on a blocking thread; the owners
    /// some of whose programs could not be stopped (or looked for).
    pub(crate) async fn stop_programs_of_owners(
        &self,
        owners: impl Iterator<Item = agent_kernel_api::Owner>,
    ) -> HashSet<agent_kernel_api::Owner> {
        let mut seen = HashSet::new();
        let mut unstoppable = HashSet::new();
        for owner in owners {
            if owner == self.env.owner || owner.is_detached() || !seen.insert(owner.clone()) {
                continue;
            }
            let probe = std::sync::Arc::clone(&self.env.liveness);
            let asked = owner.clone();
            let Ok(stopped) =
                tokio::task::spawn_blocking(move || probe.stop_programs_of(&asked)).await
            else {
                // The stop itself failed (a panic): nothing says its programs are gone.
                warn!(
                    pid = owner.pid,
                    "stopping the programs of a dead process failed"
                );
                unstoppable.insert(owner);
                continue;
            };
            if stopped.n_killed > 0 {
                info!(
                    pid = owner.pid,
                    n_killed = stopped.n_killed,
                    "stopped programs a dead process started"
                );
            }
            if stopped.n_left > 0 {
                warn!(
                    pid = owner.pid,
                    n_left = stopped.n_left,
                    "programs a dead process started would not stop"
                );
                unstoppable.insert(owner);
            }
        }
        unstoppable
    }

    /// `saga_ids` read at once, or, when that fails, one by one, so that a saga that cannot
    /// be read fails alone; one the log lacks is [`KernelError::SagaNotFound`].
    async fn read_each(&self, saga_ids: &[SagaId]) -> Vec<Result<SagaRecord, KernelError>> {
        let answers = match self.log.saga_records(saga_ids).await {
            Ok(records) => records.into_iter().map(Ok).collect(),
            Err(_) => {
                let mut answers = Vec::with_capacity(saga_ids.len());
                for saga_id in saga_ids {
                    answers.push(self.log.saga(saga_id).await);
                }
                answers
            }
        };
        saga_ids
            .iter()
            .zip(answers)
            .map(|(saga_id, answer)| {
                answer?.ok_or_else(|| KernelError::SagaNotFound(saga_id.clone()))
            })
            .collect()
    }

    /// What the report says of a saga that recovery leaves as it is because of `error`
    /// (a tool missing, its owner alive, another process first), or `error` itself; for an
    /// owner alive by its lease, how long the lease has left.
    async fn skipped(&self, error: KernelError) -> Result<Option<RecoveryAction>, KernelError> {
        match error {
            KernelError::SagaBusy { saga_id, owner, .. } => {
                let lease_left_ms = self
                    .log
                    .lease_left_ms(&owner)
                    .await
                    .ok()
                    .flatten()
                    .map(|left| u64::try_from(left.max(0)).unwrap_or(0));
                info!(saga_id = %saga_id, pid = owner.pid, ?lease_left_ms, "owner alive; skipped");
                Ok(Some(RecoveryAction::SkippedLive {
                    saga_id,
                    pid: owner.pid,
                    host: owner.host,
                    lease_left_ms,
                }))
            }
            other => Self::skipped_for(other),
        }
    }

    /// [`Kernel::skipped`] for every error but an owner alive.
    fn skipped_for(error: KernelError) -> Result<Option<RecoveryAction>, KernelError> {
        match error {
            KernelError::MissingTools { saga_id, tools } => {
                warn!(saga_id = %saga_id, ?tools, "tools missing; the saga is left as it is");
                Ok(Some(RecoveryAction::MissingTools { saga_id, tools }))
            }
            KernelError::SagaBusy { saga_id, owner, .. } => {
                info!(saga_id = %saga_id, pid = owner.pid, "owner alive; skipped");
                Ok(Some(RecoveryAction::SkippedLive {
                    saga_id,
                    pid: owner.pid,
                    host: owner.host,
                    lease_left_ms: None,
                }))
            }
            KernelError::TakenOver(saga_id) => {
                Ok(Some(RecoveryAction::SkippedTakenOver { saga_id }))
            }
            other => Err(other),
        }
    }

    /// Takes over a saga whose owner is gone (checked by the caller) and moves it to
    /// `Compensating` from the state `record` holds (a step was in flight in `Acting` or
    /// `Validating`, or it waited in `Planning`: the table's failure event for that state
    /// applies; one already `Compensating` stays), with `batch` (a waiting request voided),
    /// all in one transaction. A saga that waited for an approval (its process died
    /// waiting) has its request voided with the move, so an approval given afterwards
    /// applies to nothing.
    ///
    /// Returns `record` with its new owner and state. The take-over holds only if the saga
    /// still has the owner and the state `record` holds; its steps may have changed since
    /// (an owner that was alive at the read wrote more, then died), so unless its owner was
    /// known gone before the read, the caller reads it again before compensating it.
    async fn take_over_into_compensation(
        &self,
        mut record: SagaRecord,
        mut batch: Vec<LogWrite>,
    ) -> Result<SagaRecord, KernelError> {
        let state = self.push_compensating(&record, &mut batch);
        self.take_over_then(&mut record, batch).await?;
        record.saga.state = state;
        Ok(record)
    }

    /// Adds the saga's move to `Compensating` to `batch`, unless it is there already; the
    /// state it is in once `batch` is written.
    fn push_compensating(&self, record: &SagaRecord, batch: &mut Vec<LogWrite>) -> SagaState {
        let state = self.enter_compensating(&record.saga.saga_id, record.saga.state);
        if state != record.saga.state {
            batch.push(LogWrite::SetState {
                saga_id: record.saga.saga_id.clone(),
                state,
            });
        }
        state
    }

    /// What moving `record` to `Compensating` from its persisted state writes besides the
    /// move (a waiting request voided), and what its report says started the rollback.
    async fn persisted_entry(
        &self,
        record: &SagaRecord,
    ) -> Result<(Vec<LogWrite>, Option<Failure>), KernelError> {
        let mut batch = Vec::new();
        let mut failure = None;
        if record.saga.state == SagaState::AwaitingApproval {
            let approval = self.waiting_approval(record).await?;
            let status = approval.status_at(self.env.clock.now_ms());
            // Past its expiry it is recorded as expired; pending or approved, it is void.
            let (decision, shown) = match status {
                ApprovalStatus::Expired if approval.status == ApprovalStatus::Pending => {
                    (Some(ApprovalDecision::Expire), ApprovalStatus::Expired)
                }
                ApprovalStatus::Pending | ApprovalStatus::Approved => {
                    (Some(ApprovalDecision::Cancel), ApprovalStatus::Cancelled)
                }
                other => (None, other),
            };
            if let Some(decision) = decision {
                batch.push(LogWrite::DecideApproval(DecideApproval {
                    approval_id: approval.request.approval_id.clone(),
                    decision,
                    by: self.env.owner.clone(),
                    uid: self.operator_uid(),
                    user: Some(if decision == ApprovalDecision::Expire {
                        "agent-kernel (expired undecided)".to_owned()
                    } else {
                        "agent-kernel (its saga was rolled back while it waited)".to_owned()
                    }),
                    note: None,
                }));
            }
            failure = Some(Self::unapproved_failure(&approval, shown));
        }
        Ok((batch, failure))
    }

    /// Writes `batch` with the saga's move to `Compensating` (unless it is there already)
    /// in one transaction, then compensates it; `failure` is what its report says started
    /// the rollback.
    pub(crate) async fn compensate_from(
        &self,
        record: &SagaRecord,
        batch: Vec<LogWrite>,
        failure: Option<Failure>,
        observer: &dyn Observer,
    ) -> Result<SagaReport, KernelError> {
        let record = self.enter_compensation(record.clone(), batch).await?;
        self.compensate_saga(record, failure, observer).await
    }

    /// Writes `batch` with the saga's move to `Compensating` (unless it is there already)
    /// in one transaction; the saga with its new state.
    ///
    /// `record` must be the saga as the log holds it, and no one else may write to it (it
    /// is this process's): then the move changes only its state (and its `updated_at_ms`,
    /// left as read), so it is not read again; its steps, all compensation needs, are as
    /// the log holds them.
    async fn enter_compensation(
        &self,
        mut record: SagaRecord,
        mut batch: Vec<LogWrite>,
    ) -> Result<SagaRecord, KernelError> {
        let state = self.push_compensating(&record, &mut batch);
        if !batch.is_empty() {
            self.log.write(batch).await?;
        }
        record.saga.state = state;
        Ok(record)
    }
}
