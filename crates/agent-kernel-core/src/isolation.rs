//! Isolation between sagas: the conflict a step meets on a resource another unsettled saga
//! holds, how long it waits first, and the earlier step a call of an irreversible tool
//! would duplicate.

use std::time::Duration;

use agent_kernel_api::{
    ApprovalRequest, BeginStep, DuplicateCheck, DuplicateStep, DynTool, LockHolder, SagaId,
    ToolContext, ToolError,
};
use serde_json::Value;
use tracing::warn;

use crate::conflict::Conflict;
use crate::kernel::Kernel;
use crate::owner::Liveness;
use crate::{KernelError, shown_json};

/// How long a step waiting for a resource (`[limits] lock_wait_ms`) pauses before it
/// claims it again the first time; each pause doubles, up to [`MAX_LOCK_PAUSE`].
pub const LOCK_POLL_INTERVAL: Duration = Duration::from_millis(20);

/// The longest pause between two claims of a step waiting for a resource.
pub const MAX_LOCK_PAUSE: Duration = Duration::from_millis(500);

/// What a step declares before it runs: the resources it claims and its duplicate keys.
pub(crate) struct Declared {
    pub(crate) resources: Vec<String>,
    pub(crate) duplicate_keys: Vec<String>,
}

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

    /// Whether what a begun step's undo data describes changed between its preparation and
    /// its claim: another saga may have written a resource and settled in between, before
    /// the step held it, and compensating the step with that undo data would destroy that
    /// saga's write. Asked of tools that compensate, for steps that claim resources, once no
    /// other saga can change them (`Compensate::changed_since_prepared`: a world that holds
    /// what the step would leave has changed too); a tool that cannot tell answers nothing. The error of a
    /// step that must not run then (nothing was applied).
    pub(crate) async fn prepared_world_changed(
        &self,
        ctx: &ToolContext,
        args: &Value,
        tool: &dyn DynTool,
        begin: &BeginStep,
    ) -> Option<ToolError> {
        if begin.resources.is_empty() || !tool.compensates() {
            return None;
        }
        let changed = self
            .tools
            .changed_since_prepared(ctx, args, &begin.undo)
            .await;
        let change = changed.ok().flatten()?;
        warn!(step_seq = begin.step_seq, tool = %begin.tool_id, %change, "the world changed between the step's preparation and its claim");
        Some(ToolError::failed(format!(
            "what the step would change was changed by another writer between its preparation and its claim ({change}); nothing was applied, run it again"
        )))
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
        let Some(check) = self.duplicate_check(duplicate_keys, None) else {
            return Ok(None);
        };
        Ok(self
            .log
            .duplicate_of(saga_id, tool_id, duplicate_keys, check.since_ms)
            .await?)
    }

    /// The check a BEGIN with these duplicate keys makes again in its own transaction
    /// ([`BeginStep::duplicate_check`]), so that a duplicate begun between the look of
    /// [`duplicated_step`](Self::duplicated_step) and the BEGIN is caught too. With the
    /// approval the BEGIN consumes (`approved`, its request), only what began since the
    /// request was asked counts (the request showed the newest step before), and never the
    /// step it was given over. `None` without keys or without a window.
    ///
    /// [`BeginStep::duplicate_check`]: agent_kernel_api::BeginStep::duplicate_check
    pub(crate) fn duplicate_check(
        &self,
        duplicate_keys: &[String],
        approved: Option<&ApprovalRequest>,
    ) -> Option<DuplicateCheck> {
        let window_ms = self.tools.limits().duplicate_window_ms;
        if duplicate_keys.is_empty() || window_ms == 0 {
            return None;
        }
        let window_ms = i64::try_from(window_ms).unwrap_or(i64::MAX);
        let window_start = self.env.clock.now_ms().saturating_sub(window_ms);
        Some(DuplicateCheck {
            since_ms: approved.map_or(window_start, |request| {
                window_start.max(request.requested_at_ms)
            }),
            approved_over: approved
                .and_then(|request| request.duplicate_of.as_ref())
                .map(|earlier| (earlier.saga_id.clone(), earlier.step_seq)),
        })
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
