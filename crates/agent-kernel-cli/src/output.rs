//! Everything the command prints: human tables or exactly one JSON document on stdout.

use agent_kernel::{RecoveryAction, RecoveryReport, SagaReport};
use agent_kernel_api::SagaRecord;
use comfy_table::{ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
use serde_json::{Value, json};

use crate::FsmFormat;
use crate::bench::BenchReport;
use agent_kernel_fsm::Guardrail;

/// The table as one JSON document.
fn fsm_document(fsm: &Guardrail) -> Value {
    let transitions: Vec<Value> = fsm
        .transitions()
        .iter()
        .map(|row| {
            json!({
                "from": row.from,
                "event": row.event.as_str(),
                "to": row.to,
                "guard": row.guard.map(|guard| guard.as_str()),
            })
        })
        .collect();
    let terminal: Vec<_> = agent_kernel_api::SagaState::ALL
        .into_iter()
        .filter(|state| state.is_terminal())
        .collect();
    json!({ "initial": "Idle", "terminal": terminal, "transitions": transitions })
}

/// Where and how results are printed.
pub(crate) struct Output {
    json: bool,
}

pub(crate) fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header.iter().copied());
    table
}

/// Prints one JSON document on stdout.
pub(crate) fn print_json(document: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(document).expect("a JSON value always serializes")
    );
}

/// `text` with every control character escaped (`\n`, `\u{1b}`, …), fit for a terminal.
pub(crate) fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A time as `2026-12-01 14:38:05Z`, for tables.
pub(crate) fn format_ms(at_ms: i64) -> String {
    let rfc3339 = agent_kernel_api::format_rfc3339_ms(at_ms);
    format!("{} {}Z", &rfc3339[..10], &rfc3339[11..19])
}

impl Output {
    pub(crate) fn new(json: bool) -> Self {
        Self { json }
    }

    /// Whether results are one JSON document.
    pub(crate) fn is_json(&self) -> bool {
        self.json
    }

    /// Reports an error: always on stderr; with `--json`, also as the one document on stdout.
    pub(crate) fn error(&self, kind: &str, error: &anyhow::Error) {
        // Messages quote plans and files: line breaks are kept, other control characters
        // are escaped.
        let message = format!("{error:#}");
        let shown: Vec<String> = message.split('\n').map(printable).collect();
        eprintln!("error: {}", shown.join("\n"));
        if self.json {
            let mut document =
                json!({ "error": { "kind": kind, "message": format!("{error:#}") } });
            if let Some(table) = error.downcast_ref::<agent_kernel_fsm::TableError>() {
                document["error"]["problems"] = table
                    .problems
                    .iter()
                    .map(|problem| json!({ "line": problem.line, "message": problem.message }))
                    .collect();
            }
            if let Some(agent_kernel::KernelError::Preflight(problems)) =
                error.downcast_ref::<agent_kernel::KernelError>()
            {
                document["error"]["problems"] = problems
                    .iter()
                    .map(|problem| {
                        json!({
                            "step": problem.step_idx,
                            "tool": problem.tool,
                            "kind": format!("{:?}", problem.kind),
                            "message": problem.message,
                        })
                    })
                    .collect();
            }
            print_json(&document);
        }
    }

    /// A command-line usage error, as the one JSON document on stdout.
    pub(crate) fn usage_error(&self, kind: &str, message: &str) {
        if self.json {
            print_json(
                &json!({ "error": { "kind": "usage", "detail": kind, "message": message.trim() } }),
            );
        }
    }

    /// The outcome of `run` or `rollback`.
    pub(crate) fn saga(&self, report: &SagaReport) {
        if self.json {
            print_json(&serde_json::to_value(report).expect("reports serialize"));
            return;
        }
        let mut steps = table(&["seq", "tool", "status", "detail"]);
        for step in &report.steps {
            let detail = match (&step.error, &step.compensation) {
                (Some(error), Some(compensation)) => format!("{error}; {compensation}"),
                (Some(error), None) => error.clone(),
                (None, Some(compensation)) => compensation.clone(),
                (None, None) if step.reused => "output reused by idempotency key".into(),
                (None, None) => String::new(),
            };
            steps.add_row(vec![
                step.seq.to_string(),
                printable(&step.tool),
                step.status.to_string(),
                printable(&detail),
            ]);
        }
        println!("{steps}");
        if report.dry_run {
            println!(
                "saga {} is a dry run (recorded as one): nothing was executed; a run would end {}",
                report.saga_id, report.state
            );
            if let Some(failure) = &report.failure {
                println!(
                    "step {} ({}) would fail: {}",
                    failure.step_seq,
                    failure.tool,
                    why_failed(&failure.error)
                );
            }
            return;
        }
        println!("saga {}: {}", report.saga_id, report.state);
        if let Some(failure) = &report.failure {
            println!(
                "step {} ({}) failed: {}",
                failure.step_seq,
                failure.tool,
                why_failed(&failure.error)
            );
        }
    }

    /// `log --saga ID`.
    pub(crate) fn saga_record(&self, record: &SagaRecord) {
        let saga = &record.saga;
        if self.json {
            print_json(&saga_record_document(record));
            return;
        }
        println!("saga    {}", printable(saga.saga_id.as_str()));
        println!("state   {}", saga.state);
        if saga.dry_run {
            println!("mode    dry run: every step was simulated, nothing ran");
        } else if saga.n_steps == 0 {
            println!("mode    live: its steps were called one at a time");
        }
        if let Some(name) = &saga.name {
            println!("name    {}", printable(name));
        }
        if let Some(actor) = &saga.actor {
            println!("actor   {}", printable(actor));
        }
        println!(
            "owner   pid {} on {}",
            saga.owner.pid,
            if saga.owner.host.is_empty() {
                "?"
            } else {
                &saga.owner.host
            }
        );
        println!("created {}", format_ms(saga.created_at_ms));
        println!("updated {}", format_ms(saga.updated_at_ms));
        let mut steps = table(&["seq", "tool", "status", "key", "detail"]);
        for step in &record.steps {
            let detail = [
                step.error.as_ref().map(ToString::to_string),
                step.compensation.clone(),
                step.reused_from
                    .as_ref()
                    .map(|(saga, seq)| format!("reused from saga {saga} step {seq}")),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join("; ");
            steps.add_row(vec![
                step.step_seq.to_string(),
                printable(&step.tool_id),
                step.status.to_string(),
                printable(step.idempotency_key.as_deref().unwrap_or_default()),
                printable(&detail),
            ]);
        }
        println!("{steps}");
        if !record.locks.is_empty() {
            println!(
                "holds   {} lock(s) until it is settled:",
                record.locks.len()
            );
            for resource in &record.locks {
                println!("  {}", printable(resource));
            }
        }
        for conflict in &record.conflicts {
            println!(
                "conflict at {}: step {} (`{}`) was refused `{}`, held by saga {} ({})",
                format_ms(conflict.at_ms),
                conflict.step_seq,
                printable(&conflict.tool_id),
                printable(&conflict.resource),
                conflict.holder_saga_id,
                conflict.holder_state
            );
        }
    }

    /// `log`: each saga with the steps its plan has, or, for a live saga (no plan), the
    /// steps it began.
    pub(crate) fn saga_list(&self, sagas: &[agent_kernel_api::SagaListing]) {
        if self.json {
            let sagas: Vec<Value> = sagas
                .iter()
                .map(|listing| {
                    let saga = &listing.saga;
                    json!({
                        "saga_id": saga.saga_id,
                        "state": saga.state,
                        "name": saga.name,
                        "actor": saga.actor,
                        "n_steps": saga.n_steps,
                        "steps_begun": listing.n_begun,
                        "dry_run": saga.dry_run,
                        "created_at_ms": saga.created_at_ms,
                        "updated_at_ms": saga.updated_at_ms,
                    })
                })
                .collect();
            print_json(&json!({ "sagas": sagas }));
            return;
        }
        if sagas.is_empty() {
            println!("no sagas in the log");
            return;
        }
        let mut list = table(&["saga", "state", "steps", "name", "created"]);
        for listing in sagas {
            let saga = &listing.saga;
            let state = if saga.dry_run {
                format!("{} (dry run)", saga.state)
            } else {
                saga.state.to_string()
            };
            list.add_row(vec![
                printable(saga.saga_id.as_str()),
                state,
                // A live saga has no plan: its steps arrived one at a time.
                if saga.n_steps == 0 {
                    format!("{} (live)", listing.n_begun)
                } else {
                    saga.n_steps.to_string()
                },
                printable(saga.name.as_deref().unwrap_or_default()),
                format_ms(saga.created_at_ms),
            ]);
        }
        println!("{list}");
    }

    /// `replay`.
    pub(crate) fn replay(&self, report: &agent_kernel::ReplayReport) {
        if self.json {
            let mut document = serde_json::to_value(report).expect("reports serialize");
            document["consistent"] = report.divergence.is_none().into();
            print_json(&document);
            return;
        }
        match &report.divergence {
            None => println!(
                "saga {}: consistent: {} state changes and {} steps agree with the table and the tools",
                report.saga_id, report.n_transitions, report.n_steps
            ),
            Some(divergence) => println!(
                "saga {}: diverges at record {}: {}",
                report.saga_id,
                divergence.seq,
                printable(&divergence.reason)
            ),
        }
    }

    /// `undo --preview`: each step an undo would compensate, last first, with its verdict.
    pub(crate) fn undo_preview(&self, preview: &agent_kernel::UndoPreview, undoable: bool) {
        if self.json {
            let mut document = serde_json::to_value(preview).expect("previews serialize");
            document["undoable"] = undoable.into();
            print_json(&document);
            return;
        }
        if preview.nothing_to_undo {
            println!(
                "saga {} is {}{}: nothing to undo",
                preview.saga_id,
                preview.state,
                if preview.state == agent_kernel_api::SagaState::Undone {
                    ""
                } else {
                    " (a dry run)"
                }
            );
            return;
        }
        if let Some(reason) = &preview.refused {
            println!(
                "saga {}: an undo would be refused: {}",
                preview.saga_id,
                printable(reason)
            );
            return;
        }
        let mut list = table(&["seq", "tool", "window closes", "undo", "it would"]);
        for step in &preview.steps {
            use agent_kernel::UndoVerdict;
            let verdict = match &step.verdict {
                UndoVerdict::Undoable => "can be undone".to_owned(),
                UndoVerdict::Irreversible => "irreversible: cannot be undone".to_owned(),
                UndoVerdict::WindowClosed { window } => format!("its window of {window} closed"),
                UndoVerdict::Changed { change } => {
                    format!(
                        "changed since: {} (undone only with --force)",
                        printable(change)
                    )
                }
                UndoVerdict::Unknown { error } => {
                    format!("cannot tell whether it changed: {}", printable(error))
                }
                UndoVerdict::MissingTool => "its tool is missing here".to_owned(),
            };
            list.add_row(vec![
                step.step_seq.to_string(),
                printable(&step.tool_id),
                step.window_closes_at_ms.map(format_ms).unwrap_or_default(),
                verdict,
                step.restores.as_deref().map(printable).unwrap_or_default(),
            ]);
        }
        println!("{list}");
        println!(
            "saga {}: {}",
            preview.saga_id,
            if undoable {
                "an undo would compensate every step above, last first"
            } else {
                "an undo would be refused, and nothing would be undone"
            }
        );
    }

    /// `prune`.
    pub(crate) fn prune(&self, report: &agent_kernel::PruneReport, vacuumed: bool) {
        if self.json {
            let mut document = serde_json::to_value(report).expect("reports serialize");
            document["vacuumed"] = vacuumed.into();
            print_json(&document);
            return;
        }
        println!(
            "pruned {} sagas ({} steps) finished before {}{}",
            report.n_sagas,
            report.n_steps,
            agent_kernel_api::format_rfc3339_ms(report.before_ms),
            if vacuumed {
                "; the file was vacuumed"
            } else {
                ""
            }
        );
        if report.kept_in_undo_window > 0 {
            println!(
                "kept {} finished sagas still inside their undo window",
                report.kept_in_undo_window
            );
        }
    }

    /// `recover`.
    pub(crate) fn recovery(&self, report: &RecoveryReport) {
        if self.json {
            print_json(&serde_json::to_value(report).expect("reports serialize"));
            return;
        }
        if report.sagas.is_empty() {
            println!("nothing to recover: no unfinished sagas");
            return;
        }
        for action in &report.sagas {
            match action {
                RecoveryAction::RolledBack(saga) => {
                    println!("saga {}: rolled back, now {}", saga.saga_id, saga.state);
                    if let Some(failure) = &saga.failure {
                        // A saga that waited for an approval says so.
                        println!("  {}", printable(&failure.error.to_string()));
                    }
                }
                RecoveryAction::SkippedLive {
                    saga_id,
                    pid,
                    host,
                    lease_left_ms: Some(left_ms),
                } => println!(
                    "saga {saga_id}: skipped, the lease of its worker (pid {pid} on {host}) runs out in {:.1} s; `agent-kernel recover --wait` waits for it",
                    *left_ms as f64 / 1000.0
                ),
                RecoveryAction::SkippedLive {
                    saga_id, pid, host, ..
                } => println!(
                    "saga {saga_id}: skipped, its process {pid} on {host} is still running"
                ),
                RecoveryAction::SkippedWaiting {
                    saga_id,
                    approval_id,
                } => println!(
                    "saga {saga_id}: skipped, it waits for approval {}; `agent-kernel resume --saga {saga_id}` continues it once decided",
                    printable(approval_id)
                ),
                RecoveryAction::SkippedTakenOver { saga_id } => {
                    println!("saga {saga_id}: skipped, another process is recovering it");
                }
                RecoveryAction::Failed { saga_id, error } => {
                    println!("saga {saga_id}: NOT recovered: {error}");
                }
                RecoveryAction::MissingTools { saga_id, tools } => {
                    println!(
                        "saga {saga_id}: NOT recovered: it needs {} that this program does not have; left as it is",
                        tools
                            .iter()
                            .map(|tool| format!("`{}`", printable(tool)))
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
            }
        }
    }

    /// `fsm --show`.
    pub(crate) fn fsm(&self, fsm: &Guardrail, format: FsmFormat) {
        if self.json {
            print_json(&fsm_document(fsm));
            return;
        }
        let text = match format {
            FsmFormat::Table => fsm.to_text_table(),
            FsmFormat::Mermaid => fsm.to_mermaid(),
            FsmFormat::Dot => fsm.to_dot(),
            FsmFormat::Toml => fsm.to_toml(),
        };
        print!("{text}");
    }

    /// `fsm check FILE` on a valid table.
    pub(crate) fn fsm_checked(&self, path: &std::path::Path, fsm: &Guardrail) {
        if self.json {
            let mut document = fsm_document(fsm);
            document["ok"] = json!(true);
            document["file"] = json!(path.display().to_string());
            print_json(&document);
            return;
        }
        println!(
            "{}: a valid FSM table ({} transitions)",
            path.display(),
            fsm.transitions().len()
        );
    }

    /// `sandbox status`.
    pub(crate) fn sandbox_status(&self, status: &SandboxStatus<'_>) {
        use agent_kernel_sandbox::{NetworkLine, SecondLine};
        let policy = status.policy;
        let roots: Vec<String> = policy
            .fs()
            .map(|fs| {
                fs.allow()
                    .iter()
                    .map(|root| root.display().to_string())
                    .collect()
            })
            .unwrap_or_default();
        let domains: Vec<String> = policy
            .http()
            .map(|http| http.allow_domains().to_vec())
            .unwrap_or_default();
        let ports: Option<Vec<u16>> = policy
            .http()
            .and_then(|http| http.allow_ports().map(<[u16]>::to_vec));
        let (landlock, detail) = match status.files {
            SecondLine::Enforced { fully: true } => ("enforced", String::new()),
            SecondLine::Enforced { fully: false } => (
                "partially enforced",
                "an older Landlock ABI enforces a subset of the rights".to_owned(),
            ),
            SecondLine::Unavailable { reason } => ("unavailable", reason.clone()),
            _ => ("unknown", String::new()),
        };
        let (network, network_detail) = match status.network {
            NetworkLine::NoTcp => ("no_tcp", "every TCP connection and bind refused".to_owned()),
            NetworkLine::Ports(ports) => {
                let listed: Vec<String> = ports.iter().map(u16::to_string).collect();
                (
                    "ports",
                    format!(
                        "TCP connections only to ports {}; binds refused",
                        listed.join(", ")
                    ),
                )
            }
            NetworkLine::AnyPort => (
                "any_port",
                "binds refused; connections left to the first line (set [http] allow_ports to confine them)"
                    .to_owned(),
            ),
            NetworkLine::Unavailable { reason } => ("unavailable", reason.clone()),
            _ => ("unknown", String::new()),
        };
        let probe = status.probe.map(|(path, result)| {
            json!({
                "path": path.display().to_string(),
                "refused": result.is_err(),
                "error": result.as_ref().err(),
            })
        });
        let probe_connect = status.probe_connect.map(|(address, result)| {
            json!({
                "address": address,
                "refused": result.is_err(),
                "error": result.as_ref().err(),
            })
        });
        if self.json {
            let mut document = json!({
                "policy": policy.origin(),
                "first_line": {
                    "fs_roots": roots,
                    "http_allow_domains": domains,
                    "http_allow_ports": ports,
                    "files": policy.fs().is_some(),
                    "network": policy.http().is_some(),
                },
                "second_line": {
                    "landlock": landlock,
                    "detail": detail,
                    "read_only": agent_kernel_sandbox::SYSTEM_READ_ONLY,
                    "network": network,
                    "network_detail": network_detail,
                },
            });
            if let Some(probe) = probe {
                document["probe"] = probe;
            }
            if let Some(probe_connect) = probe_connect {
                document["probe_connect"] = probe_connect;
            }
            print_json(&document);
            return;
        }
        println!("policy      {}", policy.origin());
        println!(
            "first line  capability handles on {} root(s){}; network {}{}",
            roots.len(),
            if roots.is_empty() {
                " (no file access)".to_owned()
            } else {
                format!(": {}", roots.join(", "))
            },
            if domains.is_empty() {
                "denied".to_owned()
            } else {
                format!("limited to {}", domains.join(", "))
            },
            match &ports {
                Some(ports) => format!(
                    " on ports {}",
                    ports
                        .iter()
                        .map(u16::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None => String::new(),
            }
        );
        println!(
            "second line landlock {landlock}{}",
            if detail.is_empty() {
                String::new()
            } else {
                format!(" ({detail})")
            }
        );
        println!("            network {network}: {network_detail}");
        if let Some((path, result)) = status.probe {
            match result {
                Ok(()) => println!("probe       {} could be read", path.display()),
                Err(error) => println!("probe       {} was refused: {error}", path.display()),
            }
        }
        if let Some((address, result)) = status.probe_connect {
            match result {
                Ok(()) => println!("probe       a TCP connection to {address} was made"),
                Err(error) => println!("probe       a TCP connection to {address} failed: {error}"),
            }
        }
    }

    /// `bench`.
    pub(crate) fn bench(&self, report: &BenchReport) {
        if self.json {
            print_json(&serde_json::to_value(report).expect("reports serialize"));
            return;
        }
        println!("{report}");
    }
}

/// What `sandbox status` reports.
pub(crate) struct SandboxStatus<'a> {
    pub(crate) policy: &'a agent_kernel_sandbox::Policy,
    pub(crate) files: &'a agent_kernel_sandbox::SecondLine,
    pub(crate) network: &'a agent_kernel_sandbox::NetworkLine,
    /// A direct read of a path, after confinement.
    pub(crate) probe: Option<&'a (std::path::PathBuf, Result<(), String>)>,
    /// A direct TCP connection, after confinement.
    pub(crate) probe_connect: Option<&'a (String, Result<(), String>)>,
}

/// The document of `log --saga ID --json` (and of the console's saga page in JSON).
pub(crate) fn saga_record_document(record: &SagaRecord) -> Value {
    let saga = &record.saga;
    let steps: Vec<Value> = record
        .steps
        .iter()
        .map(|step| {
            json!({
                "seq": step.step_seq,
                "tool": step.tool_id,
                "tool_version": step.tool_version,
                "status": step.status,
                "args": step.args,
                "idempotency_key": step.idempotency_key,
                "output": step.output,
                "error": step.error.as_ref().map(ToString::to_string),
                "compensation": step.compensation,
                "reused_from": step.reused_from.as_ref().map(|(saga, seq)| json!({"saga_id": saga, "seq": seq})),
                "created_at_ms": step.created_at_ms,
                "updated_at_ms": step.updated_at_ms,
            })
        })
        .collect();
    json!({
        "saga_id": saga.saga_id,
        "state": saga.state,
        "name": saga.name,
        "actor": saga.actor,
        "n_steps": saga.n_steps,
        "dry_run": saga.dry_run,
        "owner": saga.owner,
        "created_at_ms": saga.created_at_ms,
        "updated_at_ms": saga.updated_at_ms,
        "steps": steps,
        "locks": record.locks,
        "conflicts": record.conflicts,
    })
}

/// Why a step failed, after a "failed: " of the caller's: the error's own kind when it says
/// more than that (`conflict: …`, `timed out: …`), else its message alone, so that no line
/// reads `failed: failed: …`.
pub(crate) fn why_failed(error: &agent_kernel_api::ToolError) -> String {
    if error.kind() == agent_kernel_api::ToolErrorKind::Failed {
        error.message().to_owned()
    } else {
        error.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::{format_ms, printable};

    #[test]
    fn control_characters_never_reach_the_terminal() {
        assert_eq!(printable("plain é 日本"), "plain é 日本");
        assert_eq!(printable("a\u{1b}[2Jb\nc"), "a\\u{1b}[2Jb\\nc");
    }

    #[test]
    fn formats_utc_timestamps() {
        assert_eq!(format_ms(0), "1970-01-01 00:00:00Z");
        assert_eq!(format_ms(1_796_045_400_000), "2026-11-30 13:30:00Z");
    }
}
