//! Records the checks write, and that the backends' own tests may reuse.

use agent_kernel_api::{
    ApprovalDecision, ApprovalRequest, BeginStep, ConsumeApproval, DecideApproval, EffectClass,
    LogWrite, NewSaga, Owner, SagaId, SagaState, ToolOutput, TxLog, Undo,
};
use serde_json::json;

/// An owner on host `h`, boot `b`, with process id `pid`.
pub fn owner(pid: u32) -> Owner {
    Owner {
        host: "h".into(),
        boot_id: "b".into(),
        pid,
        start_ticks: 7,
    }
}

/// A new saga `id` of three steps, acting, owned by `owner(1)`.
pub fn new_saga(id: &str) -> LogWrite {
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

/// A saga of `actor`, created with `require_actor_idle` and `dry_run` as given.
pub fn saga_of(id: &str, actor: &str, require_actor_idle: bool, dry_run: bool) -> LogWrite {
    let LogWrite::CreateSaga(mut saga) = new_saga(id) else {
        unreachable!("new_saga creates a saga")
    };
    saga.actor = Some(actor.to_owned());
    saga.require_actor_idle = require_actor_idle;
    saga.dry_run = dry_run;
    LogWrite::CreateSaga(saga)
}

/// The BEGIN of step `step_seq` of saga `id`: an `fs.write` with idempotency key `key` and
/// arguments hashed as `hash`, whose undo data holds bytes with a NUL.
pub fn begin(id: &str, step_seq: u32, key: Option<&str>, hash: &str) -> LogWrite {
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
        resources: Vec::new(),
        duplicate_keys: Vec::new(),
        duplicate_check: None,
    })
}

/// [`begin`] without a key, claiming `resources` and declaring `duplicate_keys`.
pub fn begin_on(id: &str, step_seq: u32, resources: &[&str], duplicate_keys: &[&str]) -> LogWrite {
    let LogWrite::BeginStep(mut step) = begin(id, step_seq, None, "h") else {
        unreachable!("begin begins a step")
    };
    step.resources = resources.iter().map(|key| (*key).to_owned()).collect();
    step.duplicate_keys = duplicate_keys.iter().map(|key| (*key).to_owned()).collect();
    LogWrite::BeginStep(step)
}

/// [`begin_on`] with no resources, declaring `duplicate_keys` and asking the log to check,
/// in the BEGIN's transaction, that no other saga's step declared one of them, but
/// `approved_over`'s.
pub fn begin_checked(
    id: &str,
    step_seq: u32,
    duplicate_keys: &[&str],
    approved_over: Option<(&str, u32)>,
) -> LogWrite {
    let LogWrite::BeginStep(mut step) = begin_on(id, step_seq, &[], duplicate_keys) else {
        unreachable!("begin begins a step")
    };
    step.duplicate_check = Some(agent_kernel_api::DuplicateCheck {
        since_ms: 0,
        approved_over: approved_over.map(|(saga, seq)| (SagaId::new(saga), seq)),
    });
    LogWrite::BeginStep(step)
}

/// Saga `id`, `Done`: step 0 declared `file:/w/x` and `acct:1` (in that order) and the
/// duplicate key `invoice:7`, step 1 `file:/w/x` again; the batch that writes it.
pub fn done_saga_declaring(id: &str) -> Vec<LogWrite> {
    vec![
        new_saga(id),
        begin_on(id, 0, &["file:/w/x", "acct:1"], &["invoice:7"]),
        commit(id, 0),
        begin_on(id, 1, &["file:/w/x"], &[]),
        commit(id, 1),
        set_state(id, SagaState::Done),
    ]
}

/// The COMMIT of step `step_seq` of saga `id`, with output `{"ok": step_seq}`.
pub fn commit(id: &str, step_seq: u32) -> LogWrite {
    LogWrite::CommitStep {
        saga_id: SagaId::new(id),
        step_seq,
        output: ToolOutput::new(json!({"ok": step_seq})),
    }
}

/// Saga `id` moved to `state`.
pub fn set_state(id: &str, state: SagaState) -> LogWrite {
    LogWrite::SetState {
        saga_id: SagaId::new(id),
        state,
    }
}

/// A request for step 0 of `saga` (an `fs.write`), digest `d…d`, expiring at `expires_at_ms`.
pub fn request(saga: &str, id: &str, expires_at_ms: i64) -> ApprovalRequest {
    ApprovalRequest {
        duplicate_of: None,
        approval_id: id.into(),
        saga_id: SagaId::new(saga),
        step_seq: 0,
        tool_id: "fs.write".into(),
        args: json!({"path": "a.txt", "content": "x"}),
        idempotency_key: None,
        digest: "d".repeat(64),
        rest: Some(Vec::new()),
        requested_at_ms: 0,
        expires_at_ms,
        operator_key_check: None,
    }
}

/// `alice`'s `decision` on request `id`.
pub fn decide(id: &str, decision: ApprovalDecision) -> LogWrite {
    LogWrite::DecideApproval(DecideApproval {
        approval_id: id.into(),
        decision,
        by: owner(9),
        uid: Some(1000),
        user: Some("alice".into()),
        note: Some("looked at it".into()),
    })
}

/// The use of request `id` with `digest`, for step 0 of `saga`.
pub fn consume(saga: &str, id: &str, digest: &str) -> LogWrite {
    LogWrite::ConsumeApproval(ConsumeApproval {
        approval_id: id.into(),
        saga_id: SagaId::new(saga),
        step_seq: 0,
        tool_id: "fs.write".into(),
        args: json!({"path": "a.txt", "content": "x"}),
        digest: digest.into(),
    })
}

/// Saga `saga` created waiting for request `id`.
pub async fn waiting_saga(log: &dyn TxLog, saga: &str, id: &str, expires_at_ms: i64) {
    log.write(vec![
        new_saga(saga),
        LogWrite::RequestApproval(request(saga, id, expires_at_ms)),
        LogWrite::SetState {
            saga_id: SagaId::new(saga),
            state: SagaState::AwaitingApproval,
        },
    ])
    .await
    .expect("written");
}

/// Consumes approval `a1` with `digest` in the transaction of step 0's BEGIN of saga `s1`.
pub async fn use_with_begin(
    log: &dyn TxLog,
    digest: &str,
) -> Result<Vec<agent_kernel_api::WriteOutcome>, agent_kernel_api::TxError> {
    log.write(vec![consume("s1", "a1", digest), begin("s1", 0, None, "h")])
        .await
}
