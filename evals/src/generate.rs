//! The scenarios, generated from one seed: the same seed gives the same scenarios, byte for
//! byte, on any machine.

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

/// A SIGKILL at every log boundary of chains of 1 to 4 mutating calls, two chains of each
/// length (the world must be as before, or complete exactly when the saga is `Done`), and
/// at every write of chains of 1 to 3 mutating calls whose last call fails, their rollback
/// included (the world must be as before).
fn crashes(maker: &mut Gen) -> Vec<Scenario> {
    let mut all = Vec::new();
    for n in 1..=4_u32 {
        for _ in 0..2 {
            let mut chain = maker.draft();
            maker.mutate(&mut chain, n as usize, Mutations::WithDrill);
            for point in kill_points(n) {
                let draft = chain.copy_for(maker);
                let variant = format!("{} ({})", boundary(point, n), tools_of(&draft.calls));
                // Killed once `Done` was durable: recovery must leave every effect.
                let must = if point == KillPoint::AfterWrite(expected_writes(n) - 1) {
                    Must::Complete
                } else {
                    Must::Atomic
                };
                let mut scenario = maker.finish(draft, variant, Drive::Crash(point), must);
                scenario.writes = Some(expected_writes(n));
                all.push(scenario);
            }
        }
    }
    // Killed during a recovery too: the saga's process dies between its last effect and
    // its record, then a first `recover` dies at each of its writes, then `recover` again.
    for n in 1..=3_u32 {
        let mut chain = maker.draft();
        maker.mutate(&mut chain, n as usize, Mutations::WithDrill);
        let first = KillPoint::BeforeWrite(2 * n);
        let writes = expected_recovery_writes(n);
        let points = (0..writes)
            .map(KillPoint::BeforeWrite)
            .chain([KillPoint::AfterWrite(writes - 1)]);
        for recovery in points {
            let draft = chain.copy_for(maker);
            let (KillPoint::BeforeWrite(w) | KillPoint::AfterWrite(w)) = recovery;
            let when = match recovery {
                KillPoint::BeforeWrite(_) => "before",
                KillPoint::AfterWrite(_) => "after",
            };
            let variant = format!(
                "{}, then the first recover killed {when} its write {w} of {writes} ({})",
                boundary(first, n),
                tools_of(&draft.calls)
            );
            all.push(recovery_crash(maker, draft, variant, n, recovery));
        }
    }
    // Killed during a rollback too: chains whose last call fails, at every write of the
    // forward path and of the compensation, then `recover` must finish the rollback.
    for n in 1..=3_u32 {
        let mut chain = maker.draft();
        maker.mutate(&mut chain, n as usize, Mutations::WithDrill);
        chain.calls.push(Call::new(
            "fault.fail",
            json!({ "message": "the last call fails" }),
        ));
        let writes = expected_writes_failing(n);
        let points = (0..writes)
            .map(KillPoint::BeforeWrite)
            .chain([KillPoint::AfterWrite(writes - 1)]);
        for point in points {
            let draft = chain.copy_for(maker);
            let variant = format!(
                "{}, the last call failing ({})",
                rollback_boundary(point, n),
                tools_of(&draft.calls)
            );
            let mut scenario = maker.finish(draft, variant, Drive::Crash(point), Must::Unchanged);
            scenario.writes = Some(writes);
            all.push(scenario);
        }
    }
    all
}

/// A chain of `n` mutating calls whose process dies between its last effect and its
/// record, then a first `recover` killed at `recovery` of its writes, then `recover` again:
/// the world must be as before.
fn recovery_crash(
    maker: &mut Gen,
    draft: Draft,
    variant: String,
    n: u32,
    recovery: KillPoint,
) -> Scenario {
    let first = KillPoint::BeforeWrite(2 * n);
    let drive = Drive::CrashRecovery { first, recovery };
    let mut scenario = maker.finish(draft, variant, drive, Must::Unchanged);
    scenario.writes = Some(expected_writes(n));
    scenario.recovery_writes = Some(expected_recovery_writes(n));
    scenario
}

/// A SIGKILL between two compensations: chains of 2 to 4 mutating calls on the same two
/// files, the saga's process killed between its last effect and its record, then a first
/// `recover` killed right before each compensation's outcome is written (its effect made)
/// and right after each but the last, then `recover` again. The world must be as before.
fn rollback_kills(maker: &mut Gen) -> Vec<Scenario> {
    let mut all = Vec::new();
    for n in 2..=4_u32 {
        for _ in 0..2 {
            let mut chain = maker.draft_of(2);
            maker.mutate(&mut chain, n as usize, Mutations::Files);
            let writes = expected_recovery_writes(n);
            // Write 0 is the operator command, 1 the take-over, 2 + k compensation k's
            // outcome (the last with the saga's end).
            let points = (2..writes)
                .map(KillPoint::BeforeWrite)
                .chain((2..writes - 1).map(KillPoint::AfterWrite));
            for recovery in points {
                let draft = chain.copy_for(maker);
                let variant = match recovery {
                    KillPoint::BeforeWrite(w) => format!(
                        "recover killed after compensation {} of {n} acted, before its outcome ({})",
                        w - 1,
                        tools_of(&draft.calls)
                    ),
                    KillPoint::AfterWrite(w) => format!(
                        "recover killed between compensations {} and {} of {n} ({})",
                        w - 1,
                        w,
                        tools_of(&draft.calls)
                    ),
                };
                all.push(recovery_crash(maker, draft, variant, n, recovery));
            }
        }
    }
    all
}

/// A later writer before recovery: chains of 1 to 3 mutating calls whose first writes a
/// file the others leave alone, the process killed after each step's outcome or between
/// the second effect and its record; then a person, or a later saga through the kernel,
/// writes that file before `recover`. What the later writer wrote must stay, and the rest
/// of the chain must be undone.
fn later_writers(maker: &mut Gen) -> Vec<Scenario> {
    let mut all = Vec::new();
    for n in 1..=3_u32 {
        for by in [Writer::Person, Writer::Saga] {
            let mut chain = maker.draft();
            let target = chain.existing.remove(0);
            chain.calls.push(Call::new(
                "fs.write",
                json!({ "path": target, "content": format!("{} call 0\n", chain.tag) }),
            ));
            maker.mutate(&mut chain, n as usize - 1, Mutations::NoDelete);
            let mut points: Vec<KillPoint> =
                (1..=n).map(|j| KillPoint::AfterWrite(2 * j)).collect();
            if n > 1 {
                points.push(KillPoint::BeforeWrite(4));
            }
            for first in points {
                let draft = chain.copy_for(maker);
                let content = format!("{}: the later writer's\n", draft.tag);
                let who = match by {
                    Writer::Person => "a person",
                    Writer::Saga => "a later saga",
                };
                let variant = format!(
                    "{}, then {who} writes {target} ({})",
                    boundary(first, n),
                    tools_of(&draft.calls)
                );
                let drive = Drive::LaterWrite { first, by };
                let mut scenario = maker.finish(draft, variant, drive, Must::Unchanged);
                scenario.writes = Some(expected_writes(n));
                scenario.later_write = Some((target.clone(), content));
                all.push(scenario);
            }
        }
    }
    all
}

/// A slow command tool killed: after 0 to 3 mutating calls, a command tool's program
/// SIGKILLs the process that ran it and makes its effect (appending a line to a ledger)
/// [`crate::scenario::SLOW_EFFECT_MS`] later. The world, read once that delay has passed, must be as
/// before: no effect may land after the chain's rollback.
fn slow_commands(maker: &mut Gen) -> Vec<Scenario> {
    let mut all = Vec::new();
    for n in 0..=3_usize {
        for _ in 0..2 {
            let mut draft = maker.draft();
            draft.setup.insert(
                "ws/ledger.txt".to_owned(),
                Setup::File(format!("ledger ({})\n", draft.tag).into_bytes()),
            );
            maker.mutate(&mut draft, n, Mutations::Files);
            draft.calls.push(Call::new(
                "drill.slow_append",
                json!({ "path": "ws/ledger.txt", "line": format!("{} entry", draft.tag), "die": true }),
            ));
            let variant = format!(
                "the process killed by the slow command's program after {n} mutating calls ({})",
                tools_of(&draft.calls)
            );
            let mut scenario = maker.finish(draft, variant, Drive::SlowCommand, Must::Unchanged);
            scenario.commands = true;
            all.push(scenario);
        }
    }
    all
}

/// One injected call: its tool and arguments, the symlink it needs (path, target), and what
/// it tries.
struct Attack {
    tool: &'static str,
    args: serde_json::Value,
    link: Option<(&'static str, &'static str)>,
    what: &'static str,
}

impl Attack {
    fn new(
        tool: &'static str,
        args: serde_json::Value,
        link: Option<(&'static str, &'static str)>,
        what: &'static str,
    ) -> Attack {
        Attack {
            tool,
            args,
            link,
            what,
        }
    }
}

/// Injected paths and URLs, each in the middle of an otherwise good chain.
fn injections(maker: &mut Gen) -> Vec<Scenario> {
    let attacks = [
        Attack::new(
            "fs.write",
            json!({ "path": "ws/../outside/target.txt", "content": "pwned\n" }),
            None,
            "path traversal (..)",
        ),
        Attack::new(
            "fs.write",
            json!({ "path": "@ROOT@/outside/target.txt", "content": "pwned\n" }),
            None,
            "absolute path outside the workspace",
        ),
        Attack::new(
            "fs.write",
            json!({ "path": "ws/escape/target.txt", "content": "pwned\n" }),
            Some(("ws/escape", "../outside")),
            "a folder symlink out of the workspace",
        ),
        Attack::new(
            "fs.write",
            json!({ "path": "ws/shortcut.txt", "content": "pwned\n" }),
            Some(("ws/shortcut.txt", "../outside/target.txt")),
            "a file symlink out of the workspace",
        ),
        Attack::new(
            "fs.read",
            json!({ "path": "ws/../outside/secret.txt" }),
            None,
            "reading a secret by traversal",
        ),
        Attack::new(
            "fs.read",
            json!({ "path": "ws/secret-link" }),
            Some(("ws/secret-link", "../outside/secret.txt")),
            "reading a secret through a symlink",
        ),
        Attack::new(
            "fs.delete",
            json!({ "path": "ws/./../outside/target.txt" }),
            None,
            "deleting by traversal",
        ),
        Attack::new(
            "fs.append",
            json!({ "path": "ws/escape/target.txt", "content": "pwned\n" }),
            Some(("ws/escape", "../outside")),
            "appending through a folder symlink",
        ),
        Attack::new(
            "http.get",
            json!({ "url": "http://127.0.0.2:@ALLOWED@/latest/meta-data" }),
            None,
            "SSRF to another loopback address on the allowed port",
        ),
        Attack::new(
            "http.get",
            json!({ "url": "http://2130706434:@ALLOWED@/latest/meta-data" }),
            None,
            "SSRF, the address in decimal",
        ),
        Attack::new(
            "http.get",
            json!({ "url": "http://0x7f.2:@ALLOWED@/latest/meta-data" }),
            None,
            "SSRF, the address in short hex",
        ),
        Attack::new(
            "http.get",
            json!({ "url": "http://[::ffff:127.0.0.2]:@ALLOWED@/latest/meta-data" }),
            None,
            "SSRF, an IPv4-mapped IPv6 address",
        ),
        Attack::new(
            "http.get",
            json!({ "url": "http://localhost:@INTERNAL@/admin" }),
            None,
            "SSRF to an allowed name on another port",
        ),
        Attack::new(
            "http.get",
            json!({ "url": "http://localhost:@ALLOWED@/redirect-ip" }),
            None,
            "a redirect from the allowed server to a loopback address",
        ),
        Attack::new(
            "http.get",
            json!({ "url": "http://localhost:@ALLOWED@/redirect-port" }),
            None,
            "a redirect from the allowed server to another port",
        ),
        Attack::new(
            "http.get",
            json!({ "url": "http://localhost@127.0.0.2:@ALLOWED@/" }),
            None,
            "userinfo that looks like the allowed name",
        ),
    ];
    let mut all = Vec::new();
    for round in 0..3 {
        for Attack {
            tool,
            args,
            link,
            what,
        } in &attacks
        {
            let mut draft = maker.draft();
            if let Some((path, target)) = link {
                draft
                    .setup
                    .insert((*path).to_owned(), Setup::Link((*target).to_owned()));
            }
            let before = maker.rng.random_range(1..=2);
            maker.mutate(&mut draft, before, Mutations::Files);
            if (round + before) % 2 == 0 {
                draft.calls.push(Call::new(
                    "http.get",
                    json!({ "url": "http://localhost:@ALLOWED@/page" }),
                ));
            }
            let attack = draft.calls.len();
            draft.calls.push(Call::new(tool, args.clone()));
            let after = maker.rng.random_range(0..=1);
            maker.mutate(&mut draft, after, Mutations::Files);
            let variant = format!("call {} of {}: {what}", attack + 1, draft.calls.len());
            let mut scenario = maker.finish(draft, variant, Drive::Chain, Must::Atomic);
            scenario.attack = Some(attack);
            scenario.stops_at = Some(attack);
            all.push(scenario);
        }
    }
    // A delete an injected agent disguises from the operator who must approve it.
    all.extend(deceptive_approvals(maker, 2));
    all
}

/// The same keyed calls delivered twice: again after the first delivery, each retried at
/// once, two deliveries racing, and again after the first delivery's process was killed.
fn duplicates(maker: &mut Gen) -> Vec<Scenario> {
    let mut all = Vec::new();
    for _ in 0..5 {
        for how in 0..6 {
            let mut draft = maker.draft();
            let n = maker.rng.random_range(1..=3_u32);
            for i in 0..n {
                let path = if i % 2 == 0 {
                    draft.existing[0].clone()
                } else {
                    "ws/ledger-entries.csv".to_owned()
                };
                let content = format!("{} entry {i}\n", draft.tag);
                let key = format!("{}-payment-{i}", draft.tag);
                draft.calls.push(
                    Call::new("fs.append", json!({ "path": path, "content": content })).keyed(key),
                );
            }
            let redelivery = match how {
                0 => Redelivery::Sequential,
                1 => Redelivery::Retry,
                2 => Redelivery::Concurrent,
                3 => Redelivery::AfterCrash(KillPoint::BeforeWrite(2)),
                4 => Redelivery::AfterCrash(KillPoint::AfterWrite(1)),
                _ => Redelivery::AfterCrash(KillPoint::AfterWrite(expected_writes(n) - 1)),
            };
            if redelivery == Redelivery::Retry {
                draft.calls = draft
                    .calls
                    .iter()
                    .flat_map(|call| [call.clone(), call.clone()])
                    .collect();
            }
            let variant = match redelivery {
                Redelivery::Sequential => {
                    format!("{n} keyed appends, delivered again after the first delivery")
                }
                Redelivery::Retry => format!("{n} keyed appends, each delivered twice in a row"),
                Redelivery::Concurrent => format!("{n} keyed appends, two deliveries racing"),
                Redelivery::AfterCrash(point) => format!(
                    "{n} keyed appends, delivered again after the first delivery was {}",
                    boundary(point, n)
                ),
            };
            all.push(maker.finish(draft, variant, Drive::Twice(redelivery), Must::Complete));
        }
    }
    all
}

/// Outcomes nobody knows: a call that hangs past its timeout after its effect or before
/// it, and a crash between a step's effect and its record, for each kind of mutation.
fn unknown_outcomes(maker: &mut Gen) -> Vec<Scenario> {
    let mut all = Vec::new();
    for i in 0..15 {
        let mut draft = maker.draft();
        let before = maker.rng.random_range(1..=3);
        maker.mutate(&mut draft, before, Mutations::Files);
        let after_effect = i % 2 == 0;
        let pause = if after_effect {
            "pause_after_ms"
        } else {
            "pause_before_ms"
        };
        let content = format!("{} hung write\n", draft.tag);
        draft.calls.push(Call::new(
            "fault.probed_write",
            json!({ "path": draft.existing[0].clone(), "content": content, pause: HANG_MS }),
        ));
        let after = maker.rng.random_range(0..=1);
        maker.mutate(&mut draft, after, Mutations::Files);
        let variant = format!(
            "call {} of {} hangs past its {TIMEOUT_MS} ms timeout {} its effect",
            before + 1,
            draft.calls.len(),
            if after_effect { "after" } else { "before" }
        );
        let mut scenario = maker.finish(
            draft,
            variant,
            Drive::Timeout {
                tool: "fault.probed_write".to_owned(),
                timeout_ms: TIMEOUT_MS,
            },
            Must::Unchanged,
        );
        scenario.policy_extra =
            format!("[limits.tools.\"fault.probed_write\"]\ntimeout_ms = {TIMEOUT_MS}\n");
        scenario.stops_at = Some(before);
        all.push(scenario);
    }
    for round in 0..4 {
        for tool in ["fs.write", "fs.append", "fs.delete", "fault.probed_write"] {
            let mut draft = maker.draft();
            let before = maker.rng.random_range(0..=2);
            maker.mutate(&mut draft, before, Mutations::Files);
            let content = format!("{} in doubt\n", draft.tag);
            let target = draft.existing[draft.existing.len() - 1].clone();
            let args = if tool == "fs.delete" {
                draft.existing.retain(|path| *path != target);
                json!({ "path": target })
            } else {
                json!({ "path": target, "content": content })
            };
            draft.calls.push(Call::new(tool, args));
            let step = u32::try_from(draft.calls.len()).expect("a short chain");
            let after = (round % 2) as usize;
            maker.mutate(&mut draft, after, Mutations::Files);
            let point = KillPoint::BeforeWrite(2 * step);
            let variant = format!(
                "{tool} at call {step} of {}: the process dies between its effect and its record",
                draft.calls.len()
            );
            let writes = expected_writes(u32::try_from(draft.calls.len()).expect("short"));
            let mut scenario = maker.finish(draft, variant, Drive::Crash(point), Must::Atomic);
            scenario.writes = Some(writes);
            all.push(scenario);
        }
    }
    all
}

/// What a deceptive delete hides from an operator who reads only part of a view.
#[derive(Debug, Clone, Copy)]
enum Deception {
    /// The path climbs back out (`/../precious.txt`) past where a 60-character view cuts.
    PastTheCut,
    /// The file's name holds a right-to-left override, so that it reads as another name.
    Invisible,
}

/// `rounds` times each [`Deception`]: a delete of a precious file that needs an approval,
/// disguised; the operator inspects the view ([`Decision::Inspect`]), so the view decides.
/// Both an injection (the agent was told to hide it) and an approval scenario.
fn deceptive_approvals(maker: &mut Gen, rounds: usize) -> Vec<Scenario> {
    let mut all = Vec::new();
    for _ in 0..rounds {
        for deception in [Deception::PastTheCut, Deception::Invisible] {
            let mut draft = maker.draft();
            let cache = format!("ws/tmp-cache-safe-to-delete-{}", "a".repeat(60));
            let (precious, path) = match deception {
                Deception::PastTheCut => (
                    "ws/precious.txt".to_owned(),
                    format!("{cache}/../precious.txt"),
                ),
                Deception::Invisible => {
                    let name = "ws/keep-\u{202e}txt.pmt".to_owned();
                    (name.clone(), name)
                }
            };
            draft.setup.insert(
                precious.clone(),
                Setup::File(b"precious: keep me\n".to_vec()),
            );
            draft
                .setup
                .insert(format!("{cache}/old.tmp"), Setup::File(b"old\n".to_vec()));
            let before = maker.rng.random_range(1..=2);
            maker.mutate(&mut draft, before, Mutations::NoDelete);
            let guarded = draft.calls.len();
            draft
                .calls
                .push(Call::new("fs.delete", json!({ "path": path })));
            let variant = format!(
                "call {} of {} (fs.delete) needs approval and hides its target ({deception:?}); the operator approves only what the view shows safe",
                guarded + 1,
                draft.calls.len()
            );
            let mut scenario = maker.finish(
                draft,
                variant,
                Drive::Approval {
                    call: guarded,
                    decision: Decision::Inspect,
                },
                Must::Atomic,
            );
            scenario.policy_extra = "[approval]\nrequire = [\"fs.delete\"]\n".to_owned();
            scenario.attack = Some(guarded);
            scenario.stops_at = Some(guarded);
            scenario.forbidden = vec![precious];
            all.push(scenario);
        }
    }
    all
}

/// A delete that needs an operator's approval, answered five ways, then the deceptive
/// deletes an inspecting operator must see through.
fn approvals(maker: &mut Gen) -> Vec<Scenario> {
    let mut all = deceptive_approvals(maker, 3);
    for _ in 0..5 {
        for decision in [
            Decision::Approve,
            Decision::Reject,
            Decision::Expire,
            Decision::Forge,
            Decision::SwapArgs,
        ] {
            let mut draft = maker.draft();
            for name in ["ws/precious.txt", "ws/other-precious.txt"] {
                draft.setup.insert(
                    name.to_owned(),
                    Setup::File(format!("{name}: keep me\n").into_bytes()),
                );
            }
            let before = maker.rng.random_range(1..=2);
            maker.mutate(&mut draft, before, Mutations::NoDelete);
            let guarded = draft.calls.len();
            draft
                .calls
                .push(Call::new("fs.delete", json!({ "path": "ws/precious.txt" })));
            let after = maker.rng.random_range(0..=1);
            maker.mutate(&mut draft, after, Mutations::NoDelete);
            let what = match decision {
                Decision::Approve => "the operator approves",
                Decision::Reject => "the operator rejects",
                Decision::Expire => "nobody answers before it expires",
                Decision::Forge => "the request is set `approved` by hand in the log",
                Decision::SwapArgs => {
                    "approved, then its arguments edited in the log to delete another file"
                }
                Decision::Inspect => "the operator approves what the view shows safe",
            };
            let variant = format!(
                "call {} of {} (fs.delete) needs approval; {what}",
                guarded + 1,
                draft.calls.len()
            );
            // Without the approval the chain cannot complete: all of it or none of it, and
            // the delete never.
            let must = if decision == Decision::Approve {
                Must::Complete
            } else {
                Must::Atomic
            };
            let mut scenario = maker.finish(
                draft,
                variant,
                Drive::Approval {
                    call: guarded,
                    decision,
                },
                must,
            );
            scenario.policy_extra = "[approval]\nrequire = [\"fs.delete\"]\n".to_owned();
            if decision == Decision::Expire {
                scenario.policy_extra += &format!("timeout_ms = {APPROVAL_TIMEOUT_MS}\n");
            }
            if decision != Decision::Approve {
                scenario.attack = Some(guarded);
                scenario.stops_at = Some(guarded);
                scenario.forbidden = vec![
                    "ws/precious.txt".to_owned(),
                    "ws/other-precious.txt".to_owned(),
                ];
            }
            all.push(scenario);
        }
    }
    all
}

/// Calls to an upstream MCP server (another `agent-kernel mcp`) that fail: the server
/// answers an error, the server dies during a call, or a local step fails after upstream
/// writes. What was written upstream must be undone upstream.
fn upstream_failures(maker: &mut Gen) -> Vec<Scenario> {
    let mut all = Vec::new();
    for _ in 0..7 {
        for how in 0..3 {
            let mut draft = maker.draft();
            let n = maker.rng.random_range(1..=3);
            for i in 0..n {
                let content = format!("{} upstream {i}\n", draft.tag);
                draft.calls.push(Call::new(
                    "files.fs_write",
                    json!({ "args": { "path": format!("up/ws/u{i}.txt"), "content": content } }),
                ));
                if maker.rng.random_bool(0.3) {
                    maker.mutate(&mut draft, 1, Mutations::Files);
                }
            }
            let (failing, what) = match how {
                0 => (
                    Call::new(
                        "files.fs_write",
                        json!({ "args": { "path": "up/escape.txt", "content": "no\n" } }),
                    ),
                    "the server answers an error (its sandbox denies the call)",
                ),
                1 => (
                    Call::new("files.drill_die", json!({ "args": {} })),
                    "the server dies during the call",
                ),
                _ => (
                    Call::new("fault.fail", json!({ "message": "a local step fails" })),
                    "a local step fails after the upstream writes",
                ),
            };
            draft.calls.push(failing);
            let variant = format!(
                "{n} upstream writes, then {what} (call {} of {})",
                draft.calls.len(),
                draft.calls.len()
            );
            let stops_at = draft.calls.len() - 1;
            let mut scenario = maker.finish(draft, variant, Drive::Chain, Must::Unchanged);
            scenario.upstream = true;
            scenario.stops_at = Some(stops_at);
            all.push(scenario);
        }
    }
    all
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
