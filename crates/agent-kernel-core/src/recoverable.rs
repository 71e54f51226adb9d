//! Which sagas `recover` would settle now, found without settling any: for `mcp` at start,
//! `recover --watch` before each round, and the console's overview.

use std::collections::HashMap;

use agent_kernel_api::SagaSummary;

use crate::KernelError;
use crate::kernel::Kernel;

impl Kernel {
    /// Whether `recover` would find something to do now: an unfinished saga of an owner
    /// that is gone (or of this process, or left detached), or a settled saga of a gone
    /// owner that still holds locks (an `undo` killed after its claim, which `recover`
    /// finishes). Reads the list of unfinished sagas, that of settled lock holders, and
    /// each distinct owner's liveness once, and writes nothing but, on a log that keeps
    /// leases, the end of the lease of an owner on this machine whose process is gone
    /// (`TxLog::end_lease`): what a worker that recovers again and again (`recover --watch`)
    /// asks before each round, so that an idle round leaves no record.
    ///
    /// # Errors
    ///
    /// [`KernelError::Log`] when the log cannot be read.
    pub async fn has_recoverable_sagas(&self) -> Result<bool, KernelError> {
        if !self.recoverable(true).await?.is_empty() {
            return Ok(true);
        }
        let mut gone = HashMap::new();
        for saga in self.log.settled_lock_holders().await? {
            if !self.live.contains(&saga.saga_id) && self.owner_gone(&saga.owner, &mut gone).await?
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The sagas [`recover`](Self::recover) would settle now, oldest first: the unsettled
    /// sagas of processes that are no longer running (and of this kernel's own owner), but
    /// not those left waiting on purpose for an approval still open. Reads only.
    ///
    /// # Errors
    ///
    /// [`KernelError::Log`] when the log cannot be read.
    pub async fn recoverable_sagas(&self) -> Result<Vec<SagaSummary>, KernelError> {
        self.recoverable(false).await
    }

    /// [`recoverable_sagas`](Self::recoverable_sagas), only the first with `first_only`.
    async fn recoverable(&self, first_only: bool) -> Result<Vec<SagaSummary>, KernelError> {
        let mut gone = HashMap::new();
        let mut found = Vec::new();
        for saga in self.log.unfinished_sagas().await? {
            if self.live.contains(&saga.saga_id) {
                continue;
            }
            let recoverable = if saga.owner.is_detached() {
                // Left waiting on purpose: recoverable only once its request is settled.
                !self
                    .log
                    .saga_approval(&saga.saga_id)
                    .await?
                    .is_some_and(|approval| self.still_open(&approval))
            } else {
                saga.owner == self.env.owner || self.owner_gone(&saga.owner, &mut gone).await?
            };
            if recoverable {
                found.push(saga);
                if first_only {
                    break;
                }
            }
        }
        Ok(found)
    }
}
