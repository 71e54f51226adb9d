//! The numbers: per kind and overall, for each side, and the documents they are written to
//! (`results.json`, `results.md`).

use std::fmt::Write as _;

use serde::Serialize;

use crate::run::{ScenarioResult, SideResult};
use crate::scenario::Kind;

/// One side's numbers over a set of scenarios.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Tally {
    /// Scenarios.
    pub(crate) scenarios: usize,
    /// Scenarios whose world ended as they require.
    pub(crate) successes: usize,
    /// Scenarios that left the world half-changed.
    pub(crate) corrupt: usize,
    /// Scenarios in which a forbidden effect happened.
    pub(crate) attacks_accepted: usize,
    /// Effects that happened more than once, summed.
    pub(crate) duplicate_effects: u32,
    /// Later writers' changes lost, summed.
    pub(crate) lost_updates: u32,
    /// Scenarios the kernel left for an operator.
    pub(crate) operator_attention: usize,
    /// Median step latency, in milliseconds.
    pub(crate) p50_step_ms: Option<f64>,
    /// 99th percentile step latency, in milliseconds.
    pub(crate) p99_step_ms: Option<f64>,
    /// Steps timed.
    pub(crate) steps_timed: usize,
}

impl Tally {
    fn of<'a>(sides: impl Iterator<Item = &'a SideResult>) -> Tally {
        let mut tally = Tally::default();
        let mut latencies = Vec::new();
        for side in sides {
            tally.scenarios += 1;
            tally.successes += usize::from(side.success);
            tally.corrupt += usize::from(side.corrupt);
            tally.attacks_accepted += usize::from(side.attack_accepted);
            tally.duplicate_effects += side.duplicate_effects;
            tally.lost_updates += side.lost_updates;
            tally.operator_attention += usize::from(side.operator_attention);
            latencies.extend_from_slice(&side.run.latencies_us);
        }
        latencies.sort_unstable();
        tally.steps_timed = latencies.len();
        tally.p50_step_ms = percentile(&latencies, 0.50);
        tally.p99_step_ms = percentile(&latencies, 0.99);
        tally
    }

    /// Success rate, in percent.
    pub(crate) fn success_rate(&self) -> f64 {
        if self.scenarios == 0 {
            return 0.0;
        }
        100.0 * self.successes as f64 / self.scenarios as f64
    }

    /// Whether the kernel kept every promise the suite checks.
    pub(crate) fn clean(&self) -> bool {
        self.corrupt == 0
            && self.attacks_accepted == 0
            && self.duplicate_effects == 0
            && self.lost_updates == 0
            && self.successes == self.scenarios
    }
}

/// The nearest-rank percentile of sorted microseconds, in milliseconds.
fn percentile(sorted_us: &[u64], q: f64) -> Option<f64> {
    if sorted_us.is_empty() {
        return None;
    }
    let rank = ((q * sorted_us.len() as f64).ceil() as usize).clamp(1, sorted_us.len());
    Some(sorted_us[rank - 1] as f64 / 1000.0)
}

/// One row of the summary: a kind (or all), both sides.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Row {
    /// The kind, or `all`.
    pub(crate) kind: String,
    /// Through the kernel.
    pub(crate) kernel: Tally,
    /// The tools called directly.
    pub(crate) baseline: Tally,
}

/// The summary rows: each kind with scenarios, then all.
pub(crate) fn summary(results: &[ScenarioResult]) -> Vec<Row> {
    let mut rows: Vec<Row> = Kind::ALL
        .iter()
        .filter(|kind| results.iter().any(|r| r.scenario.kind == **kind))
        .map(|kind| {
            let of_kind = || results.iter().filter(|r| r.scenario.kind == *kind);
            Row {
                kind: kind.name().to_owned(),
                kernel: Tally::of(of_kind().map(|r| &r.kernel)),
                baseline: Tally::of(of_kind().map(|r| &r.baseline)),
            }
        })
        .collect();
    rows.push(Row {
        kind: "all".to_owned(),
        kernel: Tally::of(results.iter().map(|r| &r.kernel)),
        baseline: Tally::of(results.iter().map(|r| &r.baseline)),
    });
    rows
}

fn ms(value: Option<f64>) -> String {
    value.map_or_else(|| "n/a".to_owned(), |ms| format!("{ms:.2}"))
}

/// The summary as a Markdown table, kernel / baseline in each cell.
pub(crate) fn markdown(rows: &[Row], header: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{header}\n");
    let _ = writeln!(
        out,
        "Each cell: **kernel** / baseline (the same tools called directly, no kernel).\n"
    );
    let _ = writeln!(
        out,
        "| kind | scenarios | success | residual corruption | accepted attacks | duplicate effects | lost updates | left for an operator | p50 step (ms) | p99 step (ms) |"
    );
    let _ = writeln!(
        out,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for row in rows {
        let (k, b) = (&row.kernel, &row.baseline);
        let kind = if row.kind == "all" {
            "**all**".to_owned()
        } else {
            row.kind.clone()
        };
        let _ = writeln!(
            out,
            "| {kind} | {} | **{:.0}%** / {:.0}% | **{}** / {} | **{}** / {} | **{}** / {} | **{}** / {} | **{}** / {} | **{}** / {} | **{}** / {} |",
            k.scenarios,
            k.success_rate(),
            b.success_rate(),
            k.corrupt,
            b.corrupt,
            k.attacks_accepted,
            b.attacks_accepted,
            k.duplicate_effects,
            b.duplicate_effects,
            k.lost_updates,
            b.lost_updates,
            k.operator_attention,
            b.operator_attention,
            ms(k.p50_step_ms),
            ms(b.p50_step_ms),
            ms(k.p99_step_ms),
            ms(b.p99_step_ms),
        );
    }
    out
}
