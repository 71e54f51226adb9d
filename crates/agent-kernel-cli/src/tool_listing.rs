//! What `tools` prints: every tool with its classes, what a call of it claims, and the
//! limits in force, as a table or one JSON document.

use agent_kernel_api::{EffectClass, Reversibility};
use serde_json::{Value, json};

use crate::output::{Output, print_json, printable, table};

impl Output {
    /// `tools`.
    pub(crate) fn tools(
        &self,
        tools: &agent_kernel_dispatcher::Dispatcher,
        approvals: &agent_kernel::ApprovalPolicy,
    ) {
        let limits = tools.limits();
        let unavailable: Vec<Value> = tools
            .unavailable()
            .into_iter()
            .map(|(server, reason)| json!({"server": server, "reason": reason}))
            .collect();
        let not_started = tools.not_asked();
        let ids = tools.ids();
        let rows: Vec<Value> = ids
            .iter()
            .filter_map(|id| tools.get(id).map(|tool| (id, tool)))
            .map(|(id, tool)| {
                let reversibility = tool.reversibility();
                // A window bounds undoing an effect: none for a tool that reads, or whose
                // effect cannot be undone at all.
                let undo_window = (tool.effect() == EffectClass::Mutating
                    && reversibility != Reversibility::None)
                    .then(|| limits.undo_window_for(tool.as_ref()).to_string());
                // What a call claims: the declared templates, the tool's own name when it
                // declares none (coarse but safe), nothing for a read-only tool.
                let templates: Vec<String> = tool
                    .spec()
                    .resources()
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                let (resources, coarse) = if tool.effect() == EffectClass::ReadOnly {
                    (Vec::new(), false)
                } else if templates.is_empty() {
                    (vec![agent_kernel_api::tool_resource(id)], true)
                } else {
                    (templates, false)
                };
                let duplicate_keys: Vec<String> = tool
                    .spec()
                    .duplicate_keys()
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                json!({
                    "tool": id,
                    "description": tool.description(),
                    "version": tool.version(),
                    "effect": tool.effect().as_str(),
                    "reversibility": reversibility.as_str(),
                    "undo_window": undo_window,
                    "idempotent": tool.idempotent(),
                    "settlement": tool.settlement().as_str(),
                    "timeout_ms": tools.timeout_ms_of(id),
                    "retries_max": if tool.idempotent() { limits.retries_max_for(id) } else { 0 },
                    "concurrency_max": limits.tools.get(id).and_then(|l| l.concurrency_max),
                    "needs_approval": approvals.reason_for(id, tool.as_ref()).is_some(),
                    "resources": resources,
                    "resources_default": coarse,
                    "duplicate_keys": duplicate_keys,
                })
            })
            .collect();
        if self.is_json() {
            print_json(&json!({
                "tools": rows,
                "unavailable": unavailable,
                "not_started": not_started,
                "limits": {
                    "timeout_ms": limits.timeout_ms,
                    "compensation_timeout_ms": limits.compensation_timeout_ms,
                    "concurrency_max": limits.concurrency_max,
                    "retries_max": limits.retries_max,
                    "backoff_base_ms": limits.backoff_base_ms,
                    "backoff_max_ms": limits.backoff_max_ms,
                    "undo_window": limits.undo_window.to_string(),
                    "lock_wait_ms": limits.lock_wait_ms,
                    "duplicate_window_ms": limits.duplicate_window_ms,
                },
            }));
            return;
        }
        let mut list = table(&[
            "tool",
            "effect",
            "idempotent",
            "reversibility",
            "undo window",
            "unknown outcome",
            "timeout",
            "retries",
            "concurrency",
            "resources",
        ]);
        for row in &rows {
            list.add_row(vec![
                row["tool"].as_str().unwrap_or_default().to_owned(),
                row["effect"].as_str().unwrap_or_default().to_owned(),
                row["idempotent"].to_string(),
                row["reversibility"].as_str().unwrap_or_default().to_owned(),
                row["undo_window"].as_str().unwrap_or("-").to_owned(),
                row["settlement"].as_str().unwrap_or_default().to_owned(),
                format!("{} ms", row["timeout_ms"]),
                row["retries_max"].to_string(),
                row["concurrency_max"]
                    .as_u64()
                    .map_or_else(|| "-".to_owned(), |n| n.to_string()),
                resources_cell(row),
            ]);
        }
        println!("{list}");
        for server in &not_started {
            println!(
                "upstream MCP server `{server}` was not started, its tools are not listed: `agent-kernel tools --upstream` starts it and lists them"
            );
        }
        for server in &unavailable {
            println!(
                "upstream MCP server `{}` is unavailable, its tools are not listed: {}",
                server["server"].as_str().unwrap_or_default(),
                server["reason"].as_str().unwrap_or_default()
            );
        }
        println!(
            "all tools: at most {} calls at once; compensation timeout {} ms; backoff {}..{} ms",
            limits.concurrency_max,
            limits.compensation_timeout_ms,
            limits.backoff_base_ms,
            limits.backoff_max_ms
        );
    }
}

/// The `resources` cell of a tool's row in `tools`: what a call claims (`-` for a read-only
/// tool, `(default)` after the tool's own name when it declares none), then its duplicate
/// keys.
fn resources_cell(row: &Value) -> String {
    let list = |field: &str| -> Vec<String> {
        row[field]
            .as_array()
            .map(|values| {
                values
                    .iter()
                    .filter_map(Value::as_str)
                    .map(printable)
                    .collect()
            })
            .unwrap_or_default()
    };
    let resources = list("resources");
    let mut cell = if resources.is_empty() {
        "-".to_owned()
    } else {
        resources.join(", ")
    };
    if row["resources_default"] == Value::Bool(true) {
        cell.push_str(" (default)");
    }
    let duplicate_keys = list("duplicate_keys");
    if !duplicate_keys.is_empty() {
        cell.push_str(&format!("; duplicates by {}", duplicate_keys.join(", ")));
    }
    cell
}
