//! The operator's actions as library calls: what the command line prints, a program gets
//! as typed reports.

use agent_kernel::operator::{self, Decision, Vouched};
use agent_kernel::{
    ApprovalStatus, BeginOptions, CallAnswer, Compensate, KernelBuilder, Reversibility, SagaState,
    Settlement, Tool, ToolContext, ToolError, ToolOutput, ToolSpec, UndoVerdict,
};
use serde_json::{Value, json};

/// `pay {to, amount}`: an effect that cannot be taken back, so each call waits for an
/// operator.
struct Pay;

impl Tool for Pay {
    fn spec(&self) -> ToolSpec {
        ToolSpec::mutating("pay")
            .with_settlement(Settlement::Operator)
            .with_reversibility(Reversibility::None)
            .with_schema(json!({ "type": "object", "required": ["to", "amount"] }))
    }

    async fn execute(&self, _: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::new(json!({ "paid": args["amount"] })))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_undo_previews_and_the_audit_check_are_library_calls() {
    let dir = tempfile::tempdir().expect("temp dir");
    let base = dir.path().canonicalize().expect("canonical");
    std::fs::create_dir(base.join("ws")).expect("ws");
    let db = base.join("agent-kernel.db");
    let kernel = tokio::task::spawn_blocking({
        let (base, db) = (base.clone(), db.clone());
        move || {
            KernelBuilder::new()
                .db(db)
                .policy_toml("[fs]\nallow = [\"ws\"]\n", &base)
                .expect("policy")
                .cwd(&base)
                .irreversible_tool(Pay)
                .build()
                .expect("builds")
        }
    })
    .await
    .expect("the builder ran");

    // An irreversible call waits; the operator sees its whole arguments, hidden characters
    // named, and decides.
    let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
    let answer = saga
        .call("pay", json!({ "to": "bob\u{202e}", "amount": 100 }), None)
        .await
        .expect("calls");
    let CallAnswer::AwaitingApproval(request) = answer else {
        panic!("an irreversible call waits: {answer:?}");
    };
    let pending = operator::pending_approvals(&kernel).await.expect("lists");
    assert_eq!(pending.len(), 1);
    let view = &pending[0];
    assert_eq!(view.request.approval_id, request.approval_id);
    assert_eq!(view.status, ApprovalStatus::Pending);
    assert!(view.args_shown.contains("\\u202e"), "{}", view.args_shown);
    assert!(
        view.args_warnings
            .iter()
            .any(|warning| warning.contains("U+202E")),
        "{:?}",
        view.args_warnings
    );
    assert_eq!(
        view.later_steps, None,
        "a live saga's next steps are its agent's"
    );
    let decided = operator::decide(
        &kernel,
        Decision {
            approval_id: request.approval_id.clone(),
            approve: false,
            note: Some("not to that name".into()),
            operator_key: None,
            by: Some("carol (console)".into()),
        },
    )
    .await
    .expect("decides");
    assert_eq!(decided.status, ApprovalStatus::Rejected);
    assert_eq!(decided.note.as_deref(), Some("not to that name"));
    assert_eq!(decided.decided_by.as_deref(), Some("carol (console)"));
    assert!(
        operator::pending_approvals(&kernel)
            .await
            .expect("lists")
            .is_empty()
    );
    assert_eq!(
        operator::approval(&kernel, &request.approval_id)
            .await
            .expect("shows")
            .status,
        ApprovalStatus::Rejected
    );
    drop(saga);

    // A Done saga's undo, previewed: every step undoable until another writer changes a
    // file; the preview itself changes nothing.
    let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
    saga.call(
        "fs.write",
        json!({ "path": "ws/a.txt", "content": "a" }),
        None,
    )
    .await
    .expect("writes");
    let done = saga.commit().await.expect("commits");
    assert_eq!(done.state, SagaState::Done);
    let preview = operator::undo_preview(&kernel, &done.saga_id)
        .await
        .expect("previews");
    assert!(preview.undoable(false), "{preview:?}");
    assert_eq!(preview.steps.len(), 1);
    assert!(preview.steps[0].window_closes_at_ms.is_some());
    std::fs::write(base.join("ws/a.txt"), "someone else").expect("writes");
    let preview = operator::undo_preview(&kernel, &done.saga_id)
        .await
        .expect("previews");
    assert!(
        matches!(preview.steps[0].verdict, UndoVerdict::Changed { .. }),
        "{preview:?}"
    );
    assert!(!preview.undoable(false) && preview.undoable(true));
    assert_eq!(
        std::fs::read_to_string(base.join("ws/a.txt")).expect("reads"),
        "someone else"
    );
    let listed = operator::saga(kernel.log().as_ref(), &done.saga_id)
        .await
        .expect("reads");
    assert_eq!(listed.saga.state, SagaState::Done);
    assert!(
        operator::sagas(kernel.log().as_ref(), 10)
            .await
            .expect("lists")
            .iter()
            .any(|summary| summary.saga_id == done.saga_id)
    );

    // The chain vouches for the log; nothing needed recovery.
    assert_eq!(
        operator::vouch_for_log(&db, None).await.expect("checks"),
        Vouched::Intact
    );
    let recovered = operator::recover(&kernel, &agent_kernel::NoObserver)
        .await
        .expect("recovers");
    assert_eq!(recovered.counts().rolled_back, 0);
    assert!(!recovered.needs_operator());
}

/// `note {text}`: a reversible effect in memory.
struct Note;

impl Tool for Note {
    fn spec(&self) -> ToolSpec {
        ToolSpec::mutating("note").with_idempotent(true)
    }

    async fn execute(&self, _: &ToolContext, _: &Value) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::new(json!({})))
    }
}

impl Compensate for Note {
    async fn compensate(
        &self,
        _: &ToolContext,
        _: &Value,
        _: &agent_kernel::Undo,
        _: Option<&ToolOutput>,
    ) -> Result<(), ToolError> {
        Ok(())
    }
}

/// A kernel without a saga's tool neither undoes it nor says it could: the preview names
/// the missing tool, and `undo` refuses with nothing undone, the saga still `Done`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undo_needs_every_tool_and_its_preview_says_so() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("agent-kernel.db");
    let build = |with_note: bool| {
        let db = db.clone();
        tokio::task::spawn_blocking(move || {
            let builder = KernelBuilder::new().db(db);
            let builder = if with_note {
                builder.tool(Note)
            } else {
                builder
            };
            builder.build().expect("builds")
        })
    };
    let kernel = build(true).await.expect("built");
    let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
    saga.call("note", json!({ "text": "a" }), None)
        .await
        .expect("calls");
    let done = saga.commit().await.expect("commits");
    drop(saga);
    drop(kernel);

    let kernel = build(false).await.expect("built");
    let preview = operator::undo_preview(&kernel, &done.saga_id)
        .await
        .expect("previews");
    assert_eq!(
        preview.steps[0].verdict,
        UndoVerdict::MissingTool,
        "{preview:?}"
    );
    assert!(!preview.undoable(true));
    let request = agent_kernel::UndoRequest {
        reason: "try".into(),
        force: true,
        by: None,
    };
    let refused = operator::undo(&kernel, &done.saga_id, &request, &agent_kernel::NoObserver)
        .await
        .expect_err("refused");
    assert!(
        matches!(refused, agent_kernel::KernelError::MissingTools { .. }),
        "{refused}"
    );
    let record = operator::saga(kernel.log().as_ref(), &done.saga_id)
        .await
        .expect("reads");
    assert_eq!(record.saga.state, SagaState::Done);

    // An undone saga, or one with nothing to undo, previews as an undo that succeeds.
    let kernel = {
        drop(kernel);
        build(true).await.expect("built")
    };
    let undone = operator::undo(&kernel, &done.saga_id, &request, &agent_kernel::NoObserver)
        .await
        .expect("undoes");
    assert_eq!(undone.state, SagaState::Undone);
    let preview = operator::undo_preview(&kernel, &done.saga_id)
        .await
        .expect("previews");
    assert!(
        preview.nothing_to_undo && preview.undoable(false),
        "{preview:?}"
    );
}
