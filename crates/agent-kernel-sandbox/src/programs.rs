//! Programs the kernel starts (command tools' phases, upstream MCP servers) carry a tag in
//! their environment, [`RUN_TAG_VAR`], that every process they start inherits, even one
//! that leaves the process group with `setsid`. By that tag the kernel stops what is left
//! of a run once it decided about it, and `recover` stops what a dead kernel started before
//! it compensates, so no effect lands after its undoing.
//!
//! A tag is `PID.START_TICKS/` of the kernel process that started the program (which tells
//! a reused pid apart), then what the run is, ending in `/`: a tag is matched by prefix, so
//! the prefix of a process stops everything it started, and a run's whole tag that run
//! alone. Processes are found by reading `/proc/PID/environ` (the same user's, or any as
//! root), signalled through a pidfd opened before the tag is checked again, so a pid reused
//! meanwhile is never signalled.
//!
//! Reading another process's environment is what Landlock forbids a confined process to
//! do outside its own domain, so the scans run on one thread started before the kernel
//! confines itself ([`start_stopper`]), as the log's writer is; a process of this user whose
//! environment still cannot be read is counted as left ([`Stopped::n_left`]), never as
//! untagged.
//!
//! What this does not stop: a program that clears its environment (or execs with a new
//! one) after leaving the process group; processes of another user that `/proc` hides.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The environment variable that carries a program's tag.
pub const RUN_TAG_VAR: &str = "AGENT_KERNEL_RUN";

/// The longest [`stop_tagged`] waits for the processes it killed to be gone.
pub const STOP_WAIT_MS_MAX: u64 = 5_000;

/// The most processes [`stop_tagged`] kills in one call (a bound on a runaway fork loop;
/// past it, the rest are reported left).
pub const STOP_PROCESSES_MAX: usize = 4_096;

/// The tag prefix of every program that the process `pid`, started at `start_ticks` (clock
/// ticks since boot, field 22 of `/proc/PID/stat`), started.
pub fn process_tag(pid: u32, start_ticks: u64) -> String {
    format!("{pid}.{start_ticks}/")
}

/// The tag prefix of this process, read once from `/proc/self/stat` (a `0` start when
/// `/proc` cannot tell).
fn own_tag() -> &'static str {
    static OWN: OnceLock<String> = OnceLock::new();
    OWN.get_or_init(|| {
        let pid = std::process::id();
        let start_ticks = read_stat(pid)
            .ok()
            .flatten()
            .map_or(0, |stat| stat.start_ticks);
        process_tag(pid, start_ticks)
    })
}

/// A new tag for one run of a program started by this process: its prefix, then `what`
/// (`/` and NUL replaced), then a number no other run of this process has.
pub fn new_run_tag(what: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n_run = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{}/{n_run}/", run_tag_prefix(what))
}

/// The tag prefix of every run of this process whose `what` starts with `what_prefix`
/// (`/` and NUL replaced as [`new_run_tag`] replaces them): every phase of one step, say.
pub fn run_tag_prefix(what_prefix: &str) -> String {
    let what: String = what_prefix
        .chars()
        .map(|c| if c == '/' || c == '\0' { '_' } else { c })
        .collect();
    format!("{}{what}", own_tag())
}

/// What [`stop_tagged`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stopped {
    /// Processes killed (SIGKILL) and seen gone.
    pub n_killed: usize,
    /// Processes still there after [`STOP_WAIT_MS_MAX`] (or past [`STOP_PROCESSES_MAX`]),
    /// and processes of this user whose environment could not be read (they may be tagged).
    pub n_left: usize,
}

/// A request to the stopper thread: a prefix, and where to answer.
type StopRequest = (String, std::sync::mpsc::Sender<io::Result<Stopped>>);

/// The stopper thread's requests, once it runs.
static STOPPER: OnceLock<std::sync::mpsc::Sender<StopRequest>> = OnceLock::new();

/// Starts, once per process, the thread that [`stop_tagged`] hands its work to: call it
/// before the process confines itself (Landlock), so that the thread may read and signal
/// the processes of another domain (a dead kernel's programs). Later calls do nothing.
///
/// # Errors
///
/// An I/O error when the thread cannot be started.
pub fn start_stopper() -> io::Result<()> {
    if STOPPER.get().is_some() {
        return Ok(());
    }
    let (requests, queue) = std::sync::mpsc::channel::<StopRequest>();
    std::thread::Builder::new()
        .name("agent-kernel-stopper".to_owned())
        .spawn(move || {
            for (prefix, reply) in queue {
                let _ = reply.send(stop_tagged_here(&prefix));
            }
        })?;
    // Another thread may have started one first: this one then ends with its queue.
    let _ = STOPPER.set(requests);
    Ok(())
}

/// Kills (SIGKILL) every process whose tag starts with `prefix`, again until none is left
/// (one may fork while the others die), and waits until they are gone (exited; a zombie
/// counts as gone, it can do nothing more). Runs on the stopper thread when one was started
/// ([`start_stopper`]), else on the calling thread. Blocking: run it off the async runtime.
///
/// # Errors
///
/// An I/O error when `/proc` cannot be listed.
pub fn stop_tagged(prefix: &str) -> io::Result<Stopped> {
    if let Some(stopper) = STOPPER.get() {
        let (reply, answer) = std::sync::mpsc::channel();
        if stopper.send((prefix.to_owned(), reply)).is_ok()
            && let Ok(stopped) = answer.recv()
        {
            return stopped;
        }
    }
    stop_tagged_here(prefix)
}

/// [`stop_tagged`]'s work, on the calling thread.
fn stop_tagged_here(prefix: &str) -> io::Result<Stopped> {
    let deadline = Instant::now() + Duration::from_millis(STOP_WAIT_MS_MAX);
    let mut killed: HashSet<u32> = HashSet::new();
    let mut pause = Duration::from_millis(1);
    loop {
        let (found, n_unreadable) = find_tagged(prefix)?;
        if found.is_empty() {
            return Ok(Stopped {
                n_killed: killed.len(),
                n_left: n_unreadable,
            });
        }
        if Instant::now() >= deadline || killed.len() >= STOP_PROCESSES_MAX {
            return Ok(Stopped {
                n_killed: killed.len().saturating_sub(found.len()),
                n_left: found.len() + n_unreadable,
            });
        }
        for pid in found {
            if kill_if_tagged(pid, prefix) {
                killed.insert(pid);
            }
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// What reading a process's environment said of a tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tagged {
    Yes,
    No,
    /// Reading it was refused (another user's, a process this one may not inspect, or a
    /// Landlock domain this thread is confined from).
    Unreadable,
}

/// Whether the environment of `pid` holds a tag starting with `prefix`.
fn is_tagged(pid: u32, prefix: &str) -> Tagged {
    let environ = match fs::read(format!("/proc/{pid}/environ")) {
        Ok(environ) => environ,
        Err(error) if error.kind() == io::ErrorKind::PermissionDenied => {
            return Tagged::Unreadable;
        }
        // Gone, or a kernel thread (no environment).
        Err(_) => return Tagged::No,
    };
    let wanted = format!("{RUN_TAG_VAR}={prefix}");
    if environ
        .split(|byte| *byte == 0)
        .any(|entry| entry.starts_with(wanted.as_bytes()))
    {
        Tagged::Yes
    } else {
        Tagged::No
    }
}

/// The start ticks a tag prefix names (`PID.START_TICKS/…`): programs carrying it started
/// later.
fn started_at(prefix: &str) -> Option<u64> {
    prefix.split('/').next()?.split('.').nth(1)?.parse().ok()
}

/// The live (not zombie) processes, other than this one, tagged with `prefix`; and how
/// many live processes of this user, started after the process the prefix names, refused
/// to be read (they may carry the tag).
fn find_tagged(prefix: &str) -> io::Result<(Vec<u32>, usize)> {
    use std::os::unix::fs::MetadataExt as _;
    let me = std::process::id();
    let uid = rustix::process::geteuid().as_raw();
    let since = started_at(prefix).unwrap_or(0);
    let mut found = Vec::new();
    let mut n_unreadable = 0;
    for entry in fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let tagged = is_tagged(pid, prefix);
        if tagged == Tagged::No {
            continue;
        }
        let stat = read_stat(pid).ok().flatten().filter(|stat| !stat.is_zombie);
        match (tagged, stat) {
            (Tagged::Yes, Some(_)) => found.push(pid),
            // This user's process, alive, started after the tag's process, whose environment
            // cannot be read: it may carry the tag, so it is not taken for untagged.
            (Tagged::Unreadable, Some(stat))
                if stat.start_ticks >= since
                    && entry.metadata().is_ok_and(|meta| meta.uid() == uid) =>
            {
                n_unreadable += 1;
            }
            _ => {}
        }
    }
    Ok((found, n_unreadable))
}

/// Kills `pid` if it still carries the tag: through a pidfd opened first, so that a pid
/// reused between the check and the signal is never signalled. Whether it was signalled.
fn kill_if_tagged(pid: u32, prefix: &str) -> bool {
    let Some(raw) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    let Ok(pidfd) = rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()) else {
        return false;
    };
    // The pidfd names one process for good: if it still carries the tag now, the signal
    // reaches that process, whatever reuses its pid later.
    if is_tagged(pid, prefix) != Tagged::Yes {
        return false;
    }
    rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL).is_ok()
}

/// The fields of `/proc/PID/stat` this module and liveness checks need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// When the process started, in clock ticks since boot.
    pub start_ticks: u64,
    /// Whether it has exited and waits to be reaped (state `Z` or `X`).
    pub is_zombie: bool,
}

/// Reads `/proc/PID/stat`; `None` when no such process exists.
///
/// # Errors
///
/// An I/O error other than "not found", or a line that does not parse.
pub fn read_stat(pid: u32) -> io::Result<Option<ProcStat>> {
    let text = match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(text) => text,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        // A process that exited between the listing and the read.
        Err(err) if err.raw_os_error() == Some(3) => return Ok(None),
        Err(err) => return Err(err),
    };
    parse_stat(&text)
        .map(Some)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed /proc stat"))
}

/// Parses the fields we need from a `/proc/PID/stat` line.
///
/// The command name (field 2) is in parentheses and may itself contain spaces and
/// parentheses, so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let after_name = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // fields[0] is field 3 (state); start time is field 22.
    let state = *fields.first()?;
    let start_ticks = fields.get(22 - 3)?.parse().ok()?;
    Some(ProcStat {
        start_ticks,
        is_zombie: state == "Z" || state == "X",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn tags_are_unique_per_run_and_share_the_process_prefix() {
        let first = new_run_tag("saga/1/execute");
        let second = new_run_tag("saga/1/execute");
        assert_ne!(first, second);
        assert!(first.starts_with(own_tag()), "{first}");
        assert!(first.ends_with('/'), "{first}");
        assert!(
            !first[own_tag().len()..].starts_with("saga/"),
            "slashes replaced"
        );
    }

    #[test]
    fn stop_tagged_kills_a_setsid_grandchild_and_spares_the_untagged() {
        let tag = new_run_tag("test");
        let other = new_run_tag("other");
        // A shell that starts a grandchild in a session of its own, then exits: the
        // grandchild is no longer in any group the kernel knows.
        let spawn = |tag: &str| {
            let mut child = Command::new("/bin/sh")
                .args(["-c", "setsid sleep 30 >/dev/null 2>&1 </dev/null & echo $!"])
                .env(RUN_TAG_VAR, tag)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawns");
            let mut out = String::new();
            std::io::Read::read_to_string(child.stdout.as_mut().expect("piped"), &mut out)
                .expect("reads");
            child.wait().expect("waits");
            let pid = out.trim().parse::<u32>().expect("a pid");
            // Until the grandchild runs `sleep`: while `setsid` execs it, its environment
            // may read as empty, and a scan then would not see its tag.
            let deadline = Instant::now() + Duration::from_secs(10);
            while !fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmd| cmd.starts_with(b"sleep"))
            {
                assert!(Instant::now() < deadline, "{pid} never ran sleep");
                std::thread::sleep(Duration::from_millis(1));
            }
            pid
        };
        let doomed = spawn(&tag);
        let spared = spawn(&other);
        let stopped = stop_tagged(&tag).expect("scans");
        assert_eq!(
            stopped,
            Stopped {
                n_killed: 1,
                n_left: 0
            }
        );
        assert!(!matches!(read_stat(doomed), Ok(Some(stat)) if !stat.is_zombie));
        assert!(matches!(read_stat(spared), Ok(Some(stat)) if !stat.is_zombie));
        assert_eq!(stop_tagged(&other).expect("scans").n_killed, 1);
        assert_eq!(stop_tagged(&tag).expect("scans"), Stopped::default());
    }

    #[test]
    fn stat_with_spaces_and_parens_in_name() {
        let line = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100";
        let stat = parse_stat(line).expect("parses");
        assert_eq!(stat.start_ticks, 987_654);
        assert!(!stat.is_zombie);
        let zombie = line.replace(") S ", ") Z ");
        assert!(parse_stat(&zombie).expect("parses").is_zombie);
    }
}
