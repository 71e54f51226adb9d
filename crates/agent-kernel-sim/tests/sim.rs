//! The simulator over this build: a seed replays exactly, and the seeds explored find
//! nothing broken (the CI step runs many more, in release, and the planted bugs).

use agent_kernel_sim::{
    Case, Fault, FaultKind, Rng, Scenario, explore_seed, run_case, scratch_dir,
};

/// Seeds explored here (each runs every point of its scenario with each kind of fault).
const SEEDS: u64 = 12;

#[test]
fn one_seed_makes_one_history() {
    let dir = scratch_dir().expect("a scratch folder");
    let mut rng = Rng::new(41);
    let scenario = Scenario::generate(&mut rng);
    let mut case = Case {
        scenario,
        schedule_seed: rng.next_u64(),
        fault: None,
        recovery_fault: None,
    };
    let clean = run_case(&case, dir.path()).expect("runs");
    assert!(clean.points > 2, "{clean:?}");
    case.fault = Some(Fault {
        at: clean.points / 2,
        kind: FaultKind::CrashAfter,
    });
    case.recovery_fault = Some(Fault {
        at: 1,
        kind: FaultKind::CrashBefore,
    });
    let first = run_case(&case, dir.path()).expect("runs");
    let second = run_case(&case, dir.path()).expect("runs");
    assert_eq!(first.history, second.history);
    assert_eq!(first.violations, second.violations);
    assert!(first.faults_fired >= 1, "{first:?}");
    assert!(
        first
            .history
            .iter()
            .any(|line| line.contains("<- killed after it")),
        "{:#?}",
        first.history
    );
}

#[test]
fn the_seeds_explored_find_nothing_broken() {
    let dir = scratch_dir().expect("a scratch folder");
    let mut faults = 0;
    for seed in 0..SEEDS {
        let report = explore_seed(seed, dir.path()).expect("runs");
        if let Some((case, outcome)) = &report.failure {
            panic!(
                "seed {seed}: {:#?}\n{}\nfault {:?}, recovery fault {:?}\n{:#?}",
                outcome.violations, case.scenario, case.fault, case.recovery_fault, outcome.history
            );
        }
        assert!(report.cases > 1, "{report:?}");
        faults += report.faults_fired;
    }
    assert!(faults > SEEDS * 3, "{faults} faults fired");
}
