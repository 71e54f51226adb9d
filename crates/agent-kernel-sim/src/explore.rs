//! Exploring a seed: its scenario run once without a fault, then once for every point it
//! reached and every kind of fault there; a failing case shrunk to the smallest scenario
//! that still fails.

use std::path::Path;

use crate::process::{Fault, FaultKind};
use crate::run::{Case, CaseOutcome, run_case};
use crate::scenario::{Rng, Scenario};

/// How far into a `recover` its fault may be placed: recovering a few sagas reaches about
/// this many points.
pub const RECOVERY_POINTS_TRIED: u64 = 12;

/// How far into the operator's actions its fault may be placed: an undo of a saga of three
/// steps reaches about this many points.
pub const OPERATOR_POINTS_TRIED: u64 = 10;

/// What exploring one seed found.
#[derive(Debug, Clone, Default)]
pub struct SeedReport {
    /// The seed.
    pub seed: u64,
    /// Cases run.
    pub cases: u64,
    /// Faults that fired (a kill, an I/O error, a failed effect or compensation).
    pub faults_fired: u64,
    /// Log writes, effects and compensations the cases reached in all.
    pub points: u64,
    /// The first failing case, shrunk, with what it did.
    pub failure: Option<(Case, CaseOutcome)>,
}

/// Runs every case of `seed` in `dir`, stopping at the first that fails.
///
/// # Errors
///
/// When the harness itself fails (a log that cannot be opened).
pub fn explore_seed(seed: u64, dir: &Path) -> anyhow::Result<SeedReport> {
    explore_seed_as(seed, dir, |_| {})
}

/// [`explore_seed`], with the seed's scenario changed by `change` first (the rest of what
/// the seed draws unchanged): a seed found before the scenario had some part can be
/// replayed without it.
///
/// # Errors
///
/// As [`explore_seed`].
pub fn explore_seed_as(
    seed: u64,
    dir: &Path,
    change: impl FnOnce(&mut Scenario),
) -> anyhow::Result<SeedReport> {
    let mut rng = Rng::new(seed);
    let mut scenario = Scenario::generate(&mut rng);
    change(&mut scenario);
    let schedule_seed = rng.next_u64();
    let mut report = SeedReport {
        seed,
        ..SeedReport::default()
    };
    for case in cases(&scenario, schedule_seed, &mut rng, dir, &mut report)? {
        let outcome = run_case(&case, dir)?;
        report.cases += 1;
        report.faults_fired += outcome.faults_fired;
        report.points += outcome.points;
        if !outcome.violations.is_empty() {
            report.failure = Some(shrink(case, outcome, dir)?);
            break;
        }
    }
    Ok(report)
}

/// The cases of a scenario: no fault (run first, to count the points), then each point and
/// each kind, then a power loss after each point (at durability `full` or `normal`, half
/// each), half of them with a `recover` killed at a point `rng` picks, and, where the
/// scenario has an operator, half of them with an operator's fault at a point `rng` picks
/// (drawn after the `recover`'s, only then: a scenario without an operator draws as before
/// operators existed).
fn cases(
    scenario: &Scenario,
    schedule_seed: u64,
    rng: &mut Rng,
    dir: &Path,
    report: &mut SeedReport,
) -> anyhow::Result<Vec<Case>> {
    let clean = Case {
        scenario: scenario.clone(),
        schedule_seed,
        fault: None,
        recovery_fault: None,
        operator_fault: None,
    };
    let outcome = run_case(&clean, dir)?;
    report.cases += 1;
    report.points += outcome.points;
    if !outcome.violations.is_empty() {
        report.failure = Some((clean, outcome));
        return Ok(Vec::new());
    }
    let mut cases = Vec::new();
    // The kinds that apply anywhere first, at every point, then the hangs at tools' points:
    // the order, and so the numbers drawn, of the cases before hangs existed.
    let anywhere = (0..outcome.points).flat_map(|at| FaultKind::ANYWHERE.map(|kind| (at, kind)));
    let hangs = (0..outcome.points)
        .filter(|at| {
            !outcome
                .log_writes
                .get(*at as usize)
                .copied()
                .unwrap_or(true)
        })
        .flat_map(|at| {
            FaultKind::ALL
                .into_iter()
                .filter(|kind| !kind.applies_at_log_write())
                .map(move |kind| (at, kind))
        });
    // Then a power loss at every point (added last, so the cases before draw as they did
    // before power losses existed), at either durability and losing what `rng` says.
    let faults: Vec<(u64, Option<FaultKind>)> = anywhere
        .chain(hangs)
        .map(|(at, kind)| (at, Some(kind)))
        .chain((0..outcome.points).map(|at| (at, None)))
        .collect();
    for (at, kind) in faults {
        let kind = kind.unwrap_or_else(|| power_loss(rng, outcome.points));
        let recovery_fault = rng.chance(50).then(|| Fault {
            at: rng.below(RECOVERY_POINTS_TRIED),
            kind: if rng.chance(50) {
                FaultKind::CrashBefore
            } else {
                FaultKind::CrashAfter
            },
        });
        let operator_fault = (scenario.has_operator() && rng.chance(50)).then(|| Fault {
            at: rng.below(OPERATOR_POINTS_TRIED),
            kind: FaultKind::ANYWHERE[rng.below(FaultKind::ANYWHERE.len() as u64) as usize],
        });
        cases.push(Case {
            scenario: scenario.clone(),
            schedule_seed,
            fault: Some(Fault { at, kind }),
            recovery_fault,
            operator_fault,
        });
    }
    Ok(cases)
}

/// A power loss, at `full` or `normal` (half each), losing up to every one of about
/// `points` log writes and head file moves at `normal`.
fn power_loss(rng: &mut Rng, points: u64) -> FaultKind {
    if rng.chance(50) {
        return FaultKind::PowerLossFull {
            head_behind: rng.chance(50),
        };
    }
    let mut up_to_every = || u16::try_from(rng.below(points + 2)).unwrap_or(u16::MAX);
    FaultKind::PowerLossNormal {
        writes_lost: up_to_every(),
        head_back: up_to_every(),
    }
}

/// The smallest case found that still fails: sagas, steps and outside writes dropped one
/// at a time while some fault still breaks an invariant.
fn shrink(case: Case, outcome: CaseOutcome, dir: &Path) -> anyhow::Result<(Case, CaseOutcome)> {
    let mut best = (case, outcome);
    'smaller: loop {
        for scenario in best.0.scenario.smaller() {
            if let Some(found) = first_failure(&scenario, &best.0, dir)? {
                best = found;
                continue 'smaller;
            }
        }
        return Ok(best);
    }
}

/// The first failing case of `scenario` with `like`'s schedule and recovery fault: each
/// kind of fault at each point, and a power loss as `like`'s.
fn first_failure(
    scenario: &Scenario,
    like: &Case,
    dir: &Path,
) -> anyhow::Result<Option<(Case, CaseOutcome)>> {
    let mut case = Case {
        scenario: scenario.clone(),
        schedule_seed: like.schedule_seed,
        fault: None,
        recovery_fault: like.recovery_fault,
        operator_fault: like.operator_fault,
    };
    let outcome = run_case(&case, dir)?;
    if !outcome.violations.is_empty() {
        return Ok(Some((case, outcome)));
    }
    for at in 0..outcome.points {
        let log_write = outcome.log_writes.get(at as usize).copied().unwrap_or(true);
        let power_loss = like
            .fault
            .map(|fault| fault.kind)
            .filter(|kind| kind.is_power_loss());
        for kind in FaultKind::ALL.into_iter().chain(power_loss) {
            if log_write && !kind.applies_at_log_write() {
                continue;
            }
            case.fault = Some(Fault { at, kind });
            let outcome = run_case(&case, dir)?;
            if !outcome.violations.is_empty() {
                return Ok(Some((case, outcome)));
            }
        }
    }
    Ok(None)
}
