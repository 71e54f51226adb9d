//! The real clock and id source, for production use.

use std::time::{SystemTime, UNIX_EPOCH};

use agent_kernel_api::{Clock, IdSource, SagaId};

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX))
            // A clock set before 1970 is wrong, not fatal: record the epoch.
            .unwrap_or(0)
    }
}

/// Saga ids from UUID version 7: unique across processes, sorted by creation time.
#[derive(Debug, Clone, Copy, Default)]
pub struct UuidV7Ids;

impl IdSource for UuidV7Ids {
    fn new_saga_id(&self) -> SagaId {
        SagaId::new(uuid::Uuid::now_v7().to_string())
    }
}
