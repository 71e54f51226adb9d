//! What one seed runs: a few sagas of `sim.set` steps over a few shared keys, and writers
//! outside the kernel acting at chosen points.

use std::fmt;

use agent_kernel_api::{Plan, PlanStep};
use serde_json::json;

use crate::tools::{APPROVED_TOOL, PROBED_TOOL, SET_TOOL};
use crate::upstream::UPSTREAM_TOOL;

/// A small deterministic generator (SplitMix64): one seed, one sequence.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// The generator of `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A generator of its own for `stream`, made from this one's state without moving it.
    pub fn fork(&self, stream: u64) -> Rng {
        let mut forked = Rng(self.0 ^ stream);
        forked.next_u64();
        forked
    }
}

/// The stream of a scenario's operator and drivers ([`Rng::fork`]).
const EXTRAS_STREAM: u64 = 0x6F70_6572_6174_6F72;

/// The stream of which steps go through the upstream server ([`Rng::fork`]).
const UPSTREAM_STREAM: u64 = 0x7570_7374_7265_616D;

/// Streams of a case's schedule for the operator's process and its choices.
pub(crate) const OPERATOR_STREAMS: [u64; 2] = [0x6F70_5F67_6174_6573, 0x6F70_5F63_686F_6963];

/// The keys sagas share.
pub const KEYS: [&str; 3] = ["a", "b", "c"];

/// The most sagas one scenario runs at once.
pub const SAGAS_MAX: u64 = 3;

/// The most steps of one saga.
pub const STEPS_MAX: u64 = 3;

/// One step: set `key` to `value` (unique in the scenario), or fail before acting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepSpec {
    /// The key.
    pub key: String,
    /// The value, unique in the scenario, so the world shows whose write it holds.
    pub value: i64,
    /// The step fails before its effect: its saga rolls back.
    pub fail: bool,
    /// The step is `sim.set.probed`'s: when its outcome is unknown, its probe decides
    /// whether it is compensated.
    pub probed: bool,
    /// The step is `sim.set.approved`'s: it waits for an operator's approval (at most one
    /// such step a saga, so that the saga's one request tells whether it may act).
    pub approval: bool,
    /// The step is the upstream server's `up.set`, through the real upstream tool and hub
    /// (neither probed nor approved).
    pub upstream: bool,
}

/// A write by someone outside the kernel, at the first log write of the first process from
/// point `at` on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outside {
    /// The point.
    pub at: u64,
    /// The key.
    pub key: String,
    /// The value, unique in the scenario.
    pub value: i64,
}

/// How a saga is driven: as a plan, or call by call as an agent drives a live saga over MCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// `Kernel::run` of the whole plan.
    Plan,
    /// `Kernel::begin`, a call per step, then `commit`, or `abort` when `abort` (the agent
    /// changed its mind) or when a call is refused or meets a conflict.
    Live {
        /// The agent aborts instead of committing.
        abort: bool,
    },
    /// `Kernel::call_alone`: a saga of one call, committed with it (an MCP call without a
    /// saga id).
    CallAlone,
}

impl fmt::Display for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Driver::Plan => write!(f, "plan"),
            Driver::Live { abort: false } => write!(f, "live, committed"),
            Driver::Live { abort: true } => write!(f, "live, aborted"),
            Driver::CallAlone => write!(f, "one call alone"),
        }
    }
}

/// The most actions of the operator: each an `undo` of a saga that ended `Done`, or a
/// `dlq retry` of an open dead letter.
pub const OPERATOR_ACTIONS_MAX: u32 = 2;

/// Sagas run at once by one process, outside writes, and an operator acting meanwhile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scenario {
    /// Each saga's steps.
    pub sagas: Vec<Vec<StepSpec>>,
    /// The outside writes.
    pub outside: Vec<Outside>,
    /// How many times an operator, a process of its own running beside the sagas', undoes
    /// a `Done` saga or retries an open dead letter (0: no operator).
    pub operator_actions: u32,
    /// How each saga is driven, one per saga.
    pub drivers: Vec<Driver>,
    /// Every step carries an idempotency key, and once every process before has ended and
    /// the last `recover` has run, an agent started again runs every saga once more, as a
    /// plan with the same keys: exactly once by key.
    pub retried: bool,
}

impl Scenario {
    /// The scenario of `rng`'s next numbers.
    pub fn generate(rng: &mut Rng) -> Scenario {
        let n_sagas = 1 + rng.below(SAGAS_MAX);
        let mut next_value = 1;
        let mut sagas = Vec::new();
        for _ in 0..n_sagas {
            let n_steps = 1 + rng.below(STEPS_MAX);
            let steps: Vec<StepSpec> = (0..n_steps)
                .map(|_| {
                    let value = next_value;
                    next_value += 1;
                    StepSpec {
                        key: pick_key(rng),
                        value,
                        fail: rng.chance(15),
                        probed: false,
                        approval: false,
                        upstream: false,
                    }
                })
                .collect();
            sagas.push(steps);
        }
        let n_steps: u64 = sagas.iter().map(|steps| steps.len() as u64).sum();
        let outside = (0..rng.below(2))
            .map(|n| Outside {
                // Within the points a run of these sagas reaches (about three a step).
                at: rng.below(3 * n_steps + 2),
                key: pick_key(rng),
                value: 1000 + n as i64,
            })
            .collect();
        // Drawn from a stream of their own, which leaves `rng` where a seed left it before
        // the operator and the drivers existed: what a seed drew then (its sagas, outside
        // writes, schedule and faults) it draws still.
        let mut extras = rng.fork(EXTRAS_STREAM);
        let operator_actions = if extras.chance(50) {
            1 + extras.below(u64::from(OPERATOR_ACTIONS_MAX)) as u32
        } else {
            0
        };
        let drivers = sagas
            .iter()
            .map(|steps| match extras.below(100) {
                0..50 => Driver::Plan,
                50..65 if steps.len() == 1 => Driver::CallAlone,
                50..85 => Driver::Live { abort: false },
                _ => Driver::Live { abort: true },
            })
            .collect();
        let retried = extras.chance(30);
        // Last, so that what the stream drew before stays as it was.
        for step in sagas.iter_mut().flatten() {
            step.probed = extras.chance(30);
        }
        for steps in &mut sagas {
            if extras.chance(25) {
                let m = extras.below(steps.len() as u64) as usize;
                let step = &mut steps[m];
                step.approval = true;
                step.probed = false;
            }
        }
        // From a stream of its own, after everything else: a seed draws what it drew before
        // the upstream server existed, and some of its plain steps now go through it.
        let mut upstream = rng.fork(UPSTREAM_STREAM);
        if upstream.chance(40) {
            for step in sagas.iter_mut().flatten() {
                step.upstream = !step.probed && !step.approval && upstream.chance(50);
            }
        }
        Scenario {
            sagas,
            outside,
            operator_actions,
            drivers,
            retried,
        }
    }

    /// Step `m` of saga `n`'s idempotency key, when the scenario is retried.
    pub fn idempotency_key(&self, n: usize, m: usize) -> Option<String> {
        self.retried.then(|| format!("key-{n}-{m}"))
    }

    /// Step `m` of saga `n`'s tool.
    pub fn tool(&self, n: usize, m: usize) -> &'static str {
        let step = &self.sagas[n][m];
        if step.approval {
            APPROVED_TOOL
        } else if step.upstream {
            UPSTREAM_TOOL
        } else if step.probed {
            PROBED_TOOL
        } else {
            SET_TOOL
        }
    }

    /// Whether some step waits for an approval: the operator's process then decides the
    /// requests it finds.
    pub fn asks_approvals(&self) -> bool {
        self.sagas.iter().flatten().any(|step| step.approval)
    }

    /// Whether an operator's process runs beside the sagas: to act, or to decide requests.
    pub fn has_operator(&self) -> bool {
        self.operator_actions > 0 || self.asks_approvals()
    }

    /// Step `m` of saga `n`'s arguments.
    pub fn args(&self, n: usize, m: usize) -> serde_json::Value {
        let step = &self.sagas[n][m];
        let mut args = json!({ "key": step.key, "value": step.value });
        if step.fail {
            args["fail"] = json!(true);
        }
        args
    }

    /// Saga `n` as a plan.
    pub fn plan(&self, n: usize) -> Plan {
        Plan {
            name: Some(format!("saga {n}")),
            actor: None,
            steps: (0..self.sagas[n].len())
                .map(|m| PlanStep {
                    tool: self.tool(n, m).to_owned(),
                    args: self.args(n, m),
                    idempotency_key: self.idempotency_key(n, m),
                })
                .collect(),
        }
    }

    /// Every smaller scenario with one saga, one step, one outside write or one operator
    /// action fewer, or one saga driven as a plan or one step not probed or approved instead.
    pub fn smaller(&self) -> Vec<Scenario> {
        let mut smaller = Vec::new();
        if self.operator_actions > 0 {
            let mut fewer = self.clone();
            fewer.operator_actions -= 1;
            smaller.push(fewer);
        }
        if self.retried {
            let mut once = self.clone();
            once.retried = false;
            smaller.push(once);
        }
        for n in 0..self.sagas.len() {
            if self.sagas.len() > 1 {
                let mut fewer = self.clone();
                fewer.sagas.remove(n);
                fewer.drivers.remove(n);
                smaller.push(fewer);
            }
            if self.drivers[n] != Driver::Plan {
                let mut plainer = self.clone();
                plainer.drivers[n] = Driver::Plan;
                smaller.push(plainer);
            }
            for m in 0..self.sagas[n].len() {
                if self.sagas[n].len() > 1 {
                    let mut fewer = self.clone();
                    fewer.sagas[n].remove(m);
                    smaller.push(fewer);
                }
                if self.sagas[n][m].probed {
                    let mut plainer = self.clone();
                    plainer.sagas[n][m].probed = false;
                    smaller.push(plainer);
                }
                if self.sagas[n][m].approval {
                    let mut plainer = self.clone();
                    plainer.sagas[n][m].approval = false;
                    smaller.push(plainer);
                }
                if self.sagas[n][m].upstream {
                    let mut plainer = self.clone();
                    plainer.sagas[n][m].upstream = false;
                    smaller.push(plainer);
                }
            }
        }
        for n in 0..self.outside.len() {
            let mut fewer = self.clone();
            fewer.outside.remove(n);
            smaller.push(fewer);
        }
        smaller
    }
}

fn pick_key(rng: &mut Rng) -> String {
    KEYS[rng.below(KEYS.len() as u64) as usize].to_owned()
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, steps) in self.sagas.iter().enumerate() {
            let steps: Vec<String> = steps
                .iter()
                .map(|step| {
                    let fail = if step.fail { " (fails)" } else { "" };
                    let probed = if step.probed { " (probed)" } else { "" };
                    let approval = if step.approval {
                        " (needs approval)"
                    } else {
                        ""
                    };
                    let upstream = if step.upstream { " (upstream)" } else { "" };
                    format!(
                        "{} = {}{fail}{probed}{approval}{upstream}",
                        step.key, step.value
                    )
                })
                .collect();
            writeln!(f, "  saga {n} ({}): {}", self.drivers[n], steps.join("; "))?;
        }
        for write in &self.outside {
            writeln!(
                f,
                "  outside writer: {} = {} before point {}",
                write.key, write.value, write.at
            )?;
        }
        if self.operator_actions > 0 {
            writeln!(
                f,
                "  operator: {} undo or dlq retry actions, beside the sagas",
                self.operator_actions
            )?;
        }
        if self.retried {
            writeln!(
                f,
                "  every step keyed; every saga run again by an agent started again"
            )?;
        }
        Ok(())
    }
}
