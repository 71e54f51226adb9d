//! The scenarios, generated from one seed: the same seed gives the same scenarios, byte for
//! byte, on any machine.

mod attacks;
mod crashes;
pub(crate) mod isolation;

#[allow(clippy::wildcard_imports)]
use self::{attacks::*, crashes::*, isolation::*};

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::scenario::{
    Call, Decision, Drive, KillPoint, Kind, Must, Redelivery, Scenario, Setup, Writer,
};

/// The scenarios each kind contributes to the reduced suite (`--quick`).
pub(crate) const QUICK_PER_KIND: usize = 8;

/// The pause of a drill write that outlives its timeout, in milliseconds.
const HANG_MS: u64 = 2_000;
/// The timeout a hanging call is given, in milliseconds.
const TIMEOUT_MS: u64 = 250;
/// How long an approval request waits in the scenarios where nobody answers.
const APPROVAL_TIMEOUT_MS: u64 = 300;

/// File names the workspaces are made of.
const NAMES: [&str; 6] = [
    "notes.txt",
    "config.json",
    "report.md",
    "ledger.csv",
    "todo.txt",
    "README.txt",
];

/// Every scenario of the suite for `seed`, kind by kind; with `quick`, a seeded sample of
/// [`QUICK_PER_KIND`] of each kind.
pub(crate) fn scenarios(seed: u64, quick: bool) -> Vec<Scenario> {
    let mut all = Vec::new();
    for kind in Kind::ALL {
        let mut maker = Gen::new(seed, kind);
        let mut of_kind = match kind {
            Kind::ToolFailure => tool_failures(&mut maker),
            Kind::Crash => crashes(&mut maker),
            Kind::Injection => injections(&mut maker),
            Kind::Duplicate => duplicates(&mut maker),
            Kind::UnknownOutcome => unknown_outcomes(&mut maker),
            Kind::Approval => approvals(&mut maker),
            Kind::Upstream => upstream_failures(&mut maker),
            Kind::RollbackKill => rollback_kills(&mut maker),
            Kind::LaterWriter => later_writers(&mut maker),
            Kind::SlowCommand => slow_commands(&mut maker),
            Kind::Isolation => isolations(&mut maker),
            Kind::Regenerated => regenerations(&mut maker),
        };
        if quick {
            of_kind.shuffle(&mut maker.rng);
            of_kind.truncate(QUICK_PER_KIND);
            of_kind.sort_by(|a, b| a.id.cmp(&b.id));
        }
        all.extend(of_kind);
    }
    all
}

/// The generator of one kind's scenarios.
struct Gen {
    kind: Kind,
    seed: u64,
    rng: StdRng,
    next: usize,
}

/// A scenario under construction: its files and its calls so far, with the model of which
/// workspace files exist at this point of the chain.
struct Draft {
    setup: BTreeMap<String, Setup>,
    calls: Vec<Call>,
    existing: Vec<String>,
    tag: String,
}

impl Draft {
    /// The same files and calls, for the next scenario of `maker` (its id).
    fn copy_for(&self, maker: &Gen) -> Draft {
        Draft {
            setup: self.setup.clone(),
            calls: self.calls.clone(),
            existing: Vec::new(),
            tag: format!("{}-{:03}", maker.kind, maker.next),
        }
    }
}

/// Which mutations a chain may use.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mutations {
    /// `fs.write`, `fs.append`, `fs.delete`.
    Files,
    /// The same and `fault.probed_write`.
    WithDrill,
    /// `fs.write` and `fs.append` only (no delete: it needs an approval in those scenarios).
    NoDelete,
}

impl Gen {
    fn new(seed: u64, kind: Kind) -> Gen {
        let kind_seed = seed ^ (0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(kind as u64 + 1));
        Gen {
            kind,
            seed: kind_seed,
            rng: StdRng::seed_from_u64(kind_seed),
            next: 0,
        }
    }

    /// A new draft with 2 to 4 workspace files and the files outside the workspace.
    fn draft(&mut self) -> Draft {
        self.draft_with(None)
    }

    /// A new draft with `n` workspace files and the files outside the workspace.
    fn draft_of(&mut self, n: usize) -> Draft {
        self.draft_with(Some(n))
    }

    fn draft_with(&mut self, files: Option<usize>) -> Draft {
        let tag = format!("{}-{:03}", self.kind, self.next);
        let mut names = NAMES.to_vec();
        names.shuffle(&mut self.rng);
        let n = files.unwrap_or_else(|| self.rng.random_range(2..=4));
        let mut setup = BTreeMap::new();
        let mut existing = Vec::new();
        for name in &names[..n] {
            let path = format!("ws/{name}");
            setup.insert(
                path.clone(),
                Setup::File(format!("{name}: original ({tag})\n").into_bytes()),
            );
            existing.push(path);
        }
        setup.insert(
            "outside/target.txt".to_owned(),
            Setup::File(b"precious, outside the workspace\n".to_vec()),
        );
        setup.insert(
            "outside/secret.txt".to_owned(),
            Setup::File(format!("SECRET-FILE ({tag})\n").into_bytes()),
        );
        Draft {
            setup,
            calls: Vec::new(),
            existing,
            tag,
        }
    }

    /// Adds `n` mutating calls to `draft`, each on a file that exists at that point (or a
    /// new one), with content unique to the scenario and the call.
    fn mutate(&mut self, draft: &mut Draft, n: usize, mutations: Mutations) {
        for _ in 0..n {
            let index = draft.calls.len();
            let content = format!("{} call {index}\n", draft.tag);
            let pick = |rng: &mut StdRng, files: &[String]| {
                files[rng.random_range(0..files.len())].clone()
            };
            let choices: &[&str] = match mutations {
                Mutations::Files => &["write", "write_new", "append", "delete"],
                Mutations::WithDrill => &["write", "write_new", "append", "delete", "drill"],
                Mutations::NoDelete => &["write", "write_new", "append"],
            };
            let mut choice = choices[self.rng.random_range(0..choices.len())];
            if choice == "delete" && draft.existing.len() < 2 {
                choice = "append";
            }
            let call = match choice {
                "write" => Call::new(
                    "fs.write",
                    json!({ "path": pick(&mut self.rng, &draft.existing), "content": content }),
                ),
                "write_new" => {
                    let path = format!("ws/new-{index}.txt");
                    if !draft.existing.contains(&path) {
                        draft.existing.push(path.clone());
                    }
                    Call::new("fs.write", json!({ "path": path, "content": content }))
                }
                "append" => Call::new(
                    "fs.append",
                    json!({ "path": pick(&mut self.rng, &draft.existing), "content": content }),
                ),
                "delete" => {
                    let at = self.rng.random_range(0..draft.existing.len());
                    let path = draft.existing.remove(at);
                    Call::new("fs.delete", json!({ "path": path }))
                }
                _ => Call::new(
                    "fault.probed_write",
                    json!({ "path": pick(&mut self.rng, &draft.existing), "content": content }),
                ),
            };
            draft.calls.push(call);
        }
    }

    fn finish(&mut self, draft: Draft, variant: String, drive: Drive, must: Must) -> Scenario {
        self.next += 1;
        Scenario {
            id: draft.tag,
            kind: self.kind,
            variant,
            seed: self.seed,
            setup: draft.setup,
            calls: draft.calls,
            policy_extra: String::new(),
            upstream: false,
            drive,
            must,
            attack: None,
            forbidden: Vec::new(),
            stops_at: None,
            writes: None,
            recovery_writes: None,
            later_write: None,
            commands: false,
            agents: Vec::new(),
        }
    }
}

/// The tool names of a chain, for a variant's text.
fn tools_of(calls: &[Call]) -> String {
    calls
        .iter()
        .map(|call| call.tool.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A tool fails mid-chain: an error, a panic, a validation that does not hold, a delete of
/// a missing file, a write into a missing folder. Nothing of the chain may stay.
fn tool_failures(maker: &mut Gen) -> Vec<Scenario> {
    (0..42)
        .map(|i| {
            let mut draft = maker.draft();
            let before = maker.rng.random_range(1..=4);
            maker.mutate(&mut draft, before, Mutations::Files);
            let (failing, what) = match i % 5 {
                0 => (
                    Call::new("fault.fail", json!({ "message": "the payment API answered 500" })),
                    "an error",
                ),
                1 => (
                    Call::new("fault.panic", json!({ "message": "index out of bounds" })),
                    "a panic",
                ),
                2 => (
                    Call::new(
                        "validate.file",
                        json!({ "path": draft.existing[0].clone(), "equals": "what the agent expected" }),
                    ),
                    "a validation that does not hold",
                ),
                3 => (
                    Call::new("fs.delete", json!({ "path": format!("ws/missing-{i}.txt") })),
                    "a delete of a missing file",
                ),
                _ => (
                    Call::new(
                        "fs.write",
                        json!({ "path": "ws/no-such-folder/out.txt", "content": "lost\n" }),
                    ),
                    "a write into a missing folder",
                ),
            };
            draft.calls.push(failing);
            let after = maker.rng.random_range(0..=2);
            maker.mutate(&mut draft, after, Mutations::Files);
            let variant = format!(
                "call {} of {} fails with {what} ({})",
                before + 1,
                draft.calls.len(),
                tools_of(&draft.calls)
            );
            let mut scenario = maker.finish(draft, variant, Drive::Chain, Must::Unchanged);
            scenario.stops_at = Some(before);
            scenario
        })
        .collect()
}

/// The kill points of a chain of `n` mutating calls, every log boundary once: before each
/// write (the creation of the saga, each BEGIN, each outcome, the end), after each BEGIN
/// (intent durable, effect not yet run) and after the last write (the saga `Done`).
pub(crate) fn kill_points(n: u32) -> Vec<KillPoint> {
    let writes = expected_writes(n);
    let mut points: Vec<KillPoint> = (0..writes).map(KillPoint::BeforeWrite).collect();
    points.extend((1..=n).map(|step| KillPoint::AfterWrite(2 * step - 1)));
    points.push(KillPoint::AfterWrite(writes - 1));
    points
}

/// The log writes of a live saga of `n` mutating calls that commits: its creation, a BEGIN
/// and an outcome per call, its end. The crash runs check it against a run without a kill.
pub(crate) fn expected_writes(n: u32) -> u32 {
    2 * n + 2
}

/// The log writes of a live saga of `n` (at least one) mutating calls and then a call that
/// fails: the forward writes (`2n + 1`), the failing step's BEGIN and failure, and the
/// rollback's `n` (a compensation per step, each durable before the next acts, the last
/// with the end state).
pub(crate) fn expected_writes_failing(n: u32) -> u32 {
    3 * n + 3
}

/// The log writes of `recover` rolling back one saga of `n` (at least one)
/// committed-or-in-doubt mutating steps: its operator command, its take-over with the move
/// to compensating (one transaction), and a compensation per step, each durable before the
/// next acts, the last with the end (SPEC 10.3).
pub(crate) fn expected_recovery_writes(n: u32) -> u32 {
    n + 2
}

/// What the log holds at a kill point of a failing chain, for a variant's text.
fn rollback_boundary(point: KillPoint, n: u32) -> String {
    let (KillPoint::BeforeWrite(w) | KillPoint::AfterWrite(w)) = point;
    let what = if w <= 2 * n {
        return boundary(point, n);
    } else if w == 2 * n + 1 {
        "the failing step's BEGIN".to_owned()
    } else if w == 2 * n + 2 {
        "the failing step's failure".to_owned()
    } else if w == expected_writes_failing(n) - 1 {
        "the rollback's last write (the saga's end)".to_owned()
    } else {
        format!("rollback write {} of {}", w - 2 * n - 2, n)
    };
    match point {
        KillPoint::BeforeWrite(_) => format!("killed before {what}"),
        KillPoint::AfterWrite(_) => format!("killed after {what}"),
    }
}

/// What the log holds at a kill point, for a variant's text.
fn boundary(point: KillPoint, n: u32) -> String {
    let (KillPoint::BeforeWrite(w) | KillPoint::AfterWrite(w)) = point;
    let what = if w == 0 {
        "the saga's creation".to_owned()
    } else if w == 2 * n + 1 {
        "the saga's end (Done)".to_owned()
    } else if w % 2 == 1 {
        format!("step {}'s BEGIN", w.div_ceil(2))
    } else {
        format!("step {}'s outcome", w / 2)
    };
    match point {
        KillPoint::BeforeWrite(_) => format!("killed before {what}"),
        KillPoint::AfterWrite(_) => format!("killed after {what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_scenarios_and_the_suite_is_large_enough() {
        let a = serde_json::to_string(&scenarios(7, false)).expect("serializes");
        let b = serde_json::to_string(&scenarios(7, false)).expect("serializes");
        assert_eq!(a, b);
        let all = scenarios(7, false);
        assert!(all.len() >= 200, "{}", all.len());
        let quick = scenarios(7, true);
        assert_eq!(quick.len(), QUICK_PER_KIND * Kind::ALL.len());
        assert!(quick.len() >= 50);
        let ids: std::collections::BTreeSet<&str> = all.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids.len(), all.len(), "ids are unique");
        for kind in Kind::ALL {
            assert!(all.iter().any(|s| s.kind == kind), "{kind}");
        }
    }

    #[test]
    fn kill_points_cover_every_boundary_once() {
        let points = kill_points(3);
        assert_eq!(points.len(), 8 + 3 + 1);
        let distinct: std::collections::BTreeSet<String> =
            points.iter().map(ToString::to_string).collect();
        assert_eq!(distinct.len(), points.len());
        assert_eq!(KillPoint::BeforeWrite(0).effects_done(3), 0);
        assert_eq!(KillPoint::AfterWrite(1).effects_done(3), 0);
        assert_eq!(KillPoint::BeforeWrite(2).effects_done(3), 1);
        assert_eq!(KillPoint::AfterWrite(7).effects_done(3), 3);
    }
}
