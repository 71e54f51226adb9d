//! The two ways a scenario's calls are made: through the kernel (a live saga of
//! `agent-kernel-core`, the binary's `recover`, `approve` and `reject` as an operator runs
//! them), and as the baseline (the same tool objects, called directly in the same order, as
//! an agent loop without a kernel calls its tools).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agent_kernel::{BeginOptions, CallAnswer, Kernel, KernelBuilder};
use agent_kernel_api::{ApprovalRequest, Durability, ObservedLog, SagaId, ToolContext};
use agent_kernel_fsm::Guardrail;
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::http::Servers;
use crate::kill_switch::{KillSwitch, die};
use crate::scenario::{Call, Decision, KillPoint, SLOW_EFFECT_MS, Scenario};

/// The kernel's log, relative to a side's folder.
pub(crate) const DB: &str = "state/kernel.db";

/// What the harness needs to run a side.
#[derive(Debug, Clone)]
pub(crate) struct Env {
    /// The `agent-kernel` binary (operator commands, the upstream server).
    pub(crate) bin: PathBuf,
    /// This program, run again as a child that can be killed.
    pub(crate) self_exe: PathBuf,
    /// The HTTP servers on loopback.
    pub(crate) servers: Servers,
}

/// What one side did, as the judge needs it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Run {
    /// The outputs of the calls that returned one, serialized.
    pub(crate) outputs: Vec<String>,
    /// How long each call took, in microseconds (operator waits left out).
    pub(crate) latencies_us: Vec<u64>,
    /// The final states of the kernel's sagas.
    pub(crate) states: Vec<String>,
    /// What happened, for a person.
    pub(crate) notes: Vec<String>,
    /// Checks of the kernel's own promises that failed (`recover`'s exit, `audit verify`).
    pub(crate) broken: Vec<String>,
    /// The agents (of [`crate::scenario::Drive::Agents`]) whose work took effect as a
    /// whole, in the order they finished: through the kernel, their saga ended `Done`; as
    /// the baseline, every call of theirs returned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) committed: Vec<usize>,
}

impl Run {
    pub(crate) fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }
}

/// The side a child runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Side {
    /// Through the kernel.
    Kernel,
    /// The tools called directly.
    Baseline,
}

/// The kernel's policy: the workspace only, `localhost` on the allowed server's port only.
pub(crate) fn kernel_policy(scenario: &Scenario, servers: &Servers) -> String {
    format!(
        "[fs]\nallow = [\"ws\"]\n\n[http]\nallow_domains = [\"localhost\"]\nallow_ports = [{}]\n\n{}",
        servers.allowed, scenario.policy_extra
    )
}

/// The baseline's tools need a policy to be built: one that lets everything through, as no
/// policy at all would (every file under `/`, every loopback name the scenarios use, any port).
pub(crate) const BASELINE_POLICY: &str = "[fs]\nallow = [\"/\"]\n\n[http]\nallow_domains = [\"localhost\", \"127.0.0.1\", \"127.0.0.2\"]\n";

/// Writes a side's configuration under `root`: `sandbox.toml`, and for an upstream
/// scenario the tools file naming the upstream server (another `agent-kernel mcp`, confined
/// to `up/ws`, with a drill tool that kills it mid-call) and that server's own files.
///
/// # Errors
///
/// When a file cannot be written.
pub(crate) fn configure(root: &Path, scenario: &Scenario, side: Side, env: &Env) -> Result<()> {
    std::fs::create_dir_all(root.join("state"))?;
    let policy = match side {
        Side::Kernel => kernel_policy(scenario, &env.servers),
        Side::Baseline => BASELINE_POLICY.to_owned(),
    };
    std::fs::write(root.join("sandbox.toml"), policy)?;
    if scenario.upstream {
        let tools = format!(
            r#"[mcp_servers.files]
command = [{bin:?}, "--db", "up/up.db", "--sandbox", "up/sandbox.toml", "--tools", "up/tools.toml", "-q", "mcp"]

[mcp_servers.files.tool.fs_write]
effect = "mutating"
reversibility = "full"
compensate = {{ tool = "fs_delete", args = {{ args = {{ path = "$.args.args.path" }} }} }}

[mcp_servers.files.tool.drill_die]
effect = "read-only"
"#,
            bin = env.bin.display().to_string()
        );
        std::fs::write(root.join("tools.toml"), tools)?;
        std::fs::write(root.join("up/sandbox.toml"), "[fs]\nallow = [\"ws\"]\n")?;
        std::fs::write(
            root.join("up/tools.toml"),
            r#"[tools."drill.die"]
description = "Kills the MCP server it runs under: an upstream server dying mid-call"
effect = "read-only"
settlement = "compensate"
execute = ["sh", "-c", "kill -9 $PPID"]
"#,
        )?;
    }
    if scenario.commands {
        std::fs::write(root.join("tools.toml"), COMMAND_TOOLS)?;
        std::fs::write(root.join("accounts.sh"), ACCOUNTS_SH)?;
        std::fs::create_dir_all(root.join("undo"))?;
        std::fs::write(root.join("shop.sh"), SHOP_SH)?;
        std::fs::write(
            root.join("slow_append.sh"),
            SLOW_APPEND_SH.replace("@DELAY@", &format!("{:.3}", SLOW_EFFECT_MS as f64 / 1000.0)),
        )?;
    }
    Ok(())
}

/// The command tools of the scenarios that have them: the slow append, the accounts two
/// agents share, and the payments an agent may regenerate.
const COMMAND_TOOLS: &str = r#"[tools."drill.slow_append"]
description = "Appends a line to a file some time after it starts; with die, first SIGKILLs the process that ran it"
effect = "mutating"
settlement = "compensate"
execute = ["sh", "slow_append.sh", "execute"]
compensate = ["sh", "slow_append.sh", "compensate"]
args_schema = { type = "object", required = ["path", "line"], properties = { path = { type = "string" }, line = { type = "string" }, die = { type = "boolean" } } }

[tools."acct.get"]
description = "Reads an account's balance"
effect = "read-only"
execute = ["sh", "accounts.sh", "get"]
args_schema = { type = "object", required = ["account"], properties = { account = { type = "string" } } }

[tools."acct.set"]
description = "Sets an account's balance"
effect = "mutating"
settlement = "compensate"
execute = ["sh", "accounts.sh", "set"]
compensate = ["sh", "accounts.sh", "compensate"]
write = ["ws", "undo"]
resources = ["acct:$.args.account"]
args_schema = { type = "object", required = ["account", "balance"], properties = { account = { type = "string" }, balance = { type = "integer" } } }

[tools."shop.charge"]
description = "Charges an invoice; its compensation refunds it"
effect = "mutating"
settlement = "compensate"
reversibility = "partial"
execute = ["sh", "shop.sh", "pay"]
compensate = ["sh", "shop.sh", "refund"]
resources = ["invoice:$.args.invoice"]
duplicate_keys = ["invoice:$.args.invoice"]

[tools."shop.pay"]
description = "Pays an invoice, for good"
effect = "mutating"
settlement = "operator"
reversibility = "none"
execute = ["sh", "shop.sh", "pay"]
resources = ["invoice:$.args.invoice"]
duplicate_keys = ["invoice:$.args.invoice"]
"#;

/// The accounts' program: `get` prints an account's balance; `set` keeps the balance it
/// replaces under `undo/` (before it writes), then writes the new one; `compensate` puts
/// the kept balance back when the account still holds what the step set (nothing when the
/// step never wrote; a failure, never a clobber, when it changed since).
const ACCOUNTS_SH: &str = r#"input=$(cat)
str() { printf '%s' "$input" | sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p"; }
num() { printf '%s' "$input" | sed -n "s/.*\"args\":{[^}]*\"$1\":\(-\{0,1\}[0-9][0-9]*\).*/\1/p"; }
account=$(str account)
file="ws/accounts/$account"
undo="undo/$(str saga_id)-$(printf '%s' "$input" | sed -n 's/.*"step":\([0-9][0-9]*\).*/\1/p')"
case "$1" in
get)
    printf '{"account":"%s","balance":%s}\n' "$account" "$(cat "$file")"
    ;;
set)
    balance=$(num balance)
    cat "$file" > "$undo.tmp" && mv "$undo.tmp" "$undo"
    printf '%s\n' "$balance" > "$file"
    printf '{"account":"%s","previous":%s,"balance":%s}\n' "$account" "$(cat "$undo")" "$balance"
    ;;
compensate)
    [ -f "$undo" ] || exit 0
    balance=$(num balance)
    if [ "$(cat "$file")" != "$balance" ]; then
        echo "the balance of $account changed since the step set it" >&2
        exit 1
    fi
    cat "$undo" > "$file"
    rm -f "$undo"
    ;;
esac
"#;

/// The shop's program: `pay` appends the payment's line to `ws/payments.txt`; `refund`
/// removes one such line (nothing when there is none).
const SHOP_SH: &str = r#"input=$(cat)
field() { printf '%s' "$input" | sed -n "s/.*\"args\":{[^}]*\"$1\":\"\{0,1\}\([^\",}]*\).*/\1/p"; }
line="paid invoice=$(field invoice) amount=$(field amount) memo=$(field memo)"
case "$1" in
pay)
    printf '%s\n' "$line" >> ws/payments.txt
    printf '{"paid":"%s"}\n' "$(field invoice)"
    ;;
refund)
    [ -f ws/payments.txt ] || exit 0
    awk -v paid="$line" '!gone && $0 == paid { gone = 1; next } { print }' ws/payments.txt > ws/payments.undo
    mv ws/payments.undo ws/payments.txt
    ;;
esac
"#;

/// Its program: `execute` (SIGKILLs its parent first when `die` is set) waits, then appends
/// the line; `compensate` removes the line wherever it is (nothing when it is not there).
/// Arguments are read from the JSON on stdin with `sed`: the scenarios' paths and lines
/// hold no quotes.
const SLOW_APPEND_SH: &str = r#"input=$(cat)
field() { printf '%s' "$input" | sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p"; }
path=$(field path)
line=$(field line)
case "$1" in
execute)
    case "$input" in *'"die":true'*) kill -9 "$PPID" ;; esac
    sleep @DELAY@
    printf '%s\n' "$line" >> "$path"
    ;;
compensate)
    [ -f "$path" ] || exit 0
    { grep -vxF "$line" "$path" || true; } > "$path.undo"
    mv "$path.undo" "$path"
    ;;
esac
"#;

/// The calls with `@ROOT@`, `@ALLOWED@` and `@INTERNAL@` replaced in every string.
pub(crate) fn resolve(calls: &[Call], root: &Path, servers: &Servers) -> Vec<Call> {
    fn walk(value: &mut Value, root: &str, servers: &Servers) {
        match value {
            Value::String(text) => {
                *text = text
                    .replace("@ROOT@", root)
                    .replace("@ALLOWED@", &servers.allowed.to_string())
                    .replace("@INTERNAL@", &servers.internal.to_string());
            }
            Value::Array(items) => items.iter_mut().for_each(|item| walk(item, root, servers)),
            Value::Object(map) => map.values_mut().for_each(|item| walk(item, root, servers)),
            _ => {}
        }
    }
    let root = root.display().to_string();
    calls
        .iter()
        .map(|call| {
            let mut call = call.clone();
            walk(&mut call.args, &root, servers);
            call
        })
        .collect()
}

/// The kernel of a side's folder: its log, its `sandbox.toml`, the built-in table, the
/// built-in and drill tools (and those of `tools.toml` when `tools_file`), the log
/// observed by a [`KillSwitch`] when `kill` is given.
///
/// # Errors
///
/// When the kernel cannot be built.
pub(crate) fn build_kernel(
    root: &Path,
    tools_file: bool,
    kill: Option<(Option<KillPoint>, Arc<AtomicU32>)>,
) -> Result<Arc<Kernel>> {
    let mut builder = KernelBuilder::new()
        .db(root.join(DB))
        .sandbox_file(root.join("sandbox.toml"))
        .fsm(Guardrail::builtin())
        .with_drill_tools()
        .cwd(root);
    builder = if tools_file {
        builder.tools_file(root.join("tools.toml"))
    } else {
        builder.without_tools_file()
    };
    if let Some((point, writes)) = kill {
        builder = builder.wrap_log(move |inner| {
            Arc::new(ObservedLog::new(inner, KillSwitch::new(point, writes)))
        });
    }
    builder.build().context("building the kernel")
}

/// How the kernel's side treats a call it refuses (bad input, a key already used in this
/// saga): give up and abort the saga, or go on with the next call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnRefused {
    Abort,
    GoOn,
}

/// The operator of an approval scenario.
#[derive(Debug, Clone)]
pub(crate) struct Operator {
    pub(crate) root: PathBuf,
    pub(crate) bin: PathBuf,
    pub(crate) decision: Decision,
    /// Where `SwapArgs` points the approved call instead.
    pub(crate) swapped_args: Option<Value>,
}

impl Operator {
    /// The operator of the log in `root`, running `bin`, who answers with `decision`
    /// (`SwapArgs` aims the approved call at `ws/other-precious.txt`).
    pub(crate) fn new(root: &Path, bin: &Path, decision: Decision) -> Operator {
        Operator {
            root: root.to_path_buf(),
            bin: bin.to_path_buf(),
            decision,
            swapped_args: (decision == Decision::SwapArgs)
                .then(|| serde_json::json!({ "path": "ws/other-precious.txt" })),
        }
    }

    async fn answer(&self, request: &ApprovalRequest, run: &mut Run) -> Result<()> {
        let id = request.approval_id.clone();
        match self.decision {
            Decision::Approve => {
                self.cli(&["approve", &id, "--note", "eval: approved"])
                    .await?
            }
            Decision::Reject => {
                self.cli(&["reject", &id, "--reason", "eval: rejected"])
                    .await?
            }
            Decision::Expire => {
                let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
                let wait = u128::try_from(request.expires_at_ms)?.saturating_sub(now) + 20;
                tokio::time::sleep(Duration::from_millis(u64::try_from(wait)?)).await;
            }
            Decision::Forge => {
                self.edit(
                    "UPDATE approvals SET status = 'approved', decided_by = 'forger', \
                     decided_at_ms = requested_at_ms WHERE approval_id = ?1",
                    &id,
                    None,
                )
                .await?;
            }
            Decision::Inspect => {
                let shown = cli_json(&self.bin, &self.root, &["approvals", "--show", &id]).await?;
                let text = shown["args_shown"].as_str().context("args_shown")?;
                let hides = shown["args_warnings"]
                    .as_array()
                    .is_none_or(|warnings| !warnings.is_empty());
                if text.contains("/../") || hides {
                    run.note(format!("operator: the view shows {text}; rejected"));
                    self.cli(&["reject", &id, "--reason", "eval: looks wrong"])
                        .await?;
                } else {
                    self.cli(&["approve", &id, "--note", "eval: looks right"])
                        .await?;
                }
            }
            Decision::Duplicate => {
                let shown = cli_json(&self.bin, &self.root, &["approvals", "--show", &id]).await?;
                let earlier = &shown["duplicate_of"];
                let stands = earlier["status"]
                    .as_str()
                    .is_some_and(|status| matches!(status, "COMMIT" | "BEGIN"));
                if stands {
                    run.note(format!(
                        "operator: it repeats saga {}'s call, whose effect stands ({}); rejected",
                        earlier["saga_id"].as_str().unwrap_or("?"),
                        earlier["args_shown"].as_str().unwrap_or("?")
                    ));
                    self.cli(&["reject", &id, "--reason", "eval: a duplicate"])
                        .await?;
                } else {
                    run.note("operator: no earlier call whose effect stands; approved");
                    self.cli(&["approve", &id, "--note", "eval: no duplicate"])
                        .await?;
                }
            }
            Decision::SwapArgs => {
                self.cli(&["approve", &id, "--note", "eval: approved"])
                    .await?;
                let args = self.swapped_args.clone().context("swapped args")?;
                self.edit(
                    "UPDATE approvals SET args = ?2 WHERE approval_id = ?1",
                    &id,
                    Some(args.to_string()),
                )
                .await?;
            }
        }
        run.note(format!("operator: {:?} {id}", self.decision));
        Ok(())
    }

    async fn cli(&self, args: &[&str]) -> Result<()> {
        let code = cli(&self.bin, &self.root, args).await?;
        if code != 0 {
            bail!("agent-kernel {} exited {code}", args.join(" "));
        }
        Ok(())
    }

    async fn edit(&self, sql: &'static str, id: &str, value: Option<String>) -> Result<()> {
        let path = self.root.join(DB);
        let id = id.to_owned();
        tokio::task::spawn_blocking(move || -> Result<()> {
            let db = rusqlite::Connection::open(path)?;
            match value {
                Some(value) => db.execute(sql, rusqlite::params![id, value])?,
                None => db.execute(sql, rusqlite::params![id])?,
            };
            Ok(())
        })
        .await?
    }
}

/// `agent-kernel --db DB -q ARGS` in `root`, without the environment variables that would
/// change what it does, reading nothing.
fn kernel_command(bin: &Path, root: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(bin);
    command
        .current_dir(root)
        .args(["--db", DB, "-q"])
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    for var in [
        "AGENT_KERNEL_DB",
        "AGENT_KERNEL_AUDIT_KEY",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ] {
        command.env_remove(var);
    }
    command
}

/// Runs `agent-kernel --db DB -q ARGS` in `root`; returns its exit code.
///
/// # Errors
///
/// When it cannot be started or is killed.
pub(crate) async fn cli(bin: &Path, root: &Path, args: &[&str]) -> Result<i32> {
    let mut command = kernel_command(bin, root, args);
    command.stdout(Stdio::null());
    let status = tokio::task::spawn_blocking(move || command.status()).await??;
    status
        .code()
        .with_context(|| format!("agent-kernel {} was killed", args.join(" ")))
}

/// `agent-kernel recover` in `root`, as an operator runs it after a crash: noted, and a
/// broken promise unless it exits 0 or 3 (a step left to an operator); its exit code.
///
/// # Errors
///
/// When it cannot be started or is killed.
pub(crate) async fn recover(bin: &Path, root: &Path, run: &mut Run) -> Result<i32> {
    let code = cli(bin, root, &["recover"]).await?;
    run.note(format!("agent-kernel recover exited {code}"));
    if code != 0 && code != 3 {
        run.broken
            .push(format!("agent-kernel recover exited {code}"));
    }
    Ok(code)
}

/// Runs `agent-kernel --db DB -q ARGS --json` in `root`; returns the document it prints.
///
/// # Errors
///
/// When it cannot be started, exits other than 0, or prints no JSON document.
pub(crate) async fn cli_json(bin: &Path, root: &Path, args: &[&str]) -> Result<Value> {
    let mut command = kernel_command(bin, root, args);
    command.arg("--json");
    let output = tokio::task::spawn_blocking(move || command.output()).await??;
    if !output.status.success() {
        bail!(
            "agent-kernel {} exited {:?}",
            args.join(" "),
            output.status.code()
        );
    }
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// Drives `calls` as one live saga of `kernel`, committing after the last; a call the
/// kernel rolls the saga back on ends the chain.
///
/// # Errors
///
/// When the kernel fails (not a tool: the log, a closed saga) or the operator cannot act.
pub(crate) async fn kernel_chain(
    kernel: &Arc<Kernel>,
    name: &str,
    calls: &[Call],
    on_refused: OnRefused,
    operator: Option<&Operator>,
    run: &mut Run,
) -> Result<()> {
    let saga = kernel
        .begin(BeginOptions {
            name: Some(name.to_owned()),
            actor: None,
            ..BeginOptions::default()
        })
        .await?;
    for (index, call) in calls.iter().enumerate() {
        let started = Instant::now();
        let mut answer = saga
            .call(&call.tool, call.args.clone(), call.key.clone())
            .await?;
        run.latencies_us.push(micros(started));
        while let CallAnswer::AwaitingApproval(request) = &answer {
            let operator = operator.context("a step waits for an approval nobody gives")?;
            operator.answer(request, run).await?;
            let started = Instant::now();
            answer = saga.resume().await?;
            run.latencies_us.push(micros(started));
        }
        match answer {
            CallAnswer::Committed(step) => {
                run.outputs.push(serde_json::to_string(&step.output)?);
                if step.reused {
                    run.note(format!("call {index}: reused by its key"));
                }
            }
            CallAnswer::Refused(problem) => {
                run.note(format!("call {index} refused: {}", problem.message));
                if on_refused == OnRefused::Abort {
                    let report = saga.abort("the agent gives up").await?;
                    run.states.push(format!("{:?}", report.state));
                    return Ok(());
                }
            }
            CallAnswer::Denied(report) | CallAnswer::Failed(report) => {
                let why = report
                    .failure
                    .as_ref()
                    .map_or_else(String::new, |failure| failure.error.to_string());
                run.note(format!("call {index} ended the saga: {why}"));
                run.states.push(format!("{:?}", report.state));
                return Ok(());
            }
            other => bail!("an answer the suite does not know: {other:?}"),
        }
    }
    let report = saga.commit().await?;
    run.states.push(format!("{:?}", report.state));
    Ok(())
}

/// Calls `calls` on the tools of `kernel` directly, in order, as an agent loop without a
/// kernel does: no policy, no log, no compensation; it stops at the first error. With
/// `timeout`, each call is abandoned after it (the agent's own timeout). With
/// `kill_after`, the process SIGKILLs itself once that many calls have returned.
///
/// # Errors
///
/// Never for a tool's failure (that is noted); only for an output that cannot be
/// serialized.
pub(crate) async fn baseline_chain(
    kernel: &Arc<Kernel>,
    name: &str,
    calls: &[Call],
    timeout: Option<Duration>,
    kill_after: Option<u32>,
    run: &mut Run,
) -> Result<()> {
    // The tools of an upstream server exist once it has been asked for them.
    kernel.load_all_tools().await;
    for (index, call) in calls.iter().enumerate() {
        if kill_after == Some(u32::try_from(index)?) {
            die();
        }
        // A baseline without the tool would change nothing and pass for it: a fault of the
        // suite, never a result.
        let Some(tool) = kernel.tool(&call.tool) else {
            bail!("call {index}: the baseline has no tool {}", call.tool);
        };
        let ctx = direct_context(name, index, call)?;
        let started = Instant::now();
        // On a task of its own, so that a tool that panics fails its call (as an agent
        // loop that catches exceptions sees it) instead of ending the suite.
        let (tool, args) = (tool, call.args.clone());
        let task = tokio::spawn(async move { tool.execute(&ctx, &args).await });
        let joined = match timeout {
            Some(timeout) => {
                let abort = task.abort_handle();
                match tokio::time::timeout(timeout, task).await {
                    Ok(joined) => joined,
                    Err(_) => {
                        abort.abort();
                        run.latencies_us.push(micros(started));
                        run.note(format!("call {index} timed out; the agent gives up"));
                        return Ok(());
                    }
                }
            }
            None => task.await,
        };
        run.latencies_us.push(micros(started));
        match joined {
            Ok(Ok(output)) => run.outputs.push(serde_json::to_string(&output)?),
            Ok(Err(error)) => {
                run.note(format!("call {index} failed: {error}"));
                return Ok(());
            }
            Err(panic) => {
                run.note(format!("call {index} panicked: {panic}"));
                return Ok(());
            }
        }
    }
    if kill_after == Some(u32::try_from(calls.len())?) {
        die();
    }
    Ok(())
}

/// The context of a call the baseline makes directly: step `index` of a saga named `saga`,
/// with no file access of the kernel's.
///
/// # Errors
///
/// When the index does not fit a step number.
pub(crate) fn direct_context(saga: &str, index: usize, call: &Call) -> Result<ToolContext> {
    Ok(ToolContext {
        saga_id: SagaId::new(saga),
        step_seq: u32::try_from(index)?,
        tool_id: call.tool.clone(),
        idempotency_key: call.key.clone(),
        actor: None,
        durability: Durability::Full,
        files: Arc::new(agent_kernel::NoFiles::new(".")),
    })
}

/// Microseconds since `started`.
pub(crate) fn micros(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX)
}
