//! Cooperative cancellation of a running saga.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// A request to stop a saga at the next step boundary.
///
/// The engine checks it before each step: once it is set, no further step begins; the steps
/// that ran are compensated and the saga ends `FailedRolledBack`, with the reason recorded
/// on the step that did not run. A step already running is not interrupted (tools are
/// cancelled cooperatively, by their timeouts).
#[derive(Debug, Default)]
pub struct Cancellation {
    requested: AtomicBool,
    reason: Mutex<Option<String>>,
    /// Wakes [`Cancellation::cancelled`].
    notify: tokio::sync::Notify,
}

impl Cancellation {
    /// A token nobody has cancelled yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the saga to stop; the first reason given is kept.
    pub fn cancel(&self, reason: impl Into<String>) {
        let mut kept = self
            .reason
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if kept.is_none() {
            *kept = Some(reason.into());
        }
        self.requested.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// Completes once a stop is asked for (at once if it was already), for a driver that
    /// waits between steps (for an operator's decision, say).
    pub async fn cancelled(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before the flag is read, so a cancel in between still wakes it.
            notified.as_mut().enable();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }

    /// Whether a stop was asked for.
    pub fn is_cancelled(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    /// Why, if a stop was asked for.
    pub fn reason(&self) -> Option<String> {
        self.reason
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}
