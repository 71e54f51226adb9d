//! Integration tests of the SQLite log: opening, refusing, writing, reading back.

mod approvals;
mod audit;
mod group;
mod open;
mod records;
mod schema;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use agent_kernel_api::{
    BeginStep, Clock, Durability, EffectClass, LogWrite, NewSaga, Owner, SagaId, SagaState, Undo,
};
use agent_kernel_txlog::{LogOptions, SqliteLog};
use serde_json::json;

pub(crate) struct StepClock(AtomicI64);

impl Clock for StepClock {
    fn now_ms(&self) -> i64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

pub(crate) fn open(path: &Path) -> Result<SqliteLog, agent_kernel_api::TxError> {
    SqliteLog::open(
        path,
        LogOptions {
            durability: Durability::Full,
            clock: Arc::new(StepClock(AtomicI64::new(1_000))),
        },
    )
}

pub(crate) fn owner(pid: u32) -> Owner {
    Owner {
        host: "h".into(),
        boot_id: "b".into(),
        pid,
        start_ticks: 7,
    }
}

pub(crate) fn new_saga(id: &str) -> LogWrite {
    LogWrite::CreateSaga(NewSaga {
        saga_id: SagaId::new(id),
        name: Some("n".into()),
        actor: None,
        owner: owner(1),
        n_steps: 3,
        state: SagaState::Acting,
        dry_run: false,
        require_actor_idle: false,
    })
}

pub(crate) fn begin(id: &str, step_seq: u32, key: Option<&str>, hash: &str) -> LogWrite {
    LogWrite::BeginStep(BeginStep {
        saga_id: SagaId::new(id),
        step_seq,
        tool_id: "fs.write".into(),
        tool_version: "1.0.0".into(),
        effect: EffectClass::Mutating,
        args: json!({"path": "a.txt", "content": "x"}),
        args_hash: hash.into(),
        idempotency_key: key.map(str::to_owned),
        undo: Undo {
            data: json!({"existed": true}),
            blob: Some(b"previous \x00 bytes".to_vec()),
        },
    })
}
