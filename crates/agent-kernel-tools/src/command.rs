//! Command tools (reference §7): tools that are programs in any language, declared in
//! `tools.toml`, run one process per phase with a JSON object on stdin.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

pub use agent_kernel_api::Reversibility;
use agent_kernel_api::{
    Compensate, EffectClass, KeyTemplate, Probe, ProbeOutcome, Settlement, Tool, ToolContext,
    ToolEntry, ToolError, ToolOutput, ToolSpec, Undo, UndoWindow, line_of, parse_templates,
    read_text_bounded,
};
use agent_kernel_sandbox::{ProgramAccess, programs};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The largest `tools.toml` read, in bytes.
pub const TOOLS_FILE_BYTES_MAX: usize = 1024 * 1024;
/// The most tools one `tools.toml` declares.
pub const COMMAND_TOOLS_MAX: usize = 1024;
/// The most stderr kept from a run, in bytes (its last line is the failure's message).
pub const COMMAND_STDERR_BYTES_MAX: usize = 64 * 1024;
/// The longest `timeout_ms` a command tool may declare (an hour, as `[limits]`).
pub const COMMAND_TIMEOUT_MS_MAX: u64 = 3_600_000;
/// The exit code by which a program says its failure may be retried (`EX_TEMPFAIL`); the
/// kernel retries it only for tools declared `idempotent`.
pub const EXIT_RETRY: i32 = 75;

/// Why a tools file was refused: its path, the line (when known) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tools file {path}{}: {message}", .line.map(|line| format!(", line {line}")).unwrap_or_default())]
pub struct ToolsFileError {
    /// The file.
    pub path: String,
    /// The 1-based line the problem is on, when it is on one.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolsFile {
    #[serde(default)]
    tools: BTreeMap<String, toml::Spanned<Spec>>,
    /// Upstream MCP servers (reference §11), which `agent-kernel-upstream` reads.
    #[serde(default)]
    #[allow(dead_code)]
    mcp_servers: Option<toml::Value>,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
enum Effect {
    Mutating,
    ReadOnly,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum SettlementSpec {
    Compensate,
    Probe,
    Operator,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    description: Option<String>,
    effect: Effect,
    #[serde(default)]
    idempotent: bool,
    /// Required of a mutating tool; a read-only tool's outcome needs no settling.
    settlement: Option<SettlementSpec>,
    reversibility: Option<Reversibility>,
    undo_window: Option<String>,
    /// What a call touches (JSONPath over `{"args": …}`, a literal prefix allowed).
    #[serde(default)]
    resources: Vec<String>,
    /// What makes two calls one effect (reversibility `none` or `partial` only).
    #[serde(default)]
    duplicate_keys: Vec<String>,
    version: Option<String>,
    execute: Vec<String>,
    compensate: Option<Vec<String>>,
    probe: Option<Vec<String>>,
    timeout_ms: Option<u64>,
    #[serde(default)]
    env: Vec<String>,
    /// Folders its program may read under the second line (relative to the tools file).
    #[serde(default)]
    read: Vec<String>,
    /// Folders its program may read and write under the second line.
    #[serde(default)]
    write: Vec<String>,
    args_schema: Option<toml::Value>,
}

/// A tool that is a program (reference §7): each phase (`execute`, `compensate`, `probe`) is
/// one run of a program in the tools file's folder, with a JSON object on stdin, the
/// environment cleared but for `PATH` and the listed names, stdout bounded, and its whole
/// process group killed at its timeout.
#[derive(Debug, Clone)]
pub struct CommandTool {
    id: String,
    description: Option<String>,
    version: String,
    effect: EffectClass,
    idempotent: bool,
    settlement: Settlement,
    reversibility: Reversibility,
    undo_window: Option<UndoWindow>,
    resources: Vec<KeyTemplate>,
    duplicate_keys: Vec<KeyTemplate>,
    execute: Vec<String>,
    compensate: Option<Vec<String>>,
    probe: Option<Vec<String>>,
    timeout_ms: Option<u64>,
    env: Vec<String>,
    args_schema: Value,
    folder: PathBuf,
    output_bytes_max: u64,
    access: Arc<ProgramAccess>,
}

/// Loads the tools declared in the file at `path`: programs and their working folder
/// resolve against the file's folder; each run's output is bounded by `output_bytes_max`.
/// A tool may not take the id of one in `taken` (the built-in tools).
///
/// # Errors
///
/// A [`ToolsFileError`] naming the line: TOML syntax, an unknown key, a missing
/// `compensate` for a mutating tool (unless `reversibility = "none"`), a missing `probe`
/// for `settlement = "probe"`, an empty command, an id already taken, an invalid
/// `undo_window` or schema.
pub fn load_tools_file(
    path: &Path,
    output_bytes_max: u64,
    taken: &[&str],
) -> Result<Vec<CommandTool>, ToolsFileError> {
    let text = read_tools_file(path)?;
    parse_tools_file(path, &text, output_bytes_max, taken)
}

/// The text of the tools file at `path`, at most [`TOOLS_FILE_BYTES_MAX`] bytes: read once
/// by whoever loads both its command tools ([`parse_tools_file`]) and its upstream servers,
/// so that both come from the same version of the file.
///
/// # Errors
///
/// A [`ToolsFileError`] when it cannot be read, is not UTF-8, or is larger.
pub fn read_tools_file(path: &Path) -> Result<String, ToolsFileError> {
    std::fs::File::open(path)
        .map_err(|io| format!("cannot read it: {io}"))
        .and_then(|file| {
            read_text_bounded(file, TOOLS_FILE_BYTES_MAX).map_err(|error| error.to_string())
        })
        .map_err(|message| ToolsFileError {
            path: path.display().to_string(),
            line: None,
            message,
        })
}

/// The tools `text`, the content of the tools file at `path`, declares, as
/// [`load_tools_file`] loads them; `path` names the file in errors, and its folder is the
/// one programs resolve against.
///
/// # Errors
///
/// As [`load_tools_file`], but for reading the file.
pub fn parse_tools_file(
    path: &Path,
    text: &str,
    output_bytes_max: u64,
    taken: &[&str],
) -> Result<Vec<CommandTool>, ToolsFileError> {
    let shown = path.display().to_string();
    let error = |line: Option<usize>, message: String| ToolsFileError {
        path: shown.clone(),
        line,
        message,
    };
    if text.len() > TOOLS_FILE_BYTES_MAX {
        return Err(error(
            None,
            format!("it is more than {TOOLS_FILE_BYTES_MAX} bytes"),
        ));
    }
    let file: ToolsFile = toml::from_str(text).map_err(|parse| {
        let line = parse.span().map(|span| line_of(text, span.start));
        error(line, parse.message().to_owned())
    })?;
    if file.tools.len() > COMMAND_TOOLS_MAX {
        return Err(error(
            None,
            format!(
                "it declares {} tools; at most {COMMAND_TOOLS_MAX}",
                file.tools.len()
            ),
        ));
    }
    let folder = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let folder = std::fs::canonicalize(folder)
        .map_err(|io| error(None, format!("cannot resolve its folder: {io}")))?;
    let mut tools = Vec::with_capacity(file.tools.len());
    for (id, spanned) in file.tools {
        let line = Some(line_of(text, spanned.span().start));
        let spec = spanned.into_inner();
        let fail = |message: String| error(line, format!("tool `{id}`: {message}"));
        if id.is_empty() || id.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(fail("an id has no spaces or control characters".to_owned()));
        }
        if taken.contains(&id.as_str()) {
            return Err(fail("this id is a built-in tool's".to_owned()));
        }
        for (phase, command) in [
            ("execute", Some(&spec.execute)),
            ("compensate", spec.compensate.as_ref()),
            ("probe", spec.probe.as_ref()),
        ] {
            if command.is_some_and(Vec::is_empty) {
                return Err(fail(format!("`{phase}` names no program")));
            }
        }
        let reversibility = spec.reversibility.unwrap_or(Reversibility::Full);
        if spec.effect == Effect::Mutating
            && spec.compensate.is_none()
            && reversibility != Reversibility::None
        {
            return Err(fail(
                "a mutating tool needs `compensate` (or `reversibility = \"none\"`)".to_owned(),
            ));
        }
        let settlement = match (spec.effect, spec.settlement) {
            (_, Some(settlement)) => settlement,
            (Effect::ReadOnly, None) => SettlementSpec::Compensate,
            (Effect::Mutating, None) => {
                return Err(fail(
                    "a mutating tool needs `settlement` (\"compensate\", \"probe\" or \"operator\")"
                        .to_owned(),
                ));
            }
        };
        if settlement == SettlementSpec::Probe && spec.probe.is_none() {
            return Err(fail("`settlement = \"probe\"` needs `probe`".to_owned()));
        }
        let undo_window = match &spec.undo_window {
            None => None,
            Some(window) => Some(
                window
                    .parse::<UndoWindow>()
                    .map_err(|why| fail(format!("`undo_window`: {why}")))?,
            ),
        };
        let resources = parse_templates("resources", &spec.resources).map_err(&fail)?;
        if !resources.is_empty() && spec.effect == Effect::ReadOnly {
            return Err(fail(
                "`resources` is for mutating tools: a read-only call claims nothing".to_owned(),
            ));
        }
        let duplicate_keys =
            parse_templates("duplicate_keys", &spec.duplicate_keys).map_err(&fail)?;
        if !duplicate_keys.is_empty() && reversibility == Reversibility::Full {
            return Err(fail(
                "`duplicate_keys` is for tools of reversibility \"none\" or \"partial\"".to_owned(),
            ));
        }
        if let Some(timeout_ms) = spec.timeout_ms
            && !(1..=COMMAND_TIMEOUT_MS_MAX).contains(&timeout_ms)
        {
            return Err(fail(format!(
                "`timeout_ms = {timeout_ms}` is outside 1..={COMMAND_TIMEOUT_MS_MAX}"
            )));
        }
        let args_schema = match spec.args_schema {
            None => json!({ "type": "object" }),
            Some(schema) => serde_json::to_value(schema)
                .map_err(|json| fail(format!("`args_schema` is not a JSON Schema: {json}")))?,
        };
        if !args_schema.is_object() {
            return Err(fail("`args_schema` must be a table".to_owned()));
        }
        let commands: Vec<&[String]> = [
            Some(&spec.execute),
            spec.compensate.as_ref(),
            spec.probe.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(Vec::as_slice)
        .collect();
        let access = ProgramAccess::resolve(
            &folder,
            &commands,
            std::env::var_os("PATH").as_deref(),
            &spec.read,
            &spec.write,
        )
        .map_err(|error| fail(error.to_string()))?;
        tools.push(CommandTool {
            description: spec.description,
            version: spec.version.unwrap_or_else(|| "1".to_owned()),
            effect: match spec.effect {
                Effect::Mutating => EffectClass::Mutating,
                Effect::ReadOnly => EffectClass::ReadOnly,
            },
            idempotent: spec.idempotent,
            settlement: match settlement {
                SettlementSpec::Compensate => Settlement::Compensate,
                SettlementSpec::Probe => Settlement::Probe,
                SettlementSpec::Operator => Settlement::Operator,
            },
            reversibility,
            undo_window,
            resources,
            duplicate_keys,
            execute: spec.execute,
            compensate: spec.compensate,
            probe: spec.probe,
            timeout_ms: spec.timeout_ms,
            env: spec.env,
            args_schema,
            folder: folder.clone(),
            output_bytes_max,
            access: Arc::new(access),
            id,
        });
    }
    Ok(tools)
}

/// Kills a run's whole process group when dropped: the phase ended, timed out, or its
/// caller stopped waiting (the dispatcher's timeout drops the future).
struct GroupGuard(Option<rustix::process::Pid>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(group) = self.0 {
            // The group may be gone already: nothing to do then.
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
    }
}

/// Stops what a run left behind once its outcome is decided, or when the run is dropped
/// unfinished (its caller stopped waiting): every process carrying its tag.
struct Leftovers(Option<String>);

impl Leftovers {
    /// Stops them now, off the async runtime, and waits until they are gone.
    async fn stop(mut self) {
        if let Some(tag) = self.0.take() {
            let _ = tokio::task::spawn_blocking(move || stop_leftovers(&tag)).await;
        }
    }
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        // Dropped unfinished: stopped in the background, never on a runtime thread.
        if let Some(tag) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn_blocking(move || stop_leftovers(&tag));
        }
    }
}

/// Stops, and waits for, whatever this process's earlier runs of the step of `ctx` left
/// (an execute that timed out or was abandoned stops its leftovers only in the background):
/// a compensation or a probe looks at the world only once nothing of the step can act.
async fn stop_step_leftovers(ctx: &ToolContext) {
    let prefix = programs::run_tag_prefix(&format!("{}.{}.", ctx.saga_id, ctx.step_seq));
    let _ = tokio::task::spawn_blocking(move || stop_leftovers(&prefix)).await;
}

/// Stops the processes tagged `tag`, saying so when there were any.
fn stop_leftovers(tag: &str) {
    match programs::stop_tagged(tag) {
        Ok(stopped) if stopped.n_killed > 0 || stopped.n_left > 0 => {
            tracing::warn!(
                n_killed = stopped.n_killed,
                n_left = stopped.n_left,
                "a command tool's run left processes behind; they were stopped"
            );
        }
        Ok(_) => {}
        Err(error) => {
            tracing::warn!(%error, "cannot look for what a command tool's run left behind")
        }
    }
}

/// What one run of a phase came to.
struct Run {
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr_last_line: String,
}

impl CommandTool {
    /// The timeout it declares, in milliseconds (else the dispatcher's `[limits]`).
    pub fn timeout_ms(&self) -> Option<u64> {
        self.timeout_ms
    }

    /// Runs `command` for `phase` with the contract's stdin document, then stops whatever
    /// the run left behind (a child that left the process group with `setsid` included):
    /// the run's outcome is decided when this returns, and nothing of it may act later.
    async fn run(
        &self,
        phase: &str,
        command: &[String],
        ctx: &ToolContext,
        args: &Value,
        output: Option<&Value>,
    ) -> Result<Run, ToolError> {
        let tag = programs::new_run_tag(&format!("{}.{}.{phase}", ctx.saga_id, ctx.step_seq));
        let leftovers = Leftovers(Some(tag.clone()));
        let run = self
            .run_tagged(phase, command, ctx, args, output, &tag)
            .await;
        leftovers.stop().await;
        run
    }

    /// [`CommandTool::run`]'s work, its processes tagged with `tag`.
    async fn run_tagged(
        &self,
        phase: &str,
        command: &[String],
        ctx: &ToolContext,
        args: &Value,
        output: Option<&Value>,
        tag: &str,
    ) -> Result<Run, ToolError> {
        let input = json!({
            "phase": phase,
            "tool": self.id,
            "saga_id": ctx.saga_id.as_str(),
            "step": ctx.step_seq,
            "idempotency_key": ctx.idempotency_key,
            "args": args,
            "output": output,
        });
        let mut process = tokio::process::Command::new(&command[0]);
        process
            .args(&command[1..])
            .current_dir(&self.folder)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(path) = std::env::var_os("PATH") {
            process.env("PATH", path);
        }
        process.env(programs::RUN_TAG_VAR, tag);
        for name in &self.env {
            if let Some(value) = std::env::var_os(name) {
                process.env(name, value);
            }
        }
        let mut child = self.spawn(process).await.map_err(|error| {
            ToolError::failed(format!(
                "`{}` ({phase}): cannot start `{}`: {error}",
                self.id, command[0]
            ))
        })?;
        let _group = GroupGuard(
            child
                .id()
                .and_then(|pid| rustix::process::Pid::from_raw(pid.try_into().ok()?)),
        );
        let mut stdin = child.stdin.take().expect("stdin was piped");
        let mut stdout = child.stdout.take().expect("stdout was piped");
        let mut stderr = child.stderr.take().expect("stderr was piped");
        let output_max = self.output_bytes_max;
        let work = async {
            // A program that exits without reading its input is not an error here.
            let written = async {
                let _ = stdin.write_all(input.to_string().as_bytes()).await;
                drop(stdin);
            };
            // stdout up to its bound: past it, the run ends at once (its group is killed
            // when `run` returns), never blocked on a full pipe.
            let read_out = async {
                let mut out = Vec::new();
                (&mut stdout)
                    .take(output_max + 1)
                    .read_to_end(&mut out)
                    .await
                    .map_err(|error| {
                        ToolError::uncertain(format!(
                            "`{}` ({phase}): reading its output: {error}",
                            self.id
                        ))
                    })?;
                if out.len() as u64 > output_max {
                    return Err(ToolError::uncertain(format!(
                        "`{}` ({phase}): its output is over {output_max} bytes (max_io_bytes)",
                        self.id
                    )));
                }
                Ok(out)
            };
            // stderr drained to its end, keeping the last `COMMAND_STDERR_BYTES_MAX` bytes
            // (where its last line is), so a chatty program never blocks on it.
            let read_err = async {
                let mut tail = Vec::new();
                let mut chunk = [0_u8; 8192];
                loop {
                    match stderr.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n_read) => {
                            tail.extend_from_slice(&chunk[..n_read]);
                            if tail.len() > COMMAND_STDERR_BYTES_MAX {
                                let cut = tail.len() - COMMAND_STDERR_BYTES_MAX;
                                tail.drain(..cut);
                            }
                        }
                    }
                }
                Ok::<_, ToolError>(tail)
            };
            let written = async {
                written.await;
                Ok::<_, ToolError>(())
            };
            let ((), out, err) = tokio::try_join!(written, read_out, read_err)?;
            let status = child.wait().await.map_err(|error| {
                ToolError::uncertain(format!("`{}` ({phase}): waiting for it: {error}", self.id))
            })?;
            Ok::<_, ToolError>((status, out, err))
        };
        let (status, stdout, stderr) = match self.timeout_ms {
            Some(timeout_ms) => tokio::time::timeout(Duration::from_millis(timeout_ms), work)
                .await
                .map_err(|_| ToolError::timeout(timeout_ms))??,
            None => work.await?,
        };
        let stderr = String::from_utf8_lossy(&stderr);
        let stderr_last_line = stderr
            .lines()
            .rev()
            .find(|line| !line.trim().is_empty())
            .unwrap_or_default()
            .to_owned();
        Ok(Run {
            code: status.code(),
            stdout,
            stderr_last_line,
        })
    }

    /// Starts `process`: under the second line, from a thread confined to what this tool's
    /// program was declared with ([`agent_kernel_sandbox::launch`]).
    async fn spawn(
        &self,
        mut process: tokio::process::Command,
    ) -> Result<tokio::process::Child, String> {
        if !agent_kernel_sandbox::launcher_running() {
            return process.spawn().map_err(|error| error.to_string());
        }
        let runtime = tokio::runtime::Handle::current();
        let (answer, answered) = tokio::sync::oneshot::channel();
        let id = self.id.clone();
        agent_kernel_sandbox::launch(
            Arc::clone(&self.access),
            Box::new(
                move |confined: Result<(), agent_kernel_sandbox::SandboxError>| {
                    let started = confined
                    .map_err(|why| {
                        format!("the second line (Landlock) cannot give it what `{id}` declares: {why}")
                    })
                    .and_then(|()| {
                        let _runtime = runtime.enter();
                        process.spawn().map_err(|error| match error.kind() {
                            std::io::ErrorKind::PermissionDenied => format!(
                                "{error}; under the second line (Landlock) a program reaches only the policy's roots, the system folders and what its tool declares (the program, its interpreter and installation, the files on its command line): add the folder it needs to `read = [...]` of [tools.\"{id}\"]"
                            ),
                            _ => error.to_string(),
                        })
                    });
                    let _ = answer.send(started);
                },
            ),
        );
        answered
            .await
            .unwrap_or_else(|_| Err("the launcher dropped the run".to_owned()))
    }

    /// The error of a run that did not exit 0.
    fn run_failed(&self, phase: &str, run: &Run) -> ToolError {
        let why = if run.stderr_last_line.is_empty() {
            "no message on stderr".to_owned()
        } else {
            run.stderr_last_line.clone()
        };
        match run.code {
            Some(EXIT_RETRY) => ToolError::failed(format!(
                "`{}` ({phase}) exited {EXIT_RETRY}, may be retried: {why}",
                self.id
            ))
            .retriable(),
            Some(code) => {
                ToolError::failed(format!("`{}` ({phase}) exited {code}: {why}", self.id))
            }
            // Killed by a signal: whatever it did is unknown.
            None => ToolError::uncertain(format!(
                "`{}` ({phase}) was killed by a signal: {why}",
                self.id
            )),
        }
    }
}

impl CommandTool {
    /// The tool, ready for a registry. It is registered as compensating and probing
    /// whatever its file declares: without a `compensate` program its compensation stops
    /// what its step left running and then fails (its reversibility is `none`), and without a
    /// `probe` program its probe answers unknown (its settlement is not `probe`).
    pub fn into_entry(self) -> ToolEntry {
        ToolEntry::compensated_probed(self)
    }
}

impl Tool for CommandTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new(&self.id, self.effect)
            .with_version(&self.version)
            .with_idempotent(self.idempotent)
            .with_settlement(self.settlement)
            .with_schema(self.args_schema.clone())
            .with_description(self.description.as_deref().unwrap_or_default())
            .with_reversibility(self.reversibility)
            .with_undo_window(self.undo_window)
            .with_resources(self.resources.clone())
            .with_duplicate_keys(self.duplicate_keys.clone())
    }

    async fn execute(&self, ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let run = self.run("execute", &self.execute, ctx, args, None).await?;
        if run.code != Some(0) {
            return Err(self.run_failed("execute", &run));
        }
        if run.stdout.iter().all(u8::is_ascii_whitespace) {
            return Ok(ToolOutput::new(Value::Null));
        }
        let output: Value = serde_json::from_slice(&run.stdout).map_err(|error| {
            // It exited 0, so its effect happened; only its answer is unreadable.
            ToolError::uncertain(format!(
                "`{}` (execute) exited 0 but its stdout is not one JSON value: {error}",
                self.id
            ))
        })?;
        Ok(ToolOutput::new(output))
    }
}

impl Compensate for CommandTool {
    fn restores(
        &self,
        _args: &Value,
        _undo: &Undo,
        _output: Option<&ToolOutput>,
    ) -> Option<String> {
        let program = self.compensate.as_ref()?;
        Some(format!(
            "runs its `compensate` program ({}) with the step's arguments and output",
            program.join(" ")
        ))
    }

    async fn prepare(&self, _ctx: &ToolContext, _args: &Value) -> Result<Undo, ToolError> {
        // The program's compensation works from the arguments and the output, which the log
        // keeps: nothing else to capture.
        Ok(Undo::none())
    }

    async fn compensate(
        &self,
        ctx: &ToolContext,
        args: &Value,
        _undo: &Undo,
        output: Option<&ToolOutput>,
    ) -> Result<(), ToolError> {
        stop_step_leftovers(ctx).await;
        let Some(command) = &self.compensate else {
            return Err(ToolError::failed(format!(
                "`{}` declares no compensation (reversibility none)",
                self.id
            )));
        };
        let output = output.map(|output| &output.data);
        let run = self.run("compensate", command, ctx, args, output).await?;
        if run.code == Some(0) {
            Ok(())
        } else {
            Err(self.run_failed("compensate", &run))
        }
    }
}

impl Probe for CommandTool {
    async fn probe(
        &self,
        ctx: &ToolContext,
        args: &Value,
        _undo: &Undo,
    ) -> Result<ProbeOutcome, ToolError> {
        stop_step_leftovers(ctx).await;
        let Some(command) = &self.probe else {
            return Ok(ProbeOutcome::Unknown);
        };
        let run = self.run("probe", command, ctx, args, None).await?;
        if run.code != Some(0) {
            return Ok(ProbeOutcome::Unknown);
        }
        let answer: Value = serde_json::from_slice(&run.stdout).unwrap_or(Value::Null);
        Ok(match answer.get("happened").and_then(Value::as_bool) {
            Some(true) => ProbeOutcome::Happened(None),
            Some(false) => ProbeOutcome::NotHappened,
            None => ProbeOutcome::Unknown,
        })
    }
}
