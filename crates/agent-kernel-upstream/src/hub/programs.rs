//! The servers' programs: started on the hub's thread (outside the kernel's Landlock
//! rules), each process kept there until it exits, and stopped before its server is started
//! again or when the hub is dropped.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::AsyncBufReadExt;
use tokio::runtime::Handle;
use tokio::sync::{Mutex, oneshot};
use tokio::task::JoinSet;
use tracing::{info, warn};

use super::SERVER_STOP_GRACE;
use crate::config::ServerSpec;

/// The processes of the servers a hub started, each kept by a task on the hub's thread
/// until it exits, or is stopped: when the hub is dropped, or before its server is started
/// again (so that at most one process of a server runs, and a compensation never reaches a
/// new process while the old one may still act on the call it undoes).
pub(super) struct Keepers {
    /// The hub's thread's runtime, where programs start and are kept.
    runtime: Handle,
    kept: std::sync::Mutex<HashMap<String, Kept>>,
    /// One start of each server at a time.
    starts: std::sync::Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// Set when the hub is dropped: no start begins after.
    closing: AtomicBool,
}

/// The task keeping one server's process, what tells it to stop the process, and the run
/// tag the process and whatever it started carry.
struct Kept {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    tag: String,
}

/// The parent's ends of a started server's stdin and stdout.
pub(super) struct Pipes {
    pub(super) stdin: OwnedFd,
    pub(super) stdout: OwnedFd,
}

/// The program of `command`, as the tools file's folder sees a relative path.
fn program(folder: &Path, program: &str) -> std::path::PathBuf {
    let path = Path::new(program);
    if path.is_relative() && program.contains('/') {
        folder.join(path)
    } else {
        path.to_path_buf()
    }
}

/// Starts the program of `spec` on the hub's thread, once its earlier process (if any) and
/// what that started are gone, in a task of its own: begun, a start runs whole (stop,
/// spawn, keep) even when nobody waits for it any more, and one start of a server runs at a
/// time. Its stderr goes to the log, its process to `keepers`; the parent's ends of its
/// stdin and stdout.
pub(super) async fn start_program(
    spec: ServerSpec,
    keepers: Arc<Keepers>,
) -> Result<Pipes, String> {
    let name = spec.name.clone();
    let runtime = keepers.runtime.clone();
    runtime
        .spawn(async move {
            let turn = keepers.start_turn(&spec.name);
            let _turn = turn.lock().await;
            if keepers.closing.load(Ordering::Acquire) {
                return Err(format!(
                    "MCP server `{}` was not started: the hub is stopping its servers",
                    spec.name
                ));
            }
            keepers.retire(&spec.name).await;
            let (pipes, child, tag) = spawn_program(&spec)?;
            keepers.keep(child, spec.name.clone(), tag);
            Ok(pipes)
        })
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "MCP server `{name}` was not started: the upstream thread stopped"
            ))
        })
}

/// Spawns the program of `spec` (on the hub's thread): the parent's ends of its stdin and
/// stdout, its process, and its run tag. Its stderr goes to the log.
fn spawn_program(spec: &ServerSpec) -> Result<(Pipes, tokio::process::Child, String), String> {
    let mut command = tokio::process::Command::new(program(&spec.folder, &spec.command[0]));
    command
        .args(&spec.command[1..])
        .current_dir(&spec.folder)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .env_clear();
    for name in ["PATH", "HOME"] {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    command.envs(&spec.env);
    // Tagged, so that `recover` stops it (and what it started) once this process is dead,
    // and the hub before it starts the server again.
    let tag = agent_kernel_sandbox::programs::new_run_tag(&format!("upstream.{}", spec.name));
    command.env(agent_kernel_sandbox::programs::RUN_TAG_VAR, &tag);
    let mut child = command
        .spawn()
        .map_err(|err| format!("cannot start MCP server `{}`: {err}", spec.name))?;
    let piped = |end: Option<OwnedFd>| {
        end.ok_or_else(|| format!("MCP server `{}` was started without its pipes", spec.name))
    };
    let stdin = piped(child.stdin.take().and_then(|end| end.into_owned_fd().ok()))?;
    let stdout = piped(child.stdout.take().and_then(|end| end.into_owned_fd().ok()))?;
    if let Some(stderr) = child.stderr.take() {
        let name = spec.name.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                info!(server = %name, "{line}");
            }
        });
    }
    Ok((Pipes { stdin, stdout }, child, tag))
}

impl Keepers {
    /// Keepers whose programs start on `runtime`, the hub's thread's.
    pub(super) fn on(runtime: Handle) -> Keepers {
        Keepers {
            runtime,
            kept: std::sync::Mutex::default(),
            starts: std::sync::Mutex::default(),
            closing: AtomicBool::new(false),
        }
    }

    /// The turn of server `name`'s starts.
    fn start_turn(&self, name: &str) -> Arc<Mutex<()>> {
        Arc::clone(
            self.starts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .entry(name.to_owned())
                .or_default(),
        )
    }

    /// Keeps `child`, the process of server `name` tagged `tag`, until it exits or is
    /// stopped (on the hub's thread).
    fn keep(&self, mut child: tokio::process::Child, name: String, tag: String) {
        let (stop_it, stopped) = oneshot::channel::<()>();
        let server = name.clone();
        let task = tokio::spawn(async move {
            tokio::select! {
                status = child.wait() => {
                    info!(server = %server, ?status, "MCP server exited");
                    return;
                }
                // Only when told: a sender dropped unsent leaves the process to the end of
                // the hub's runtime (which kills it).
                Ok(()) = stopped => {}
            }
            stop(&mut child, &server).await;
        });
        let kept = Kept {
            stop: stop_it,
            task,
            tag,
        };
        let earlier = self
            .kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(name, kept);
        debug_assert!(
            earlier.is_none(),
            "a start retires the earlier process first"
        );
    }

    /// Stops the process of server `name`, if one runs, and waits until it and whatever it
    /// started are gone.
    async fn retire(&self, name: &str) {
        let kept = self
            .kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(name);
        if let Some(kept) = kept {
            if !kept.task.is_finished() {
                info!(server = %name, "stopping the earlier process of this MCP server before starting it again");
            }
            retired(kept).await;
        }
    }

    /// Stops every server still running, and waits until each is gone.
    /// Starts under way finish first (later ones start nothing); the servers stop
    /// together.
    pub(super) async fn stop_all(&self) {
        self.closing.store(true, Ordering::Release);
        let turns: Vec<_> = self
            .starts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .map(Arc::clone)
            .collect();
        for turn in turns {
            drop(turn.lock().await);
        }
        let kept = std::mem::take(
            &mut *self
                .kept
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let mut stopping = JoinSet::new();
        for kept in kept.into_values() {
            stopping.spawn(retired(kept));
        }
        while stopping.join_next().await.is_some() {}
    }
}

/// Stops a kept process and then whatever it started (a wrapper's server: `npx`, `sh -c`),
/// by its run tag.
async fn retired(kept: Kept) {
    let _ = kept.stop.send(());
    let _ = kept.task.await;
    let tag = kept.tag;
    let stopped =
        tokio::task::spawn_blocking(move || agent_kernel_sandbox::programs::stop_tagged(&tag))
            .await;
    match stopped {
        Ok(Ok(stopped)) if stopped.n_left > 0 => {
            warn!(
                left = stopped.n_left,
                "processes an MCP server started were not all stopped"
            );
        }
        Ok(Ok(_)) => {}
        Ok(Err(err)) => warn!(%err, "cannot look for the processes an MCP server started"),
        Err(err) => warn!(%err, "the search for the processes an MCP server started failed"),
    }
}

/// Stops a server whose stdin was closed (or is being closed): given [`SERVER_STOP_GRACE`]
/// to exit, then `SIGTERM` and as long again, then `SIGKILL`.
async fn stop(child: &mut tokio::process::Child, name: &str) {
    if tokio::time::timeout(SERVER_STOP_GRACE, child.wait())
        .await
        .is_ok()
    {
        return;
    }
    // Not reaped yet, so its pid is still its own.
    if let Some(pid) = child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        if tokio::time::timeout(SERVER_STOP_GRACE, child.wait())
            .await
            .is_ok()
        {
            return;
        }
    }
    warn!(server = %name, "MCP server did not stop when asked; killed");
    let _ = child.kill().await;
}
