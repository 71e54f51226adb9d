//! Injected time and identity.

use crate::SagaId;

/// The source of wall-clock time for everything the kernel records.
///
/// Injected so that tests and replays are deterministic.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
}

/// The source of saga ids.
///
/// Ids must be unique across processes sharing one log; implementations based on
/// time-ordered UUIDs (v7) also make ids sort by creation time.
pub trait IdSource: Send + Sync + 'static {
    /// A new, never before returned saga id.
    fn new_saga_id(&self) -> SagaId;
}
