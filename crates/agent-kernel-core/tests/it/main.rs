//! Integration tests of the saga engine over a real log, with in-memory tools whose "world"
//! is a shared list, so every effect and every compensation is visible.
//!
//! The log is SQLite, or PostgreSQL when `AGENT_KERNEL_TEST_LOG=postgres` (on the server
//! `AGENT_KERNEL_TEST_POSTGRES` names, a schema per fixture): one source, both backends.
//! Liveness stays the staged probe's on both (the PostgreSQL log's leases are tested in its
//! own crate and through the binary).

mod approvals;
mod dead_letters;
mod fsm;
mod idempotency;
mod live;
mod prune;
mod recovery;
mod saga;
mod settlement;
mod undo;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_kernel_api::TxLog;
use agent_kernel_api::{
    Clock, Compensate, Durability, IdSource, Owner, Plan, PlanStep, Probe, ProbeOutcome,
    Reversibility, SagaId, Settlement, Tool, ToolContext, ToolEntry, ToolError, ToolOutput,
    ToolSpec, Undo,
};
use agent_kernel_core::{Environment, Kernel, Liveness, LivenessProbe, NoObserver};
use agent_kernel_dispatcher::{Dispatcher, Limits, NoJitter};
use agent_kernel_fsm::Guardrail;
use agent_kernel_log_contract::postgres::Schema;
use agent_kernel_txlog::{AuditReport, LogOptions, SqliteLog};
use serde_json::{Value, json};

/// The shared world the test tools act on, and a journal of what they did.
#[derive(Default)]
pub(crate) struct World {
    pub(crate) items: Mutex<Vec<String>>,
    pub(crate) journal: Mutex<Vec<String>>,
    /// Once set, `stuck…` items can be removed after all (the failure is switched off).
    pub(crate) unstuck: std::sync::atomic::AtomicBool,
    /// The items whose `Settled` step began executing, before it hangs or acts.
    pub(crate) started: Mutex<Vec<String>>,
    /// Told whenever an item leaves the world.
    pub(crate) removed: tokio::sync::Notify,
}

impl World {
    pub(crate) fn items(&self) -> Vec<String> {
        self.items.lock().expect("not poisoned").clone()
    }

    pub(crate) fn journal(&self) -> Vec<String> {
        self.journal.lock().expect("not poisoned").clone()
    }

    pub(crate) fn note(&self, entry: String) {
        self.journal.lock().expect("not poisoned").push(entry);
    }

    /// The effect of the test tools: `item` enters the world.
    fn add(&self, item: &str) {
        self.items
            .lock()
            .expect("not poisoned")
            .push(item.to_owned());
        self.note(format!("add {item}"));
    }

    /// Their compensation, safe whether or not the effect happened: the last occurrence of
    /// `item`, if any, leaves the world.
    fn remove(&self, item: &str) {
        let mut items = self.items.lock().expect("not poisoned");
        if let Some(position) = items.iter().rposition(|existing| existing == item) {
            items.remove(position);
        }
        drop(items);
        self.note(format!("remove {item}"));
        self.removed.notify_waiters();
    }
}

/// `ledger.add {item, sleep_ms?, hint?, unnamed?, …}`: adds `item` to the world (its output
/// carries `hint` as `next_hint`); compensation removes it, and fails for items named
/// `stuck…`. `unnamed`: the call names no resources (`"tool"`: only `tool:ledger.add`); for
/// the rest, `recovery::before_removing`.
pub(crate) struct Ledger {
    pub(crate) world: Arc<World>,
}

/// What a call of the world's tools touches: its item.
pub(crate) fn item_resource() -> agent_kernel_api::KeyTemplate {
    "item:$.args.item".parse().expect("a valid template")
}

fn item_of(args: &Value) -> Result<String, ToolError> {
    args.get("item")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| ToolError::invalid_args("missing field `item`"))
}

impl Tool for Ledger {
    fn spec(&self) -> ToolSpec {
        ToolSpec::mutating("ledger.add")
            .with_version("1.0.0")
            .with_resources([item_resource()])
    }

    fn check(&self, args: &Value) -> Result<(), ToolError> {
        if args.get("forbidden").is_some() {
            // As the sandbox denies a path outside its roots.
            return Err(ToolError::denied("the item is forbidden"));
        }
        item_of(args).map(|_| ())
    }

    async fn resources(
        &self,
        _ctx: &ToolContext,
        args: &Value,
    ) -> Result<Option<Vec<String>>, ToolError> {
        Ok(match args.get("unnamed").and_then(Value::as_str) {
            // Only the key a tool that names nothing gets.
            Some("tool") => Some(vec![agent_kernel_api::tool_resource("ledger.add")]),
            Some(_) => Some(Vec::new()),
            None => None,
        })
    }

    async fn execute(&self, ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let item = item_of(args)?;
        self.world.add(&item);
        if let Some(sleep_ms) = args.get("sleep_ms").and_then(Value::as_u64) {
            tokio::time::sleep(Duration::from_millis(sleep_ms)).await;
        }
        let mut output = ToolOutput::new(json!({ "item": item, "step": ctx.step_seq }));
        output.next_hint = args.get("hint").and_then(Value::as_str).map(str::to_owned);
        Ok(output)
    }
}

impl Compensate for Ledger {
    async fn prepare(&self, _ctx: &ToolContext, args: &Value) -> Result<Undo, ToolError> {
        Ok(Undo {
            data: json!({ "item": item_of(args)? }),
            blob: None,
        })
    }

    async fn compensate(
        &self,
        _ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
        _output: Option<&ToolOutput>,
    ) -> Result<(), ToolError> {
        let item = undo.data["item"]
            .as_str()
            .ok_or_else(|| ToolError::failed("undo record lacks `item`"))?
            .to_owned();
        recovery::before_removing(&self.world, args).await?;
        if item.starts_with("stuck") && !self.world.unstuck.load(Ordering::SeqCst) {
            self.world.note(format!("cannot remove {item}"));
            return Err(ToolError::failed(format!("{item} cannot be removed")));
        }
        self.world.remove(&item);
        Ok(())
    }
}

/// `boom {panic?, panic_in_prepare?}`: always fails (or panics in `execute` or `prepare`).
pub(crate) struct Boom;

impl Tool for Boom {
    fn spec(&self) -> ToolSpec {
        ToolSpec::read_only("boom").with_version("1.0.0")
    }

    fn check(&self, _args: &Value) -> Result<(), ToolError> {
        Ok(())
    }

    async fn execute(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        if args.get("panic").is_some() {
            panic!("boom panics on purpose");
        }
        Err(ToolError::failed("boom fails on purpose"))
    }
}

impl Compensate for Boom {
    async fn prepare(&self, _ctx: &ToolContext, args: &Value) -> Result<Undo, ToolError> {
        if args.get("panic_in_prepare").is_some() {
            panic!("boom panics in prepare");
        }
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

/// `probe {fail?, sleep_ms?}`: read-only; notes the state the log holds for its saga while
/// it runs (so tests see what was persisted before the step began), then passes or fails;
/// its output carries that state and the status the log holds for its own step.
pub(crate) struct ProbeTool {
    pub(crate) world: Arc<World>,
    pub(crate) log: Arc<dyn TxLog>,
}

impl Tool for ProbeTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec::read_only("probe").with_version("1.0.0")
    }

    fn check(&self, _args: &Value) -> Result<(), ToolError> {
        Ok(())
    }

    async fn execute(&self, ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let record = agent_kernel_api::TxLog::saga(&*self.log, &ctx.saga_id)
            .await
            .map_err(|err| ToolError::failed(err.to_string()))?
            .ok_or_else(|| ToolError::failed("saga not in the log"))?;
        self.world
            .note(format!("probe {} saw {}", ctx.step_seq, record.saga.state));
        if let Some(sleep_ms) = args.get("sleep_ms").and_then(Value::as_u64) {
            tokio::time::sleep(Duration::from_millis(sleep_ms)).await;
        }
        if args.get("fail").is_some() {
            return Err(ToolError::validation("probe check does not hold"));
        }
        // What the log holds of this very step while its effect runs: its durable BEGIN.
        let own_step = record
            .steps
            .iter()
            .find(|step| step.step_seq == ctx.step_seq)
            .map(|step| step.status);
        Ok(ToolOutput::new(
            json!({ "state": record.saga.state, "own_step": own_step }),
        ))
    }
}

impl Compensate for ProbeTool {
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

/// `<id> {item, hang_before?, hang_after?}`: adds `item` to the world, hanging before or
/// after the effect on request; declares `settlement`; its probe looks in the world.
pub(crate) struct Settled {
    pub(crate) id: &'static str,
    pub(crate) settlement: Settlement,
    pub(crate) reversibility: Reversibility,
    pub(crate) world: Arc<World>,
}

impl Tool for Settled {
    fn spec(&self) -> ToolSpec {
        ToolSpec::mutating(self.id)
            .with_version("1.0.0")
            .with_settlement(self.settlement)
            .with_reversibility(self.reversibility)
            .with_resources([item_resource()])
    }

    fn check(&self, args: &Value) -> Result<(), ToolError> {
        item_of(args).map(|_| ())
    }

    async fn execute(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let item = item_of(args)?;
        self.world
            .started
            .lock()
            .expect("not poisoned")
            .push(item.clone());
        if args.get("hang_before").is_some() {
            std::future::pending::<()>().await;
        }
        self.world.add(&item);
        if args.get("hang_after").is_some() {
            std::future::pending::<()>().await;
        }
        Ok(ToolOutput::new(json!({ "item": item })))
    }
}

impl Compensate for Settled {
    async fn prepare(&self, _ctx: &ToolContext, args: &Value) -> Result<Undo, ToolError> {
        Ok(Undo {
            data: json!({ "item": item_of(args)? }),
            blob: None,
        })
    }

    async fn compensate(
        &self,
        _ctx: &ToolContext,
        _args: &Value,
        undo: &Undo,
        _output: Option<&ToolOutput>,
    ) -> Result<(), ToolError> {
        let item = undo.data["item"].as_str().unwrap_or_default().to_owned();
        self.world.remove(&item);
        Ok(())
    }
}

impl Probe for Settled {
    async fn probe(
        &self,
        _ctx: &ToolContext,
        _args: &Value,
        undo: &Undo,
    ) -> Result<ProbeOutcome, ToolError> {
        let item = undo.data["item"].as_str().unwrap_or_default();
        self.world.note(format!("probe {item}"));
        if item.starts_with("unknowable") {
            return Ok(ProbeOutcome::Unknown);
        }
        if self.world.items().iter().any(|existing| existing == item) {
            Ok(ProbeOutcome::Happened(None))
        } else {
            Ok(ProbeOutcome::NotHappened)
        }
    }
}

/// A small deterministic generator (SplitMix64), so that a failing seed reproduces.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The seed in `var`, else one from the time: printed by the test, so a failure replays.
pub(crate) fn seed_from_env(var: &str) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_nanos() as u64
        })
}

/// A clock that advances one millisecond per reading.
pub(crate) struct TickClock(AtomicU64);

impl Clock for TickClock {
    fn now_ms(&self) -> i64 {
        1_700_000_000_000 + self.0.fetch_add(1, Ordering::Relaxed) as i64
    }
}

/// Ids `saga-0001`, `saga-0002`, ... with a per-kernel prefix.
pub(crate) struct CountingIds {
    prefix: String,
    next: AtomicU64,
}

impl IdSource for CountingIds {
    fn new_saga_id(&self) -> SagaId {
        SagaId::new(format!(
            "{}-{:04}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed) + 1
        ))
    }
}

/// A liveness probe whose answers the test sets.
#[derive(Default)]
pub(crate) struct StagedLiveness {
    pub(crate) dead_pids: Mutex<Vec<u32>>,
}

impl LivenessProbe for StagedLiveness {
    fn liveness(&self, owner: &Owner) -> Liveness {
        if self
            .dead_pids
            .lock()
            .expect("not poisoned")
            .contains(&owner.pid)
        {
            Liveness::Dead
        } else {
            Liveness::Alive
        }
    }
}

pub(crate) fn owner(pid: u32) -> Owner {
    Owner {
        host: "test-host".into(),
        boot_id: "test-boot".into(),
        pid,
        start_ticks: 1000 + u64::from(pid),
    }
}

/// One test setup: a temp directory with a log, a world, and kernels acting as processes.
pub(crate) struct Fixture {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) fsm: Guardrail,
    pub(crate) limits: Limits,
    pub(crate) world: Arc<World>,
    pub(crate) liveness: Arc<StagedLiveness>,
    /// How far ahead of the log's clock the kernels made from now on read the time, in ms:
    /// an operator acting days later.
    pub(crate) clock_ahead_ms: u64,
    /// One clock for the log and every kernel made from now on, instead of a tick clock
    /// each: the test moves the time.
    pub(crate) clock: Option<Arc<dyn Clock>>,
    /// Where the log is: `None` for SQLite in `dir`, else a PostgreSQL schema.
    pub(crate) postgres: Option<Schema>,
}

/// The variable that runs this suite on PostgreSQL (`postgres`) instead of SQLite.
const BACKEND_VARIABLE: &str = "AGENT_KERNEL_TEST_LOG";

/// A fresh schema on the test server when the suite runs on PostgreSQL.
fn postgres_schema() -> Option<Schema> {
    match std::env::var(BACKEND_VARIABLE).as_deref() {
        Ok("postgres") => {
            let server = agent_kernel_log_contract::postgres::server()
                .expect("AGENT_KERNEL_TEST_LOG=postgres needs AGENT_KERNEL_TEST_POSTGRES");
            Some(Schema::create(&server))
        }
        Ok("sqlite") | Err(_) => None,
        Ok(other) => panic!("{BACKEND_VARIABLE} is `{other}`: `sqlite` or `postgres`"),
    }
}

/// A PostgreSQL log that keeps its owners' liveness to the staged probe, as SQLite does:
/// these tests kill processes by saying so, not by letting leases run out.
struct StagedLeases(agent_kernel_txlog_postgres::PostgresLog);

impl TxLog for StagedLeases {
    fn write(
        &self,
        batch: Vec<agent_kernel_api::LogWrite>,
    ) -> agent_kernel_api::BoxFuture<
        '_,
        Result<Vec<agent_kernel_api::WriteOutcome>, agent_kernel_api::TxError>,
    > {
        self.0.write(batch)
    }
    fn effect_allowed(&self) -> Result<(), agent_kernel_api::TxError> {
        self.0.effect_allowed()
    }
    // No `end_lease`: liveness here is the staged probe's, and this log keeps no leases.
    fn saga<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> agent_kernel_api::BoxFuture<
        'a,
        Result<Option<agent_kernel_api::SagaRecord>, agent_kernel_api::TxError>,
    > {
        self.0.saga(saga_id)
    }
    fn sagas(
        &self,
        limit: u32,
    ) -> agent_kernel_api::BoxFuture<
        '_,
        Result<Vec<agent_kernel_api::SagaSummary>, agent_kernel_api::TxError>,
    > {
        self.0.sagas(limit)
    }
    fn saga_counts(
        &self,
    ) -> agent_kernel_api::BoxFuture<
        '_,
        Result<Vec<(agent_kernel_api::SagaState, u64)>, agent_kernel_api::TxError>,
    > {
        self.0.saga_counts()
    }
    fn saga_page<'a>(
        &'a self,
        query: &'a agent_kernel_api::SagaQuery,
    ) -> agent_kernel_api::BoxFuture<
        'a,
        Result<Vec<agent_kernel_api::SagaListing>, agent_kernel_api::TxError>,
    > {
        self.0.saga_page(query)
    }
    fn unfinished_sagas(
        &self,
    ) -> agent_kernel_api::BoxFuture<
        '_,
        Result<Vec<agent_kernel_api::SagaSummary>, agent_kernel_api::TxError>,
    > {
        self.0.unfinished_sagas()
    }
    fn duplicate_of<'a>(
        &'a self,
        saga_id: &'a agent_kernel_api::SagaId,
        tool_id: &'a str,
        keys: &'a [String],
        since_ms: i64,
    ) -> agent_kernel_api::BoxFuture<
        'a,
        Result<Option<agent_kernel_api::DuplicateStep>, agent_kernel_api::TxError>,
    > {
        self.0.duplicate_of(saga_id, tool_id, keys, since_ms)
    }
    fn later_claim<'a>(
        &'a self,
        saga_id: &'a agent_kernel_api::SagaId,
        resource: &'a str,
        since_ms: i64,
    ) -> agent_kernel_api::BoxFuture<
        'a,
        Result<Option<agent_kernel_api::LaterClaim>, agent_kernel_api::TxError>,
    > {
        self.0.later_claim(saga_id, resource, since_ms)
    }
    fn key_binding<'a>(
        &'a self,
        key: &'a str,
    ) -> agent_kernel_api::BoxFuture<
        'a,
        Result<Option<agent_kernel_api::KeyBinding>, agent_kernel_api::TxError>,
    > {
        self.0.key_binding(key)
    }
    fn take_over<'a>(
        &'a self,
        saga_id: &'a SagaId,
        expected_owner: &'a Owner,
        expected_state: agent_kernel_api::SagaState,
        new_owner: &'a Owner,
    ) -> agent_kernel_api::BoxFuture<'a, Result<bool, agent_kernel_api::TxError>> {
        self.0
            .take_over(saga_id, expected_owner, expected_state, new_owner)
    }
    fn take_over_and_write<'a>(
        &'a self,
        saga_id: &'a SagaId,
        expected_owner: &'a Owner,
        expected_state: agent_kernel_api::SagaState,
        new_owner: &'a Owner,
        then: Vec<agent_kernel_api::LogWrite>,
    ) -> agent_kernel_api::BoxFuture<'a, Result<bool, agent_kernel_api::TxError>> {
        self.0
            .take_over_and_write(saga_id, expected_owner, expected_state, new_owner, then)
    }
    fn saga_records<'a>(
        &'a self,
        saga_ids: &'a [SagaId],
    ) -> agent_kernel_api::BoxFuture<
        'a,
        Result<Vec<Option<agent_kernel_api::SagaRecord>>, agent_kernel_api::TxError>,
    > {
        self.0.saga_records(saga_ids)
    }
    fn approval<'a>(
        &'a self,
        approval_id: &'a str,
    ) -> agent_kernel_api::BoxFuture<
        'a,
        Result<Option<agent_kernel_api::ApprovalRecord>, agent_kernel_api::TxError>,
    > {
        self.0.approval(approval_id)
    }
    fn saga_approval<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> agent_kernel_api::BoxFuture<
        'a,
        Result<Option<agent_kernel_api::ApprovalRecord>, agent_kernel_api::TxError>,
    > {
        self.0.saga_approval(saga_id)
    }
    fn vouched_saga_approval<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> agent_kernel_api::BoxFuture<
        'a,
        Result<Option<agent_kernel_api::ApprovalRecord>, agent_kernel_api::TxError>,
    > {
        self.0.vouched_saga_approval(saga_id)
    }
    fn pending_approvals(
        &self,
    ) -> agent_kernel_api::BoxFuture<
        '_,
        Result<Vec<agent_kernel_api::ApprovalRecord>, agent_kernel_api::TxError>,
    > {
        self.0.pending_approvals()
    }
    fn dead_letter<'a>(
        &'a self,
        letter_id: &'a str,
    ) -> agent_kernel_api::BoxFuture<
        'a,
        Result<Option<agent_kernel_api::DeadLetter>, agent_kernel_api::TxError>,
    > {
        self.0.dead_letter(letter_id)
    }
    fn open_dead_letters<'a>(
        &'a self,
        saga_id: Option<&'a SagaId>,
    ) -> agent_kernel_api::BoxFuture<
        'a,
        Result<Vec<agent_kernel_api::DeadLetter>, agent_kernel_api::TxError>,
    > {
        self.0.open_dead_letters(saga_id)
    }
    fn prune_candidates(
        &self,
        before_ms: i64,
        after: Option<(i64, SagaId)>,
        limit: u32,
    ) -> agent_kernel_api::BoxFuture<
        '_,
        Result<Vec<agent_kernel_api::SagaRecord>, agent_kernel_api::TxError>,
    > {
        self.0.prune_candidates(before_ms, after, limit)
    }
    // `owner_lease` is left to its default: no lease is consulted.
}

impl Fixture {
    pub(crate) fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
            fsm: Guardrail::builtin(),
            limits: Limits::default(),
            world: Arc::new(World::default()),
            liveness: Arc::new(StagedLiveness::default()),
            clock_ahead_ms: 0,
            clock: None,
            postgres: postgres_schema(),
        }
    }

    /// `audit verify` of the fixture's log.
    /// On SQLite, also checked against the same check keeping one entry of each replayed
    /// table in memory (the rest in its scratch database): both must say the same.
    pub(crate) fn verify(&self) -> AuditReport {
        match &self.postgres {
            Some(schema) => agent_kernel_txlog_postgres::verify(&schema.url(), None, None),
            None => {
                let path = self.dir.path().join("log.db");
                let report = agent_kernel_txlog::verify(&path, None);
                let bounded = agent_kernel_txlog::verify_bounded(&path, None, 1);
                assert_eq!(format!("{report:?}"), format!("{bounded:?}"));
                report
            }
        }
        .expect("verifies")
    }

    /// The bodies of the audit records of `kind`, newest first.
    pub(crate) fn audit_bodies(&self, kind: &str) -> Vec<Value> {
        match &self.postgres {
            Some(schema) => schema
                .rows(&format!(
                    "SELECT body FROM audit_log WHERE kind = '{kind}' ORDER BY seq DESC LIMIT 1000"
                ))
                .into_iter()
                .map(|row| serde_json::from_str(row[0].as_deref().expect("a body")).expect("JSON"))
                .collect(),
            None => agent_kernel_txlog::audit_records(
                &self.dir.path().join("log.db"),
                &agent_kernel_txlog::AuditQuery {
                    kinds: vec![kind.to_owned()],
                    saga_id: None,
                    limit: 1000,
                },
            )
            .expect("reads the audit records")
            .into_iter()
            .map(|record| record.body)
            .collect(),
        }
    }

    /// The processes `pids` die: recovery may take their sagas over.
    pub(crate) fn kill(&self, pids: impl IntoIterator<Item = u32>) {
        self.liveness
            .dead_pids
            .lock()
            .expect("not poisoned")
            .extend(pids);
    }

    pub(crate) fn open_log(&self) -> Arc<dyn TxLog> {
        let options = LogOptions {
            durability: Durability::Normal,
            clock: self
                .clock
                .clone()
                .unwrap_or_else(|| Arc::new(TickClock(AtomicU64::new(0)))),
        };
        match &self.postgres {
            Some(schema) => {
                let worker = agent_kernel_txlog_postgres::Worker::new(owner(4_000_000));
                let log = agent_kernel_txlog_postgres::PostgresLog::open(
                    &schema.url(),
                    options,
                    None,
                    worker,
                )
                .expect("log opens");
                Arc::new(StagedLeases(log))
            }
            None => Arc::new(
                SqliteLog::open(&self.dir.path().join("log.db"), options).expect("log opens"),
            ),
        }
    }

    /// The SQLite log itself (a new connection), when the suite runs on SQLite.
    pub(crate) fn open_sqlite(&self) -> Option<Arc<SqliteLog>> {
        self.postgres.is_none().then(|| {
            Arc::new(
                SqliteLog::open(
                    &self.dir.path().join("log.db"),
                    LogOptions {
                        durability: Durability::Normal,
                        clock: self
                            .clock
                            .clone()
                            .unwrap_or_else(|| Arc::new(TickClock(AtomicU64::new(0)))),
                    },
                )
                .expect("log opens"),
            )
        })
    }

    /// A kernel acting as process `pid` over a fresh connection to the shared log.
    pub(crate) fn kernel(&self, pid: u32) -> Kernel {
        self.kernel_on(self.open_log(), pid)
    }

    pub(crate) fn kernel_on(&self, log: Arc<dyn TxLog>, pid: u32) -> Kernel {
        self.kernel_over(log.clone(), log, pid)
    }

    /// A kernel acting as process `pid` that sees the log through `log` (a wrapper, say);
    /// `sqlite` is the log underneath, which the `probe` tool reads.
    pub(crate) fn kernel_over(
        &self,
        log: Arc<dyn agent_kernel_api::TxLog>,
        sqlite: Arc<dyn TxLog>,
        pid: u32,
    ) -> Kernel {
        self.kernel_with(log, sqlite, pid, true)
    }

    /// A kernel acting as process `pid` that lacks the `ledger.add` tool, as another program
    /// (the stock binary, say) would.
    pub(crate) fn kernel_without_ledger(&self, pid: u32) -> Kernel {
        let log = self.open_log();
        self.kernel_with(log.clone(), log, pid, false)
    }

    fn kernel_with(
        &self,
        log: Arc<dyn agent_kernel_api::TxLog>,
        sqlite: Arc<dyn TxLog>,
        pid: u32,
        with_ledger: bool,
    ) -> Kernel {
        let mut tools =
            Dispatcher::new(self.limits.clone(), Arc::new(NoJitter)).expect("valid limits");
        if with_ledger {
            tools
                .register(ToolEntry::compensated(Ledger {
                    world: self.world.clone(),
                }))
                .expect("registers");
        }
        tools
            .register(ToolEntry::compensated(Boom))
            .expect("registers");
        for (id, settlement, reversibility) in [
            ("blind.add", Settlement::Compensate, Reversibility::Full),
            ("probed.add", Settlement::Probe, Reversibility::Full),
            ("opaque.add", Settlement::Operator, Reversibility::Full),
            // Irreversible: every step of it waits for an operator's approval.
            ("send.once", Settlement::Operator, Reversibility::None),
        ] {
            tools
                .register(ToolEntry::compensated_probed(Settled {
                    id,
                    settlement,
                    reversibility,
                    world: self.world.clone(),
                }))
                .expect("registers");
        }
        tools
            .register(ToolEntry::compensated(ProbeTool {
                world: self.world.clone(),
                log: sqlite,
            }))
            .expect("registers");
        Kernel::new(
            log,
            Arc::new(tools),
            Arc::new(self.fsm.clone()),
            Environment {
                clock: self
                    .clock
                    .clone()
                    .unwrap_or_else(|| Arc::new(TickClock(AtomicU64::new(self.clock_ahead_ms)))),
                ids: Arc::new(CountingIds {
                    prefix: format!("p{pid}"),
                    next: AtomicU64::new(0),
                }),
                owner: owner(pid),
                liveness: self.liveness.clone(),
            },
            Durability::Normal,
        )
    }
}

/// The longest [`abandon_when`] waits for its condition.
const ABANDON_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs `plan` on `kernel` until `ready` holds, then abandons it, as a killed process would
/// leave it: unlike a fixed delay, a slow machine cannot make it abandon the saga early.
pub(crate) async fn abandon_when(kernel: &Kernel, plan: &Plan, ready: impl Fn() -> bool) {
    let run = kernel.run(plan, &NoObserver);
    tokio::pin!(run);
    let deadline = tokio::time::Instant::now() + ABANDON_WAIT_MAX;
    loop {
        tokio::select! {
            ended = &mut run => panic!(
                "the saga must still be running when abandoned; it ended (ok: {})",
                ended.is_ok()
            ),
            () = tokio::time::sleep(std::time::Duration::from_millis(2)) => {
                if ready() {
                    return;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the saga never reached the point to abandon it at"
                );
            }
        }
    }
}

pub(crate) fn add(item: &str) -> PlanStep {
    PlanStep {
        tool: "ledger.add".into(),
        args: json!({ "item": item }),
        idempotency_key: None,
    }
}

pub(crate) fn add_keyed(item: &str, key: &str) -> PlanStep {
    PlanStep {
        idempotency_key: Some(key.into()),
        ..add(item)
    }
}

pub(crate) fn boom() -> PlanStep {
    PlanStep {
        tool: "boom".into(),
        args: json!({}),
        idempotency_key: None,
    }
}

pub(crate) fn probe(args: Value) -> PlanStep {
    PlanStep {
        tool: "probe".into(),
        args,
        idempotency_key: None,
    }
}

pub(crate) fn plan(steps: Vec<PlanStep>) -> Plan {
    let plan = Plan {
        name: Some("test".into()),
        actor: Some("tester".into()),
        steps,
    };
    plan.validate().expect("test plans are valid");
    plan
}
