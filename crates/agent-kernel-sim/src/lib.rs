//! The agent-kernel simulator: the real engine ([`agent_kernel_core::Kernel`]) and the real
//! SQLite log, run by simulated processes that are killed, or meet an I/O error, at every
//! point a seed's scenario reaches; after each case a model of the world checks what the
//! sagas left.
//!
//! # What a case is
//!
//! A seed makes a [`Scenario`]: up to three sagas of up to three `sim.set` steps over three
//! shared keys, some steps failing on purpose, some settled by a probe (`sim.set.probed`),
//! some waiting for an operator's approval (`sim.set.approved`), some through a simulated
//! upstream MCP server (`up.set`, the real upstream tool and hub, `upstream.rs`), perhaps a
//! writer outside the kernel, and perhaps an operator. The first process runs every saga at once (the schedule, from the
//! seed, decides how they interleave), each as a plan, as a live saga driven call by call
//! and committed or aborted, or as one call alone, as the seed says; the operator, a process of its own beside it, undoes
//! sagas as they end `Done` and retries dead letters as they open, and decides the approval requests it finds (a
//! waiting saga's driver resumes it once decided); then a process runs
//! `recover`; when that one is killed, another runs it again; and, when the scenario keys
//! its steps, an agent started again runs every saga once more with the same keys. A
//! point is every log write and every effect, compensation or probe of a tool, numbered
//! from 0 in each process. A [`Fault`] at a point kills the process just before it, just after it, or
//! makes it fail (an I/O error writing the log; an effect whose answer is lost; a
//! compensation that fails), or, at a tool's point, hang before or after its work until the
//! engine's timeout gives up on it; or the machine loses power just after it: both processes
//! die, and the log's files are put back to what a machine keeps at the case's durability
//! (`full`: every commit, the head file perhaps one move behind; `normal`: a prefix of the
//! commits, the head file any version), checked by `audit verify` (and sealed where the head
//! file is newer than the log) before `recover` runs. [`explore_seed`] runs the scenario
//! without a fault, then once for each point and each kind of fault, then a power loss after
//! each point, half of the cases with the first `recover` killed
//! too, and, where the scenario has an operator, half of the cases (drawn apart from the
//! `recover`'s) with the operator meeting a fault as well.
//!
//! A killed process does nothing more: every later log call and tool call of it waits
//! forever, and the case drops it. What it committed stays in the log, as after a
//! `SIGKILL`. Log calls complete on the spot, and a paused clock moves only when every
//! task waits, so one seed makes one history.
//!
//! # What is checked
//!
//! After the last `recover`:
//! - every saga is settled (`Done`, `FailedRolledBack`, `Undone`, or `FailedRollbackPartial`
//!   with an open dead letter naming it), and a settled saga holds no lock;
//! - each key holds what the sagas that ended `Done` and the outside writers wrote, the
//!   latest last (a key whose latest write is a parked saga's is left to the operator; an
//!   effect or compensation whose record a power loss took counts as an outside write, a lost
//!   compensation putting back what its step found);
//! - no effect happened twice, none after its step's compensation, and no compensation
//!   restored over a write it did not make;
//! - a step that needs an approval acted only under its saga's request, approved and
//!   consumed;
//! - the audit chain verifies.
//!
//! A failing case is shrunk (sagas, steps and outside writes dropped while some fault still
//! fails) and printed with its history.
//!
//! # What is not modelled
//!
//! One log (SQLite; PostgreSQL's many processes are not simulated), power lost only on the
//! first process's machine and never tearing a page, the engine's calls only (plans,
//! live sagas, calls alone, `recover`, `undo`, `dlq retry`, approve and reject; not the
//! MCP server around them), one in-process tool under three ids, and one upstream server
//! reached through the hub's connection seam (not the MCP protocol over stdio).

mod check;
mod drivers;
mod explore;
mod log;
mod operator;
mod power;
mod process;
mod run;
mod scenario;
mod tools;
mod upstream;
mod world;

pub use crate::explore::{
    OPERATOR_POINTS_TRIED, RECOVERY_POINTS_TRIED, SeedReport, explore_seed, explore_seed_as,
};
pub use crate::power::PowerLoss;
pub use crate::process::{Fault, FaultKind};
pub use crate::run::{Case, CaseOutcome, run_case};
pub use crate::scenario::{
    Driver, KEYS, OPERATOR_ACTIONS_MAX, Outside, Rng, SAGAS_MAX, STEPS_MAX, Scenario, StepSpec,
};
pub use crate::tools::{APPROVED_TOOL, PROBED_TOOL, SET_TOOL};
pub use crate::upstream::UPSTREAM_TOOL;
pub use crate::world::{Event, World, WorldState};

/// `path` with `suffix` after its name (SQLite's `-wal`, `-shm`).
pub(crate) fn with_suffix(path: &std::path::Path, suffix: &str) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

/// A folder for the cases' logs: in memory (`/dev/shm`) where the machine has one, since a
/// case writes a log of its own, else the system's temporary folder.
///
/// # Errors
///
/// When no folder can be made.
pub fn scratch_dir() -> std::io::Result<tempfile::TempDir> {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = tempfile::Builder::new()
            .prefix("agent-kernel-sim")
            .tempdir_in(shm)
    {
        return Ok(dir);
    }
    tempfile::Builder::new()
        .prefix("agent-kernel-sim")
        .tempdir()
}
