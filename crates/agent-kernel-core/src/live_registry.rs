//! The live sagas a process holds open ([`LiveRegistry`]), each behind its own lock so
//! that one saga takes one call at a time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use agent_kernel_api::SagaId;
use tokio::time::Instant;

use crate::in_flight::SagaInFlight;

/// One open live saga in the registry.
#[derive(Debug)]
pub(crate) struct LiveEntry {
    /// What a denied call does to the saga.
    pub(crate) on_denied: agent_kernel_api::OnDenied,
    /// `None` once it has ended.
    pub(crate) saga: tokio::sync::Mutex<Option<SagaInFlight>>,
    /// When it was last begun, called or looked at.
    pub(crate) touched: Mutex<Instant>,
    /// Told when the saga leaves the registry, so that its idle watch ends with it instead
    /// of sleeping out its timeout (a settled saga holds nothing in the process).
    pub(crate) ended: Arc<tokio::sync::Notify>,
}

impl LiveEntry {
    pub(crate) fn touch(&self) {
        *self.touched.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    pub(crate) fn touched(&self) -> Instant {
        *self.touched.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The live sagas this process holds open, bounded by `[limits] open_sagas_max`.
#[derive(Debug, Default)]
pub(crate) struct LiveRegistry {
    pub(crate) sagas: Mutex<HashMap<SagaId, Arc<LiveEntry>>>,
}

impl LiveRegistry {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SagaId, Arc<LiveEntry>>> {
        self.sagas.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn get(&self, saga_id: &SagaId) -> Option<Arc<LiveEntry>> {
        self.lock().get(saga_id).cloned()
    }

    /// Takes the saga out and ends its idle watch.
    pub(crate) fn remove(&self, saga_id: &SagaId) {
        let removed = self.lock().remove(saga_id);
        if let Some(entry) = removed {
            // A permit is kept if the watch is not waiting right now.
            entry.ended.notify_one();
        }
    }

    /// Whether `saga_id` is open here.
    pub(crate) fn contains(&self, saga_id: &SagaId) -> bool {
        self.lock().contains_key(saga_id)
    }

    /// The ids of the open sagas.
    pub(crate) fn ids(&self) -> Vec<SagaId> {
        self.lock().keys().cloned().collect()
    }
}
