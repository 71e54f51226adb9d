//! Agents side by side: each agent a chain of calls (read a file or an account, write it
//! back changed), their turns interleaved in a scenario's order, through the kernel (each
//! agent a live saga of one kernel) or as the baseline (the tools called directly).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use agent_kernel::{BeginOptions, CallAnswer, Kernel, LiveSaga, SagaState};
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::generate::isolation::{READ, turns, writes};
use crate::scenario::Call;
use crate::sides::{Run, direct_context, micros, recover};

/// Where an agent stands.
enum Standing {
    /// Taking its turns.
    Acting,
    /// Its call met a conflict: its saga was rolled back, and it runs its calls again once
    /// the others are over.
    Again,
    /// Its saga is over (committed or rolled back).
    Over,
}

/// One agent through the kernel.
struct KernelAgent<'a> {
    who: usize,
    calls: &'a [Call],
    saga: Option<LiveSaga>,
    turn: usize,
    last_read: Option<Value>,
    standing: Standing,
}

impl<'a> KernelAgent<'a> {
    /// Agent `who`, before its first call.
    fn new(who: usize, calls: &'a [Call], standing: Standing) -> KernelAgent<'a> {
        KernelAgent {
            who,
            calls,
            saga: None,
            turn: 0,
            last_read: None,
            standing,
        }
    }
}

/// The name of agent `who`'s saga in scenario `name`.
fn saga_name(name: &str, who: usize) -> String {
    format!("{name}-agent-{who}")
}

/// Drives `agents` (those from `first` on) through `kernel`, each a live saga, turn by turn
/// in `schedule`'s order; an agent whose call meets a conflict rolls its saga back and,
/// once the schedule is over (after `agent-kernel recover` when the holder's process is
/// gone), runs its calls again alone. The agents whose sagas end `Done` are recorded in
/// `run.committed`, in the order they committed.
///
/// # Errors
///
/// When the kernel fails (not a tool) or answers what an agent cannot handle.
pub(crate) async fn kernel_agents(
    kernel: &Arc<Kernel>,
    (bin, root): (&Path, &Path),
    name: &str,
    agents: &[Vec<Call>],
    first: usize,
    schedule: &[usize],
    run: &mut Run,
) -> Result<()> {
    let mut states: Vec<KernelAgent<'_>> = agents
        .iter()
        .enumerate()
        .map(|(who, calls)| {
            let standing = if who < first {
                Standing::Over
            } else {
                Standing::Acting
            };
            KernelAgent::new(who, calls, standing)
        })
        .collect();
    let mut holder_gone = false;
    for &who in schedule {
        holder_gone |= take_turn(kernel, name, &mut states[who], run).await?;
    }
    if holder_gone {
        // Here nothing may be left to an operator: 3 is broken too.
        if recover(bin, root, run).await? == 3 {
            run.broken.push("agent-kernel recover exited 3".to_owned());
        }
    }
    for agent in &mut states {
        if !matches!(agent.standing, Standing::Again) {
            continue;
        }
        run.note(format!("agent {} runs its calls again", agent.who));
        *agent = KernelAgent::new(agent.who, agent.calls, Standing::Acting);
        for _ in 0..turns(agent.calls) {
            take_turn(kernel, name, agent, run).await?;
        }
        if !matches!(agent.standing, Standing::Over) {
            run.broken.push(format!(
                "agent {} met a conflict again once the others were over",
                agent.who
            ));
        }
    }
    Ok(())
}

/// One turn of `agent`: its next call, or its commit; answers whether its call met a
/// conflict with a saga whose process is gone.
async fn take_turn(
    kernel: &Arc<Kernel>,
    name: &str,
    agent: &mut KernelAgent<'_>,
    run: &mut Run,
) -> Result<bool> {
    if !matches!(agent.standing, Standing::Acting) {
        return Ok(false);
    }
    let who = agent.who;
    if agent.saga.is_none() {
        agent.saga = Some(
            kernel
                .begin(BeginOptions {
                    name: Some(saga_name(name, who)),
                    actor: None,
                    ..BeginOptions::default()
                })
                .await?,
        );
    }
    let saga = agent.saga.as_ref().context("the agent's saga")?;
    let Some(call) = agent.calls.get(agent.turn) else {
        let report = saga.commit().await?;
        run.states.push(format!("{:?}", report.state));
        if report.state == SagaState::Done {
            run.committed.push(who);
        }
        agent.standing = Standing::Over;
        return Ok(false);
    };
    let call = filled(call, agent.last_read.as_ref())?;
    let started = Instant::now();
    let answer = saga
        .call(&call.tool, call.args.clone(), call.key.clone())
        .await?;
    run.latencies_us.push(micros(started));
    match answer {
        CallAnswer::Committed(step) => {
            let output = step.output.map(|output| output.data);
            run.outputs.push(serde_json::to_string(&output)?);
            if !writes(&call) {
                agent.last_read = output;
            }
            agent.turn += 1;
            Ok(false)
        }
        CallAnswer::Conflict(conflict) => {
            run.note(format!("agent {who}: {conflict}"));
            let report = saga
                .abort("a conflict: the agent tries again once the holder is settled")
                .await?;
            run.states.push(format!("{:?}", report.state));
            agent.standing = Standing::Again;
            Ok(!conflict.alive)
        }
        CallAnswer::Denied(report) | CallAnswer::Failed(report) => {
            run.note(format!(
                "agent {who}: call {} ended its saga ({:?})",
                agent.turn, report.state
            ));
            run.states.push(format!("{:?}", report.state));
            agent.standing = Standing::Over;
            Ok(false)
        }
        other => bail!("agent {who}: an answer the suite does not expect: {other:?}"),
    }
}

/// Drives `agents` (those from `first` on) on the tools of `kernel` directly, turn by turn
/// in `schedule`'s order, as agents without a kernel do: a call that fails ends the agent;
/// an agent that reaches its commit turn has every call done (`run.committed`).
///
/// # Errors
///
/// When a tool is missing (a fault of the suite) or an output cannot be serialized.
pub(crate) async fn baseline_agents(
    kernel: &Arc<Kernel>,
    name: &str,
    agents: &[Vec<Call>],
    first: usize,
    schedule: &[usize],
    run: &mut Run,
) -> Result<()> {
    let mut turn = vec![0; agents.len()];
    let mut last_read: Vec<Option<Value>> = vec![None; agents.len()];
    let mut over: Vec<bool> = (0..agents.len()).map(|who| who < first).collect();
    for &who in schedule {
        if over[who] {
            continue;
        }
        let Some(call) = agents[who].get(turn[who]) else {
            run.committed.push(who);
            over[who] = true;
            continue;
        };
        let call = filled(call, last_read[who].as_ref())?;
        let Some(tool) = kernel.tool(&call.tool) else {
            bail!("agent {who}: the baseline has no tool {}", call.tool);
        };
        let ctx = direct_context(&saga_name(name, who), turn[who], &call)?;
        let started = Instant::now();
        let result = tool.execute(&ctx, &call.args).await;
        run.latencies_us.push(micros(started));
        match result {
            Ok(output) => {
                run.outputs.push(serde_json::to_string(&output.data)?);
                if !writes(&call) {
                    last_read[who] = Some(output.data);
                }
                turn[who] += 1;
            }
            Err(error) => {
                run.note(format!("agent {who}: call {} failed: {error}", turn[who]));
                over[who] = true;
            }
        }
    }
    Ok(())
}

/// `call` with what the agent read put where the scenario says ([`READ`]): a file's
/// content at the head of `fs.write`'s `content`, a balance less an amount as `acct.set`'s
/// `balance`.
fn filled(call: &Call, last_read: Option<&Value>) -> Result<Call> {
    let mut call = call.clone();
    if let Some(content) = call.args["content"].as_str()
        && let Some(rest) = content.strip_prefix(READ)
    {
        let read = last_read
            .and_then(|read| read["content"].as_str())
            .context("a write from a read that has not happened")?;
        call.args["content"] = json!(format!("{read}{rest}"));
    }
    if let Some(balance) = call.args["balance"].as_str()
        && let Some(rest) = balance.strip_prefix(READ)
    {
        let read = last_read
            .and_then(|read| read["balance"].as_i64())
            .context("a balance from a read that has not happened")?;
        let debit: i64 = rest.trim_start_matches('-').parse()?;
        call.args["balance"] = json!(read - debit);
    }
    Ok(call)
}
