//! Group commit: batches written at once by many tasks share transactions, each batch still
//! all or nothing, the chain one verifiable chain, the groups within their bounds.

use std::sync::Arc;

use agent_kernel_api::{LogWrite, SagaId, SagaState, TxLog};
use agent_kernel_txlog::{GROUP_BATCHES_MAX, GROUP_RECORDS_MAX, verify};

use crate::{begin, new_saga, open};

#[tokio::test]
async fn concurrent_batches_commit_together_and_a_failing_one_takes_only_itself_down() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("log.db");
    let log = Arc::new(open(&path).expect("opens"));
    let mut tasks = Vec::new();
    for saga_idx in 0..64 {
        let log = Arc::clone(&log);
        tasks.push(tokio::spawn(async move {
            let saga = format!("s{saga_idx}");
            log.write(vec![new_saga(&saga), begin(&saga, 0, None, "h")])
                .await
                .expect("created");
            for step_seq in 1..5 {
                let batch = if saga_idx % 8 == 0 && step_seq == 4 {
                    // A step begun twice: the batch fails, and only it.
                    vec![begin(&saga, 2, None, "h")]
                } else {
                    vec![begin(&saga, step_seq, None, "h")]
                };
                let written = log.write(batch).await;
                assert_eq!(
                    written.is_err(),
                    saga_idx % 8 == 0 && step_seq == 4,
                    "{written:?}"
                );
            }
            log.write(vec![LogWrite::SetState {
                saga_id: SagaId::new(&saga),
                state: SagaState::Done,
            }])
            .await
            .expect("finished");
        }));
    }
    for task in tasks {
        task.await.expect("no panic");
    }
    let counts = log.group_stats();
    eprintln!("group commits: {counts:?}");
    assert!(
        counts.batches_max as usize <= GROUP_BATCHES_MAX,
        "{counts:?}"
    );
    assert!(
        counts.records <= counts.commits * GROUP_RECORDS_MAX as u64,
        "{counts:?}"
    );
    assert_eq!(
        counts.batches,
        64 * 6,
        "every batch answered once: {counts:?}"
    );
    for saga_idx in 0..64 {
        let saga = log
            .saga(&SagaId::new(format!("s{saga_idx}")))
            .await
            .expect("reads")
            .expect("exists");
        let expected = if saga_idx % 8 == 0 { 4 } else { 5 };
        assert_eq!(saga.steps.len(), expected, "saga {saga_idx}");
        assert_eq!(saga.saga.state, SagaState::Done);
    }
    drop(log);
    let report = verify(&path, None).expect("verifies");
    assert!(report.is_intact(), "{:?}", report.first_bad);
}
