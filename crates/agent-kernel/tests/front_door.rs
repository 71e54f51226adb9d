//! The front door: what a builder reads, and a saga through it over the real file tools.

use agent_kernel::{
    BeginOptions, CallAnswer, Durability, KernelBuilder, KernelError, SagaState, StepStatus,
};
use serde_json::{Value, json};

fn committed_output(answer: &CallAnswer) -> &Value {
    match answer {
        CallAnswer::Committed(step) => {
            assert_eq!(step.status, StepStatus::Commit);
            &step
                .output
                .as_ref()
                .expect("a committed step has its output")
                .data
        }
        other => panic!("expected the step committed, got {other:?}"),
    }
}

/// Through the front door, over the real file tools: the second call writes a value
/// computed from what the first one read; an aborted saga puts every file back byte for
/// byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_read_by_one_call_is_written_by_the_next_and_an_abort_restores_every_byte() {
    let dir = tempfile::tempdir().expect("temp dir");
    let base = dir.path().canonicalize().expect("canonical");
    std::fs::create_dir(base.join("ws")).expect("ws");
    std::fs::write(base.join("ws/counter.txt"), "41").expect("writes");
    std::fs::write(base.join("ws/other.bin"), [0_u8, 159, 146, 150, 10]).expect("writes");
    let kernel = tokio::task::spawn_blocking({
        let base = base.clone();
        move || {
            KernelBuilder::new()
                .db(base.join("agent-kernel.db"))
                .policy_toml("[fs]\nallow = [\"ws\"]\n", &base)
                .expect("policy")
                .cwd(&base)
                .without_tools_file()
                .durability(Durability::Normal)
                .build()
                .expect("builds")
        }
    })
    .await
    .expect("the builder ran");

    let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
    let read = saga
        .call("fs.read", json!({ "path": "ws/counter.txt" }), None)
        .await
        .expect("reads");
    let counter: u64 = committed_output(&read)["content"]
        .as_str()
        .expect("text")
        .trim()
        .parse()
        .expect("a number");
    let write = saga
        .call(
            "fs.write",
            json!({ "path": "ws/counter.txt", "content": (counter + 1).to_string() }),
            None,
        )
        .await
        .expect("writes");
    committed_output(&write);
    assert_eq!(saga.commit().await.expect("commits").state, SagaState::Done);
    assert_eq!(
        std::fs::read_to_string(base.join("ws/counter.txt")).expect("reads"),
        "42"
    );

    let before: Vec<Vec<u8>> = ["ws/counter.txt", "ws/other.bin"]
        .iter()
        .map(|path| std::fs::read(base.join(path)).expect("reads"))
        .collect();
    let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
    for (path, content) in [
        ("ws/counter.txt", "0"),
        ("ws/other.bin", "text"),
        ("ws/new.txt", "n"),
    ] {
        committed_output(
            &saga
                .call(
                    "fs.write",
                    json!({ "path": path, "content": content }),
                    None,
                )
                .await
                .expect("writes"),
        );
    }
    let report = saga.abort("undo all of it").await.expect("aborts");
    assert_eq!(report.state, SagaState::FailedRolledBack);
    let after: Vec<Vec<u8>> = ["ws/counter.txt", "ws/other.bin"]
        .iter()
        .map(|path| std::fs::read(base.join(path)).expect("reads"))
        .collect();
    assert_eq!(after, before, "byte for byte");
    assert!(
        !base.join("ws/new.txt").exists(),
        "the created file is gone"
    );
}

#[test]
fn a_builder_from_new_needs_a_log() {
    let error = KernelBuilder::new().build().expect_err("no log");
    assert!(
        matches!(&error, KernelError::Setup(message) if message.contains(".db(path)")),
        "{error}"
    );
}

/// `from_folder` takes the folder's policy, table and tools file; `new` none of them.
#[test]
fn a_folder_gives_its_files_and_new_gives_none() {
    let dir = tempfile::tempdir().expect("temp dir");
    let base = dir.path().canonicalize().expect("canonical");
    std::fs::create_dir(base.join("ws")).expect("ws");
    std::fs::write(base.join("sandbox.toml"), "[fs]\nallow = [\"ws\"]\n").expect("policy");
    std::fs::write(
        base.join("tools.toml"),
        "[tools.\"note.read\"]\neffect = \"read-only\"\nsettlement = \"compensate\"\nexecute = [\"cat\"]\n",
    )
    .expect("tools");
    std::fs::write(base.join("fsm.toml"), "not a table").expect("table");

    let folder = KernelBuilder::from_folder(&base);
    if std::env::var_os(agent_kernel::DB_ENV).is_none() {
        assert_eq!(folder.db_path(), Some(base.join("agent-kernel.db")));
    }
    assert_eq!(folder.tools_file_path(), Some(base.join("tools.toml")));
    let policy = folder.load_policy().expect("the folder's policy");
    assert_eq!(policy.source(), Some(base.join("sandbox.toml").as_path()));
    let table = folder
        .load_fsm()
        .expect_err("the folder's table is read, and is broken");
    assert!(table.to_string().contains("fsm.toml"), "{table}");
    let recovering = KernelBuilder::from_folder(&base).for_compensation();
    assert_eq!(
        recovering.load_fsm().expect("the built-in table"),
        agent_kernel::Guardrail::builtin()
    );
    let listing = KernelBuilder::from_folder(&base).listing().expect("lists");
    assert!(listing.knows("note.read") && listing.knows("fault.fail"));

    let bare = KernelBuilder::new().cwd(&base);
    assert_eq!(bare.db_path(), None);
    assert_eq!(bare.tools_file_path(), None);
    assert!(bare.load_policy().expect("deny-all").source().is_none());
    assert_eq!(
        bare.load_fsm().expect("built in"),
        agent_kernel::Guardrail::builtin()
    );
    assert!(!bare.listing().expect("lists").knows("note.read"));
}

/// `own.write {path, content}`: writes through the context's file access.
struct OwnWrite;

impl agent_kernel::Tool for OwnWrite {
    fn spec(&self) -> agent_kernel::ToolSpec {
        agent_kernel::ToolSpec::mutating("own.write")
            .with_idempotent(true)
            .with_schema(json!({ "type": "object", "required": ["path", "content"] }))
    }
    async fn execute(
        &self,
        ctx: &agent_kernel::ToolContext,
        args: &Value,
    ) -> Result<agent_kernel::ToolOutput, agent_kernel::ToolError> {
        let path = args["path"].as_str().unwrap_or_default();
        let content = args["content"].as_str().unwrap_or_default();
        ctx.write_file(path, content.as_bytes().to_vec()).await?;
        Ok(agent_kernel::ToolOutput::new(
            json!({ "folder": ctx.folder() }),
        ))
    }
}

impl agent_kernel::Compensate for OwnWrite {
    async fn compensate(
        &self,
        ctx: &agent_kernel::ToolContext,
        args: &Value,
        _: &agent_kernel::Undo,
        _: Option<&agent_kernel::ToolOutput>,
    ) -> Result<(), agent_kernel::ToolError> {
        ctx.remove_file(args["path"].as_str().unwrap_or_default())
            .await
            .map(|_| ())
    }
}

/// A tool of the program's own reaches files through the kernel's sandbox and folder: a
/// relative path lands in the builder's folder, and a path outside the policy's roots is
/// denied as `fs.write` denies it, with nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_of_your_own_is_confined_as_fs_write_is() {
    let dir = tempfile::tempdir().expect("temp dir");
    let base = dir.path().canonicalize().expect("canonical");
    std::fs::create_dir(base.join("ws")).expect("ws");
    let kernel = tokio::task::spawn_blocking({
        let base = base.clone();
        move || {
            KernelBuilder::new()
                .db(base.join("agent-kernel.db"))
                .policy_toml("[fs]\nallow = [\"ws\"]\n", &base)
                .expect("policy")
                .cwd(&base)
                .tool(OwnWrite)
                .build()
                .expect("builds")
        }
    })
    .await
    .expect("the builder ran");

    let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
    let inside = saga
        .call(
            "own.write",
            json!({ "path": "ws/in.txt", "content": "in" }),
            None,
        )
        .await
        .expect("calls");
    assert_eq!(committed_output(&inside)["folder"], json!(base));
    assert_eq!(
        std::fs::read_to_string(base.join("ws/in.txt")).expect("written"),
        "in"
    );
    assert_eq!(saga.commit().await.expect("commits").state, SagaState::Done);

    for tool in ["fs.write", "own.write"] {
        for path in ["outside.txt", "ws/../outside.txt"] {
            let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
            let answer = saga
                .call(tool, json!({ "path": path, "content": "out" }), None)
                .await
                .expect("calls");
            let CallAnswer::Denied(report) = &answer else {
                panic!("{tool} {path}: expected a denial, got {answer:?}");
            };
            assert_eq!(report.state, SagaState::FailedRolledBack, "{tool} {path}");
            assert!(
                !base.join("outside.txt").exists(),
                "{tool} {path}: nothing written"
            );
        }
    }
}

/// A tool added as what it is not is refused when the kernel is built, naming the tool,
/// and no log is created.
#[test]
fn a_tool_added_as_what_it_is_not_is_refused_at_build() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("agent-kernel.db");
    let refusal = |builder: KernelBuilder| match builder.build() {
        Ok(_) => panic!("built"),
        Err(error) => error.to_string(),
    };
    let as_read_only = refusal(KernelBuilder::new().db(&db).read_only_tool(OwnWrite));
    assert!(
        as_read_only
            .contains("`own.write` was added as read-only but its spec says it is mutating"),
        "{as_read_only}"
    );
    // Added as irreversible, its spec still says `full`.
    let as_irreversible = refusal(KernelBuilder::new().db(&db).irreversible_tool(OwnWrite));
    assert!(
        as_irreversible.contains("own.write")
            && as_irreversible.contains("must declare reversibility none"),
        "{as_irreversible}"
    );
    assert!(!db.exists(), "nothing was opened");
}
