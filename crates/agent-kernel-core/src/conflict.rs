//! The conflict a step (or an undo) meets on a resource another unsettled saga holds: a
//! value the engine's errors and answers carry.

use std::fmt;

use agent_kernel_api::{LockHolder, SagaState};
use serde::ser::{Serialize, SerializeStruct, Serializer};

/// A step refused because another saga that is not settled holds a resource it would
/// claim: nothing of the step ran. Serialized with its fields and `message`, the sentence
/// [`Display`](fmt::Display) writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The step's tool.
    pub tool: String,
    /// The resource and the saga holding it.
    pub holder: LockHolder,
    /// Whether the holder's process is running (or cannot be known to be gone); a dead
    /// process's sagas keep their locks until `recover` settles them.
    pub alive: bool,
    /// How long the step waited for the resource, in milliseconds (`[limits] lock_wait_ms`).
    pub waited_ms: u64,
}

impl Serialize for Conflict {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut document = serializer.serialize_struct("Conflict", 5)?;
        document.serialize_field("tool", &self.tool)?;
        document.serialize_field("holder", &self.holder)?;
        document.serialize_field("alive", &self.alive)?;
        document.serialize_field("waited_ms", &self.waited_ms)?;
        document.serialize_field("message", &self.to_string())?;
        document.end()
    }
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let holder = &self.holder;
        write!(
            f,
            "`{}` cannot run: `{}` is held by saga {} ({})",
            self.tool, holder.resource, holder.saga_id, holder.state
        )?;
        if holder.state == SagaState::AwaitingApproval && holder.owner.is_detached() {
            // Left waiting by `run --no-wait`: no process holds it, a person does.
            write!(
                f,
                ", which waits for an operator's approval: decide it (`agent-kernel approvals`), then `agent-kernel resume --saga {}`",
                holder.saga_id
            )?;
        } else if self.alive {
            write!(
                f,
                " of process {} on {}, which is running",
                holder.owner.pid, holder.owner.host
            )?;
        } else {
            write!(
                f,
                " of a process that is no longer running: run `agent-kernel recover` (it was process {} on {})",
                holder.owner.pid, holder.owner.host
            )?;
        }
        if self.waited_ms > 0 {
            write!(f, "; waited {} ms", self.waited_ms)?;
        }
        Ok(())
    }
}
