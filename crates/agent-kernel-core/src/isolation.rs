//! Isolation between sagas: the conflict a step meets on a resource another unsettled saga
//! holds, how long it waits first, and the earlier step a call of an irreversible tool
//! would duplicate.

use std::time::Duration;

use agent_kernel_api::{DuplicateStep, DynTool, LockHolder, SagaId};

use crate::conflict::Conflict;
use crate::kernel::Kernel;
use crate::owner::Liveness;
use crate::{KernelError, shown_json};

/// How long a step waiting for a resource (`[limits] lock_wait_ms`) pauses before it
/// claims it again the first time; each pause doubles, up to [`MAX_LOCK_PAUSE`].
pub const LOCK_POLL_INTERVAL: Duration = Duration::from_millis(20);

/// The longest pause between two claims of a step waiting for a resource.
pub const MAX_LOCK_PAUSE: Duration = Duration::from_millis(500);

impl Kernel {
    /// The conflict a step of `tool` met on `holder`'s lock, after waiting `waited_ms`.
    pub(crate) async fn conflict(
        &self,
        tool: &str,
        holder: LockHolder,
        waited_ms: u64,
    ) -> Result<Conflict, KernelError> {
        let alive = self.owner_liveness(&holder.owner).await? != Liveness::Dead;
        Ok(Conflict {
            tool: tool.to_owned(),
            holder,
            alive,
            waited_ms,
        })
    }

    /// The earlier step a call of `tool` with these duplicate keys repeats, within
    /// `[limits] duplicate_window`: only for tools of reversibility `none` or `partial`
    /// (whose keys are not empty), in another saga than `saga_id`.
    pub(crate) async fn duplicated_step(
        &self,
        saga_id: &SagaId,
        tool_id: &str,
        duplicate_keys: &[String],
    ) -> Result<Option<DuplicateStep>, KernelError> {
        let window_ms = self.tools.limits().duplicate_window_ms;
        if duplicate_keys.is_empty() || window_ms == 0 {
            return Ok(None);
        }
        let window_ms = i64::try_from(window_ms).unwrap_or(i64::MAX);
        let since_ms = self.env.clock.now_ms().saturating_sub(window_ms);
        Ok(self
            .log
            .duplicate_of(saga_id, tool_id, duplicate_keys, since_ms)
            .await?)
    }
}

/// Why a call that duplicates `earlier` needs an approval, with both calls side by side.
pub(crate) fn duplicate_reason(tool: &dyn DynTool, earlier: &DuplicateStep) -> String {
    format!(
        "`{}` (reversibility {}) may repeat an effect: saga {} step {} called it with the same `{}` at {} ({}), with the arguments {}",
        tool.id(),
        tool.reversibility().as_str(),
        earlier.saga_id,
        earlier.step_seq,
        earlier.key,
        agent_kernel_api::format_rfc3339_ms(earlier.at_ms),
        earlier.status,
        shown_json(&earlier.args).text,
    )
}
