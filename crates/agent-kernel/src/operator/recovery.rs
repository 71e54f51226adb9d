//! `recover`: sagas of dead processes rolled back, and with `--wait`, those whose worker's
//! lease still runs once it has run out.

use std::time::Duration;

use agent_kernel_api::SagaId;
use agent_kernel_core::{
    Kernel, KernelError, Observer, RecoveryAction, RecoveryReport, SagaReport,
};

/// The longest [`recover_waiting`] waits for leases, in all.
pub const RECOVER_WAIT_MAX: Duration = Duration::from_secs(3_600);

/// How far past a lease's end [`recover_waiting`] looks again, by the database's clock.
const LEASE_END_MARGIN_MS: u64 = 100;

/// Rolls back every unfinished saga whose process is dead (see [`Kernel::recover`]); what
/// happened to each is in the report ([`RecoveryReport::counts`]).
///
/// # Errors
///
/// As [`Kernel::recover`].
pub async fn recover(
    kernel: &Kernel,
    observer: &dyn Observer,
) -> Result<RecoveryReport, KernelError> {
    kernel.recover(observer).await
}

/// [`recover`], and while sagas are skipped because their worker's lease (PostgreSQL) is
/// live, waits until the soonest of those leases runs out and recovers again, at most
/// `wait_max` in all ([`RECOVER_WAIT_MAX`] on the command line); the report holds each
/// saga's last word, in the order the sagas were first reported. Before each wait,
/// `waiting` is told how many sagas wait and how long the soonest lease has left (ms).
///
/// # Errors
///
/// As [`Kernel::recover`].
pub async fn recover_waiting(
    kernel: &Kernel,
    observer: &dyn Observer,
    wait_max: Duration,
    waiting: impl Fn(usize, u64),
) -> Result<RecoveryReport, KernelError> {
    let deadline = tokio::time::Instant::now() + wait_max;
    let mut sagas: Vec<RecoveryAction> = Vec::new();
    loop {
        let report = kernel.recover(observer).await?;
        let mut soonest_ms: Option<u64> = None;
        let mut n_waiting = 0_usize;
        for action in report.sagas {
            if let RecoveryAction::SkippedLive {
                lease_left_ms: Some(left_ms),
                ..
            } = &action
            {
                soonest_ms = Some(soonest_ms.map_or(*left_ms, |soonest| soonest.min(*left_ms)));
                n_waiting += 1;
            }
            match sagas
                .iter_mut()
                .find(|known| known.saga_id() == action.saga_id())
            {
                Some(known) => *known = action,
                None => sagas.push(action),
            }
        }
        let Some(left_ms) = soonest_ms else {
            return Ok(RecoveryReport { sagas });
        };
        let pause = Duration::from_millis(left_ms.saturating_add(LEASE_END_MARGIN_MS));
        if tokio::time::Instant::now() + pause > deadline {
            return Ok(RecoveryReport { sagas });
        }
        waiting(n_waiting, left_ms);
        tokio::time::sleep(pause).await;
    }
}

/// Rolls one unfinished saga back now, whatever its owner (`rollback --saga ID`): every
/// step whose effect may be in place is compensated, last first.
///
/// # Errors
///
/// As [`Kernel::rollback`].
pub async fn rollback(
    kernel: &Kernel,
    saga_id: &SagaId,
    observer: &dyn Observer,
) -> Result<SagaReport, KernelError> {
    kernel.rollback(saga_id, observer).await
}
