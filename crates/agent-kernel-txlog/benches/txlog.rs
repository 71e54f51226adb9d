//! Criterion benches of the log: the cost of one steady-state step record
//! (a step's COMMIT and the next step's BEGIN in one transaction) under each durability mode,
//! and the writer thread's round trip alone.
//!
//! Run with `cargo bench -p agent-kernel-txlog`.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_kernel_api::{
    BeginStep, Clock, Durability, EffectClass, LogWrite, NewSaga, Owner, SagaId, SagaState,
    ToolOutput, TxLog, Undo,
};
use agent_kernel_txlog::{LogOptions, SqliteLog};
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;

struct WallClock;

impl Clock for WallClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| elapsed.as_millis() as i64)
            .unwrap_or(0)
    }
}

fn begin(saga_id: &SagaId, step_seq: u32) -> LogWrite {
    LogWrite::BeginStep(BeginStep {
        saga_id: saga_id.clone(),
        step_seq,
        tool_id: "fs.write".into(),
        tool_version: "1.0.0".into(),
        effect: EffectClass::Mutating,
        args: json!({"path": "workspace/a.txt", "content": "hello"}),
        args_hash: "0".repeat(64),
        idempotency_key: None,
        undo: Undo {
            data: json!({"existed": true}),
            blob: Some(vec![b'x'; 256]),
        },
        // One file of its own per step, as a step of `fs.write` claims.
        resources: vec![format!("file:/workspace/{saga_id}/{step_seq}")],
        duplicate_keys: Vec::new(),
        duplicate_check: None,
    })
}

fn step_records(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("commit_and_begin");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));
    for durability in [Durability::Normal, Durability::Full] {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = SqliteLog::open(
            &dir.path().join("bench.db"),
            LogOptions {
                durability,
                clock: Arc::new(WallClock),
            },
        )
        .expect("opens");
        let saga_id = SagaId::new("bench");
        runtime
            .block_on(log.write(vec![
                LogWrite::CreateSaga(NewSaga {
                    saga_id: saga_id.clone(),
                    name: None,
                    actor: None,
                    owner: Owner {
                        host: "bench".into(),
                        boot_id: "bench".into(),
                        pid: 1,
                        start_ticks: 1,
                    },
                    n_steps: u32::MAX,
                    state: SagaState::Acting,
                    dry_run: false,
                    require_actor_idle: false,
                }),
                begin(&saga_id, 0),
            ]))
            .expect("writes");
        let mut step_seq = 0_u32;
        group.bench_function(durability.as_str(), |b| {
            b.iter(|| {
                let batch = vec![
                    LogWrite::CommitStep {
                        saga_id: saga_id.clone(),
                        step_seq,
                        output: ToolOutput::new(json!({"bytes": 5})),
                    },
                    begin(&saga_id, step_seq + 1),
                ];
                runtime.block_on(log.write(batch)).expect("writes");
                step_seq += 1;
            });
        });
    }
    group.finish();
}

/// The writer thread's round trip alone: a read of a saga that does not exist (one primary
/// key probe in SQLite), sent to the writer and answered, from a current-thread runtime as
/// the CLI's. What a batch pays for the hand-off, beside the floor's direct commit.
fn writer_round_trip(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let log = SqliteLog::open(
        &dir.path().join("bench.db"),
        LogOptions {
            durability: Durability::Normal,
            clock: Arc::new(WallClock),
        },
    )
    .expect("opens");
    let missing = SagaId::new("missing");
    let mut group = c.benchmark_group("writer");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));
    group.bench_function("round_trip_of_a_missing_saga_read", |b| {
        b.iter(|| {
            let found = runtime.block_on(log.saga(&missing)).expect("reads");
            assert!(found.is_none());
        });
    });
    group.finish();
}

criterion_group!(benches, step_records, writer_round_trip);
criterion_main!(benches);
