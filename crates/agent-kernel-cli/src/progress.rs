//! Progress of multi-step plans on stderr, shown only when stderr is a terminal.

use agent_kernel::{Observer, SagaEvent};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Shows a bar for plans of at least this many steps.
const MIN_STEPS_FOR_BAR: usize = 2;

/// An [`Observer`] that drives a progress bar.
pub(crate) struct StepProgress {
    bar: ProgressBar,
}

impl StepProgress {
    /// A bar for a plan of `n_steps`; hidden when stderr is not a terminal.
    pub(crate) fn new(n_steps: usize) -> Self {
        if n_steps < MIN_STEPS_FOR_BAR {
            return Self::hidden();
        }
        // indicatif draws nothing when the target is not a terminal.
        let bar = ProgressBar::with_draw_target(Some(n_steps as u64), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} {msg}")
                .expect("the template is valid")
                .progress_chars("=> "),
        );
        Self { bar }
    }

    /// No bar at all.
    pub(crate) fn hidden() -> Self {
        Self {
            bar: ProgressBar::hidden(),
        }
    }

    /// Removes the bar.
    pub(crate) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Observer for StepProgress {
    fn on_event(&self, event: &SagaEvent<'_>) {
        match event {
            SagaEvent::StepFinished { tool, status, .. } => {
                self.bar.inc(1);
                self.bar.set_message(format!("{tool} {status}"));
            }
            SagaEvent::Compensating { .. } => self.bar.set_message("compensating"),
            SagaEvent::StepCompensated { tool, status, .. } => {
                self.bar.set_message(format!("{tool} {status}"));
            }
            _ => {}
        }
    }
}
