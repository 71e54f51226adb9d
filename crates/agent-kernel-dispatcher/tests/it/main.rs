//! Integration tests of the dispatcher with instrumented tools: schemas, timeouts,
//! concurrency limits measured by the tool itself, retries, panics.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use agent_kernel_api::{
    BoxFuture, Compensate, Durability, Misdeclaration, Probe, ProbeOutcome, Reversibility, SagaId,
    Settlement, SourcedTool, Tool, ToolContext, ToolEntry, ToolError, ToolOutput, ToolSource,
    ToolSpec, Undo,
};
use agent_kernel_dispatcher::{DispatchError, Dispatcher, Limits, NoJitter, ToolLimits};
use serde_json::{Value, json};

/// `work {sleep_ms?, fail_retriable_times?, panic?, hang?}`: records how many calls run at
/// once (the peak is what the limit must hold) and how many attempts it saw.
#[derive(Default)]
struct Work {
    id: &'static str,
    idempotent: bool,
    running: AtomicUsize,
    peak: AtomicUsize,
    attempts: AtomicU32,
    /// Shared by every tool of a test: calls of any tool running at once.
    all: Arc<(AtomicUsize, AtomicUsize)>,
}

impl Work {
    fn new(id: &'static str, idempotent: bool) -> Arc<Self> {
        Arc::new(Self {
            id,
            idempotent,
            ..Self::default()
        })
    }

    fn sharing(id: &'static str, all: &Arc<(AtomicUsize, AtomicUsize)>) -> Arc<Self> {
        Arc::new(Self {
            id,
            idempotent: true,
            all: all.clone(),
            ..Self::default()
        })
    }
}

impl Tool for Work {
    fn spec(&self) -> ToolSpec {
        ToolSpec::mutating(self.id)
            .with_version("1.0.0")
            .with_idempotent(self.idempotent)
            .with_schema(json!({
                "type": "object",
                "properties": {
                    "sleep_ms": {"type": "integer", "minimum": 0, "maximum": 60000},
                    "fail_retriable_times": {"type": "integer", "minimum": 0},
                    "panic": {"type": "boolean"},
                    "hang": {"type": "boolean"},
                    "target": {
                        "type": "object",
                        "properties": {"path": {"type": "string"}},
                        "required": ["path"],
                        "additionalProperties": false
                    }
                },
                "additionalProperties": false
            }))
    }

    fn check(&self, _args: &Value) -> Result<(), ToolError> {
        Ok(())
    }

    async fn execute(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let attempt = self.attempts.fetch_add(1, Ordering::SeqCst) + 1;
        let now_running = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now_running, Ordering::SeqCst);
        let all_running = self.all.0.fetch_add(1, Ordering::SeqCst) + 1;
        self.all.1.fetch_max(all_running, Ordering::SeqCst);
        if let Some(sleep_ms) = args["sleep_ms"].as_u64() {
            tokio::time::sleep(Duration::from_millis(sleep_ms)).await;
        }
        self.all.0.fetch_sub(1, Ordering::SeqCst);
        self.running.fetch_sub(1, Ordering::SeqCst);
        if args["panic"].as_bool() == Some(true) {
            panic!("work panics on purpose");
        }
        if args["hang"].as_bool() == Some(true) {
            std::future::pending::<()>().await;
        }
        if attempt == 1 && args["lost_first"].as_bool() == Some(true) {
            return Err(ToolError::uncertain("the answer was lost").retriable());
        }
        if u64::from(attempt) <= args["fail_retriable_times"].as_u64().unwrap_or(0) {
            return Err(ToolError::failed(format!("transient failure {attempt}")).retriable());
        }
        if args["then_fail"].as_bool() == Some(true) {
            return Err(ToolError::validation("refused: nothing done"));
        }
        Ok(ToolOutput::new(json!({ "attempt": attempt })))
    }
}

impl Compensate for Work {
    async fn prepare(&self, _ctx: &ToolContext, _args: &Value) -> Result<Undo, ToolError> {
        Ok(Undo::none())
    }

    async fn compensate(
        &self,
        _ctx: &ToolContext,
        _args: &Value,
        _undo: &Undo,
        _output: Option<&ToolOutput>,
    ) -> Result<(), ToolError> {
        Ok(())
    }
}

fn ctx(tool: &str) -> ToolContext {
    ToolContext {
        saga_id: SagaId::new("s"),
        step_seq: 0,
        tool_id: tool.to_owned(),
        idempotency_key: None,
        actor: None,
        durability: Durability::Normal,
        files: Arc::new(agent_kernel_api::NoFiles::new(".")),
    }
}

fn dispatcher(limits: Limits, tools: &[Arc<Work>]) -> Dispatcher {
    let mut dispatcher = Dispatcher::new(limits, Arc::new(NoJitter)).expect("valid limits");
    for tool in tools {
        dispatcher
            .register(ToolEntry::compensated(Arc::clone(tool)))
            .expect("registers");
    }
    dispatcher
}

/// `check(args, expected)`: `Ok` or an error containing every fragment.
fn check(args: Value, expected: Result<(), &[&str]>) {
    let dispatcher = dispatcher(Limits::default(), &[Work::new("work", true)]);
    match (dispatcher.check("work", &args), expected) {
        (Ok(()), Ok(())) => {}
        (Err(error), Err(fragments)) => {
            let message = error.to_string();
            assert!(error.is_invalid_args(), "{message}");
            for fragment in fragments {
                assert!(message.contains(fragment), "`{message}` lacks `{fragment}`");
            }
        }
        (actual, expected) => panic!("{args}: got {actual:?}, expected {expected:?}"),
    }
}

#[test]
fn schema_errors_name_the_path_and_the_rule() {
    check(json!({"sleep_ms": 5}), Ok(()));
    check(json!({"sleep_ms": "soon"}), Err(&["`/sleep_ms`", "type"]));
    check(json!({"sleep_ms": 70000}), Err(&["`/sleep_ms`", "maximum"]));
    check(
        json!({"slep_ms": 5}),
        Err(&["`/`", "additionalProperties", "slep_ms"]),
    );
    check(
        json!({"target": {}}),
        Err(&["`/target`", "required", "path"]),
    );
    check(
        json!({"target": {"path": 5}}),
        Err(&["`/target/path`", "type"]),
    );
    // Every violation is reported, not just the first.
    check(
        json!({"sleep_ms": -1, "panic": "yes"}),
        Err(&["`/sleep_ms`", "minimum", "`/panic`", "type"]),
    );
}

#[test]
fn duplicate_ids_and_bad_limits_are_refused() {
    let mut dispatcher = dispatcher(Limits::default(), &[Work::new("work", true)]);
    assert_eq!(
        dispatcher.register(ToolEntry::compensated(Work::new("work", true))),
        Err(DispatchError::DuplicateTool("work".into()))
    );
    let limits = Limits {
        timeout_ms: 0,
        ..Limits::default()
    };
    assert!(matches!(
        Dispatcher::new(limits, Arc::new(NoJitter)),
        Err(DispatchError::Limits(message)) if message.contains("timeout_ms")
    ));
}

/// A tool whose spec is whatever the test says, and that can do nothing but execute.
struct Declared(ToolSpec);

impl Tool for Declared {
    fn spec(&self) -> ToolSpec {
        self.0.clone()
    }
    async fn execute(&self, _ctx: &ToolContext, _args: &Value) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::new(json!({})))
    }
}

impl Probe for Declared {
    async fn probe(
        &self,
        _ctx: &ToolContext,
        _args: &Value,
        _undo: &Undo,
    ) -> Result<ProbeOutcome, ToolError> {
        Ok(ProbeOutcome::NotHappened)
    }
}

/// A spec cannot claim what its tool cannot do: a mutating tool without compensation
/// declares reversibility `none`, and only a tool with a probe declares settlement `probe`.
#[test]
fn a_spec_that_claims_what_its_tool_cannot_do_is_refused() {
    let register = |entry: ToolEntry| {
        Dispatcher::new(Limits::default(), Arc::new(NoJitter))
            .expect("valid limits")
            .register(entry)
    };
    let misdeclared = |tool: &str, misdeclaration| {
        Err(DispatchError::Misdeclared {
            tool: tool.to_owned(),
            misdeclaration,
        })
    };
    // Mutating, no compensation, and the default reversibility (`full`): refused.
    let refused = register(ToolEntry::new(Declared(ToolSpec::mutating("pay"))));
    assert_eq!(
        refused,
        misdeclared("pay", Misdeclaration::ReversibleWithoutCompensation)
    );
    assert!(
        refused
            .expect_err("refused")
            .to_string()
            .contains("must declare reversibility none")
    );
    // The same tool saying it cannot be undone: registered.
    let irreversible = ToolSpec::mutating("pay").with_reversibility(Reversibility::None);
    assert_eq!(
        register(ToolEntry::new(Declared(irreversible.clone()))),
        Ok(())
    );
    // Settlement `probe` without a probe: refused; with one: registered.
    let probing = irreversible.with_settlement(Settlement::Probe);
    assert_eq!(
        register(ToolEntry::new(Declared(probing.clone()))),
        misdeclared("pay", Misdeclaration::ProbeWithoutProbe)
    );
    assert_eq!(register(ToolEntry::probed(Declared(probing))), Ok(()));
    // A read-only tool needs neither.
    assert_eq!(
        register(ToolEntry::new(Declared(ToolSpec::read_only("look")))),
        Ok(())
    );
    // An empty id is no id.
    assert_eq!(
        register(ToolEntry::new(Declared(ToolSpec::read_only("")))),
        misdeclared("", Misdeclaration::EmptyId)
    );
}

#[tokio::test(start_paused = true)]
async fn a_hung_tool_times_out_with_an_uncertain_outcome() {
    let work = Work::new("work", true);
    let mut limits = Limits::default();
    limits.tools.insert(
        "work".into(),
        ToolLimits {
            timeout_ms: Some(250),
            ..ToolLimits::default()
        },
    );
    let dispatcher = dispatcher(limits, std::slice::from_ref(&work));
    let started = tokio::time::Instant::now();
    let error = dispatcher
        .execute(&ctx("work"), &json!({"hang": true}))
        .await
        .expect_err("times out");
    assert!(error.is_uncertain(), "a timeout leaves the outcome unknown");
    assert!(error.to_string().contains("250 ms"), "{error}");
    assert_eq!(started.elapsed(), Duration::from_millis(250));
    assert_eq!(
        work.attempts.load(Ordering::SeqCst),
        1,
        "timeouts are not retried"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_concurrency_limits_hold_under_100_concurrent_calls() {
    let all = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
    let limited = Work::sharing("limited", &all);
    let other = Work::sharing("other", &all);
    let mut limits = Limits {
        concurrency_max: 8,
        ..Limits::default()
    };
    limits.tools.insert(
        "limited".into(),
        ToolLimits {
            concurrency_max: Some(3),
            ..ToolLimits::default()
        },
    );
    let dispatcher = Arc::new(dispatcher(limits, &[limited.clone(), other.clone()]));
    let calls: Vec<_> = (0..100)
        .map(|call_idx| {
            let dispatcher = dispatcher.clone();
            tokio::spawn(async move {
                let tool = if call_idx % 2 == 0 {
                    "limited"
                } else {
                    "other"
                };
                dispatcher
                    .execute(&ctx(tool), &json!({"sleep_ms": 5}))
                    .await
            })
        })
        .collect();
    for call in calls {
        call.await.expect("joins").expect("succeeds");
    }
    let (limited_peak, other_peak) = (
        limited.peak.load(Ordering::SeqCst),
        other.peak.load(Ordering::SeqCst),
    );
    let all_peak = all.1.load(Ordering::SeqCst);
    assert!(limited_peak <= 3, "per-tool limit exceeded: {limited_peak}");
    assert!(all_peak <= 8, "global limit exceeded: {all_peak}");
    assert!(
        other_peak >= 4,
        "the global limit was reached, not just approached ({other_peak})"
    );
    assert!(
        limited_peak >= 2,
        "calls really ran concurrently ({limited_peak})"
    );
    assert_eq!(limited.attempts.load(Ordering::SeqCst), 50);
}

#[tokio::test(start_paused = true)]
async fn retriable_errors_of_idempotent_tools_are_retried_the_configured_number_of_times() {
    let work = Work::new("work", true);
    let limits = Limits {
        retries_max: 3,
        backoff_base_ms: 100,
        backoff_max_ms: 250,
        ..Limits::default()
    };
    let dispatcher = dispatcher(limits, std::slice::from_ref(&work));
    let started = tokio::time::Instant::now();
    let output = dispatcher
        .execute(&ctx("work"), &json!({"fail_retriable_times": 3}))
        .await
        .expect("succeeds on the fourth attempt");
    assert_eq!(output.data["attempt"], 4);
    // Backoffs 100 + 200 + 250 (capped), no jitter.
    assert_eq!(started.elapsed(), Duration::from_millis(550));

    let error = dispatcher
        .execute(&ctx("work"), &json!({"fail_retriable_times": 100}))
        .await
        .expect_err("gives up");
    assert!(error.to_string().contains("transient failure 8"), "{error}");
    assert_eq!(work.attempts.load(Ordering::SeqCst), 8, "4 + 4 attempts");
}

/// A retry that fails saying nothing happened does not erase an earlier attempt whose
/// outcome is unknown: the call's error stays unknown (that attempt may have acted, and its
/// step must be settled as such), naming both.
#[tokio::test(start_paused = true)]
async fn a_definite_failure_after_an_attempt_in_doubt_stays_in_doubt() {
    let work = Work::new("work", true);
    let dispatcher = dispatcher(Limits::default(), std::slice::from_ref(&work));
    let error = dispatcher
        .execute(
            &ctx("work"),
            &json!({"lost_first": true, "then_fail": true}),
        )
        .await
        .expect_err("fails");
    assert_eq!(work.attempts.load(Ordering::SeqCst), 2);
    assert!(error.is_uncertain(), "{error}");
    assert!(!error.is_retriable(), "{error}");
    assert_eq!(
        error.kind(),
        agent_kernel_api::ToolErrorKind::Validation,
        "its kind kept"
    );
    let text = error.to_string();
    assert!(
        text.contains("refused: nothing done") && text.contains("the answer was lost"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn non_idempotent_tools_and_non_retriable_errors_are_never_retried() {
    let once = Work::new("once", false);
    let dispatcher = dispatcher(Limits::default(), std::slice::from_ref(&once));
    let error = dispatcher
        .execute(&ctx("once"), &json!({"fail_retriable_times": 1}))
        .await
        .expect_err("not retried");
    assert!(error.is_retriable(), "the error said a retry was safe");
    assert_eq!(
        once.attempts.load(Ordering::SeqCst),
        1,
        "but the tool is not idempotent"
    );
}

#[tokio::test]
async fn a_panicking_tool_is_contained() {
    let work = Work::new("work", true);
    let dispatcher = dispatcher(Limits::default(), &[work]);
    let error = dispatcher
        .execute(&ctx("work"), &json!({"panic": true}))
        .await
        .expect_err("contained");
    assert!(
        error.to_string().contains("work panics on purpose"),
        "{error}"
    );
    assert!(error.is_uncertain());
    // The dispatcher still works afterwards.
    dispatcher
        .execute(&ctx("work"), &json!({}))
        .await
        .expect("runs");
}

#[tokio::test(start_paused = true)]
async fn no_retry_once_the_process_may_no_longer_act() {
    let work = Work::new("work", true);
    let dispatcher = dispatcher(Limits::default(), std::slice::from_ref(&work));
    let asked = AtomicU32::new(0);
    let may_act = || {
        asked.fetch_add(1, Ordering::SeqCst);
        false
    };
    let error = dispatcher
        .execute_while(&ctx("work"), &json!({"fail_retriable_times": 3}), &may_act)
        .await
        .expect_err("the first attempt's error");
    assert!(error.to_string().contains("transient failure 1"), "{error}");
    assert_eq!(work.attempts.load(Ordering::SeqCst), 1, "no retry ran");
    assert_eq!(asked.load(Ordering::SeqCst), 1, "asked after the backoff");
    let compensated = dispatcher
        .compensate_while(&ctx("work"), &json!({}), &Undo::none(), None, &may_act)
        .await;
    assert!(compensated.is_ok(), "a first attempt needs no asking");
}

/// A source of `Work` tools named `NAME.a` and `NAME.b` (plus, when `stray`, a tool outside
/// its family), counting how often it is asked; `fail` makes it unavailable.
struct Family {
    name: &'static str,
    tools: Vec<Arc<Work>>,
    fail: bool,
    asked: AtomicU32,
}

impl Family {
    fn new(name: &'static str, ids: &[&'static str], fail: bool) -> Arc<Self> {
        Arc::new(Self {
            name,
            tools: ids.iter().map(|id| Work::new(id, true)).collect(),
            fail,
            asked: AtomicU32::new(0),
        })
    }
}

impl ToolSource for Family {
    fn name(&self) -> &str {
        self.name
    }

    fn load(&self) -> BoxFuture<'_, Result<Vec<SourcedTool>, ToolError>> {
        Box::pin(async move {
            self.asked.fetch_add(1, Ordering::SeqCst);
            // Long enough for concurrent callers to meet here.
            tokio::time::sleep(Duration::from_millis(50)).await;
            if self.fail {
                return Err(ToolError::failed("it did not start"));
            }
            Ok(self
                .tools
                .iter()
                .map(|tool| (ToolEntry::compensated(Arc::clone(tool)), Some(1_234)))
                .collect())
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_source_is_asked_once_when_one_of_its_tools_is_first_needed() {
    let local = Work::new("local", true);
    let memo = Family::new("memo", &["memo.a", "memo.b", "other.c"], false);
    let broken = Family::new("broken", &["broken.a"], true);
    let mut dispatcher = dispatcher(Limits::default(), &[local]);
    dispatcher
        .add_source(Arc::clone(&memo) as Arc<dyn ToolSource>)
        .expect("adds");
    dispatcher
        .add_source(Arc::clone(&broken) as Arc<dyn ToolSource>)
        .expect("adds");
    assert!(matches!(
        dispatcher.add_source(Arc::clone(&memo) as Arc<dyn ToolSource>),
        Err(DispatchError::DuplicateTool(_))
    ));
    assert_eq!(dispatcher.ids(), ["local"], "nothing asked yet");
    assert!(dispatcher.knows("memo.zzz") && !dispatcher.knows("nope.a"));
    dispatcher
        .execute(&ctx("local"), &json!({}))
        .await
        .expect("runs");
    assert_eq!(memo.asked.load(Ordering::SeqCst), 0);
    let error = dispatcher
        .check("memo.a", &json!({}))
        .expect_err("not asked yet");
    assert!(error.to_string().contains("has not been asked"), "{error}");

    // Three calls at once: one asking.
    let (ctx_a, ctx_b, args) = (ctx("memo.a"), ctx("memo.b"), json!({}));
    let (a, b, c) = tokio::join!(
        dispatcher.execute(&ctx_a, &args),
        dispatcher.execute(&ctx_b, &args),
        dispatcher.execute(&ctx_a, &args),
    );
    assert!(a.is_ok() && b.is_ok() && c.is_ok());
    assert_eq!(memo.asked.load(Ordering::SeqCst), 1);
    assert_eq!(
        dispatcher.ids(),
        ["local", "memo.a", "memo.b"],
        "other.c is left out"
    );
    assert_eq!(
        dispatcher.timeout_ms_of("memo.a"),
        1_234,
        "its declared timeout"
    );
    dispatcher.check("memo.a", &json!({})).expect("known now");

    // An unavailable source fails its own tools alone, naming itself, asked once.
    for _ in 0..2 {
        let error = dispatcher
            .execute(&ctx("broken.a"), &json!({}))
            .await
            .expect_err("unavailable");
        assert!(
            error.to_string().contains("`broken`") && error.to_string().contains("did not start"),
            "{error}"
        );
    }
    assert_eq!(broken.asked.load(Ordering::SeqCst), 1);
    assert_eq!(
        dispatcher.unavailable(),
        [("broken".to_owned(), "it did not start".to_owned())]
    );
    dispatcher.load_all().await;
    assert_eq!(memo.asked.load(Ordering::SeqCst), 1, "never asked again");
    let error = dispatcher
        .execute(&ctx("memo.zzz"), &json!({}))
        .await
        .expect_err("unknown");
    assert!(error.to_string().contains("does not offer it"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn load_all_asks_every_source_at_once() {
    let first = Family::new("first", &["first.a"], false);
    let second = Family::new("second", &["second.a"], true);
    let mut dispatcher = dispatcher(Limits::default(), &[]);
    for source in [&first, &second] {
        dispatcher
            .add_source(Arc::clone(source) as Arc<dyn ToolSource>)
            .expect("adds");
    }
    let started = tokio::time::Instant::now();
    dispatcher.load_all().await;
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(50),
        "the sources were asked together, not one after the other"
    );
    assert_eq!(dispatcher.ids(), ["first.a"]);
    assert_eq!(dispatcher.unavailable().len(), 1);
}
