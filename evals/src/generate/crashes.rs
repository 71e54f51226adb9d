//! Scenarios of kills: a process killed at a chosen log write, during a run or a rollback,
//! and later writers and slow commands around recovery.

#[allow(clippy::wildcard_imports)]
use super::*;

/// A SIGKILL at every log boundary of chains of 1 to 4 mutating calls, two chains of each
/// length (the world must be as before, or complete exactly when the saga is `Done`), and
/// at every write of chains of 1 to 3 mutating calls whose last call fails, their rollback
/// included (the world must be as before).
pub(super) fn crashes(maker: &mut Gen) -> Vec<Scenario> {
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
pub(super) fn recovery_crash(
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
pub(super) fn rollback_kills(maker: &mut Gen) -> Vec<Scenario> {
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
pub(super) fn later_writers(maker: &mut Gen) -> Vec<Scenario> {
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
pub(super) fn slow_commands(maker: &mut Gen) -> Vec<Scenario> {
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
