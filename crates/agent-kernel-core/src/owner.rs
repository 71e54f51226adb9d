//! Which process owns a saga, and whether it is still alive.

use agent_kernel_api::Owner;

/// Whether a saga's owning process is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// The process is running: its saga must not be touched.
    Alive,
    /// The process is gone (exited, killed, the machine rebooted, or its pid was reused).
    Dead,
    /// It cannot be decided here (the owner ran on another host): treated as alive.
    Unknown,
}

/// Decides whether an [`Owner`] is alive, and stops what a dead one started. Injected so
/// tests can stage any situation.
pub trait LivenessProbe: Send + Sync + 'static {
    /// Whether `owner` is still running.
    fn liveness(&self, owner: &Owner) -> Liveness;

    /// Stops every program that `owner`, a process known dead, started and that still
    /// runs (a command tool's phase, its children, an upstream server), and waits until
    /// they are gone: recovery calls it before it compensates or probes the owner's sagas,
    /// so no effect of theirs lands after its undoing. Blocking (the kernel calls it on a
    /// blocking thread). The default stops nothing.
    fn stop_programs_of(&self, _owner: &Owner) -> StoppedPrograms {
        StoppedPrograms::default()
    }
}

/// What [`LivenessProbe::stop_programs_of`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoppedPrograms {
    /// Processes killed and seen gone.
    pub n_killed: usize,
    /// Processes that may still run (not seen gone in time, or not readable).
    pub n_left: usize,
}
