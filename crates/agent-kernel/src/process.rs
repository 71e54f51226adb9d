//! This process as an owner of sagas, and the probe that tells whether another owner is
//! still running (Linux `/proc`), which [`KernelBuilder`](crate::KernelBuilder) injects
//! into the engine.

use std::fs;
use std::io;

use agent_kernel_api::Owner;
use agent_kernel_core::{Liveness, LivenessProbe, StoppedPrograms};
use agent_kernel_sandbox::programs::{self, read_stat};

/// The real probe: reads `/proc` (Linux).
///
/// An owner is alive only if it ran on this host, in this boot, and `/proc/<pid>/stat`
/// shows a process that is not a zombie and started at the recorded tick; a pid reused by
/// another process has another start time and counts as dead.
#[derive(Debug, Clone)]
pub struct ProcessProbe {
    me: Owner,
}

impl ProcessProbe {
    /// A probe that compares owners with `me`, the current process. It starts the thread
    /// that stops tagged programs (`agent_kernel_sandbox::programs::start_stopper`) now, so
    /// that a kernel built before the process confines itself can still find and stop what
    /// a dead kernel started, outside this process's Landlock domain.
    pub fn new(me: Owner) -> Self {
        if let Err(error) = programs::start_stopper() {
            tracing::warn!(%error, "cannot start the thread that stops a dead process's programs; they are looked for from the recovering thread");
        }
        Self { me }
    }
}

impl LivenessProbe for ProcessProbe {
    fn stop_programs_of(&self, owner: &Owner) -> StoppedPrograms {
        // Processes outlive neither their machine nor its boot.
        if owner.host != self.me.host || owner.boot_id != self.me.boot_id || *owner == self.me {
            return StoppedPrograms::default();
        }
        let tag = programs::process_tag(owner.pid, owner.start_ticks);
        programs::stop_tagged(&tag).map_or_else(
            |error| {
                tracing::warn!(%error, pid = owner.pid, "cannot look for the programs a dead process started");
                StoppedPrograms::default()
            },
            |stopped| StoppedPrograms {
                n_killed: stopped.n_killed,
                n_left: stopped.n_left,
            },
        )
    }

    fn liveness(&self, owner: &Owner) -> Liveness {
        if owner.host != self.me.host {
            return Liveness::Unknown;
        }
        if owner.boot_id != self.me.boot_id {
            return Liveness::Dead;
        }
        match read_stat(owner.pid) {
            Ok(Some(stat)) if !stat.is_zombie && stat.start_ticks == owner.start_ticks => {
                Liveness::Alive
            }
            Ok(Some(_)) => Liveness::Dead,
            // Not in /proc: gone, unless /proc hides it (`hidepid`: another user's process).
            Ok(None) => match process_exists(owner.pid) {
                Some(false) => Liveness::Dead,
                // It exists, but its start time cannot be read to tell a reused pid: do not
                // guess.
                Some(true) | None => Liveness::Unknown,
            },
            // /proc unreadable for another reason: do not guess.
            Err(_) => Liveness::Unknown,
        }
    }
}

/// Whether a process with this pid exists, asked of the kernel without `/proc` (a null
/// signal: `ESRCH` means none; success or `EPERM` means one exists, perhaps another
/// user's that `/proc` mounted with `hidepid` does not show); `None` when it cannot tell.
fn process_exists(pid: u32) -> Option<bool> {
    let pid = rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)?;
    match rustix::process::test_kill_process(pid) {
        Ok(()) => Some(true),
        Err(rustix::io::Errno::PERM) => Some(true),
        Err(rustix::io::Errno::SRCH) => Some(false),
        Err(_) => None,
    }
}

/// The owner record of the current process.
///
/// # Errors
///
/// An I/O error when `/proc` cannot be read (the kernel needs Linux `/proc` to tell a dead
/// owner from a live one).
pub fn current_owner() -> io::Result<Owner> {
    let pid = std::process::id();
    let stat = read_stat(pid)?
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "/proc/self/stat is missing"))?;
    let boot_id = fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_owned();
    let host = fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_default();
    Ok(Owner {
        host,
        boot_id,
        pid,
        start_ticks: stat.start_ticks,
    })
}

/// The real user id of the current process (from `/proc/self/status`), recorded with
/// operator commands; `None` when it cannot be read.
pub fn current_uid() -> Option<u32> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    parse_uid(&status)
}

/// The real uid on the `Uid:` line of a `/proc/<pid>/status` text.
fn parse_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_is_asked_of_the_kernel_when_proc_does_not_show_it() {
        assert_eq!(process_exists(std::process::id()), Some(true));
        // pid 1 exists in every pid namespace; as another user's, the answer is EPERM.
        assert_eq!(process_exists(1), Some(true));
        // Above the largest pid Linux allocates (2^22).
        assert_eq!(process_exists(4_194_304 + 17), Some(false));
        assert_eq!(process_exists(0), None, "not a pid");
    }

    #[test]
    fn uid_is_the_real_uid_of_the_status_text() {
        let status = "Name:\tagent-kernel\nUmask:\t0022\nUid:\t1000\t0\t0\t0\nGid:\t100\n";
        assert_eq!(parse_uid(status), Some(1000));
        assert_eq!(parse_uid("Name:\tx\n"), None);
        assert_eq!(current_uid().is_some(), cfg!(target_os = "linux"));
    }

    #[test]
    fn this_process_is_alive_and_others_are_not() {
        let me = current_owner().expect("reads /proc");
        let probe = ProcessProbe::new(me.clone());
        assert_eq!(probe.liveness(&me), Liveness::Alive);
        let reused_pid = Owner {
            start_ticks: me.start_ticks + 1,
            ..me.clone()
        };
        assert_eq!(probe.liveness(&reused_pid), Liveness::Dead);
        let other_boot = Owner {
            boot_id: "another-boot".into(),
            ..me.clone()
        };
        assert_eq!(probe.liveness(&other_boot), Liveness::Dead);
        let other_host = Owner {
            host: format!("{}-elsewhere", me.host),
            ..me
        };
        assert_eq!(probe.liveness(&other_host), Liveness::Unknown);
    }
}
