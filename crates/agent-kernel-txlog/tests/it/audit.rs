//! The audit chain: real logs written through `SqliteLog`, verified clean, then tampered
//! with on copies (with rusqlite, as someone holding the database file would) and every
//! tampering detected by `verify`, naming the record.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicI64;

use agent_kernel_api::{
    AuditEvent, BeginStep, Durability, EffectClass, LogWrite, NewSaga, OperatorCommand, PlanDenial,
    SagaId, SagaState, StepDenial, ToolError, ToolOutput, TxError, TxLog, Undo, WriteOutcome,
};
use agent_kernel_txlog::{
    AuditKey, AuditReport, LogOptions, SqliteLog, audit_head_path, downgrade_in_place,
    verify_ignoring_head_file,
};
use rusqlite::{Connection, params};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::{StepClock, owner, verify};

mod records;
mod tables;

/// A small deterministic generator (SplitMix64), so that a failing seed reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn text(&mut self) -> String {
        const PIECES: [&str; 8] = ["a", "é", "日本", "\n", "\"q\"", "\\", " ", "x\u{0}y"];
        (0..self.below(12))
            .map(|_| PIECES[self.below(PIECES.len() as u64) as usize])
            .collect()
    }

    fn bytes(&mut self, n_max: u64) -> Vec<u8> {
        (0..self.below(n_max)).map(|_| self.next() as u8).collect()
    }
}

pub(crate) fn key() -> AuditKey {
    AuditKey::from_hex(&"5a".repeat(32)).expect("a 32-byte key")
}

pub(crate) fn open_log(path: &Path, key: Option<AuditKey>, durability: Durability) -> SqliteLog {
    SqliteLog::open_with_audit_key(
        path,
        LogOptions {
            durability,
            clock: Arc::new(StepClock(AtomicI64::new(1_700_000_000_000))),
        },
        key,
    )
    .expect("opens")
}

fn step(rng: &mut Rng, saga: &str, step_seq: u32, key: Option<String>) -> BeginStep {
    let blob = rng.chance(60).then(|| rng.bytes(600));
    BeginStep {
        saga_id: SagaId::new(saga),
        step_seq,
        tool_id: ["fs.write", "fs.append", "http.get", "noop"][rng.below(4) as usize].into(),
        tool_version: "1.0.0".into(),
        effect: if rng.chance(70) {
            EffectClass::Mutating
        } else {
            EffectClass::ReadOnly
        },
        args: json!({
            "path": format!("ws/{}.txt", rng.below(1000)),
            "content": rng.text(),
            "ratio": rng.next() as f64 / 7.0,
            "nested": {"z": rng.below(9), "a": [1, null, true]},
        }),
        args_hash: format!("{:064x}", rng.next()),
        idempotency_key: key,
        undo: Undo {
            data: json!({"existed": rng.chance(50), "len": rng.below(5000)}),
            blob,
        },
        // Each step its own resource, so no claim is refused; the records carry them.
        resources: if rng.chance(50) {
            vec![format!("file:/{saga}/{step_seq}"), format!("acct:{saga}")]
        } else {
            Vec::new()
        },
        duplicate_keys: if rng.chance(30) {
            vec![format!("inv:{}", rng.below(50))]
        } else {
            Vec::new()
        },
        duplicate_check: None,
    }
}

fn create(saga: &str, n_steps: u32) -> LogWrite {
    LogWrite::CreateSaga(NewSaga {
        saga_id: SagaId::new(saga),
        name: Some(format!("plan {saga}")),
        actor: saga.len().is_multiple_of(2).then(|| "tester".to_owned()),
        owner: owner(1),
        n_steps,
        state: SagaState::Acting,
        dry_run: false,
        require_actor_idle: false,
    })
}

/// A dry run as the kernel records it: one batch, simulated steps, a terminal state.
fn dry_run(rng: &mut Rng, saga: &str, n_steps: u32) -> Vec<LogWrite> {
    let mut batch = vec![LogWrite::CreateSaga(NewSaga {
        saga_id: SagaId::new(saga),
        name: Some(format!("dry {saga}")),
        actor: None,
        owner: owner(1),
        n_steps,
        state: SagaState::Acting,
        dry_run: true,
        require_actor_idle: false,
    })];
    let failing = rng.chance(30).then(|| rng.below(u64::from(n_steps)) as u32);
    for step_seq in 0..n_steps {
        // Keys are never claimed by simulated steps, so any key may appear.
        let key = rng
            .chance(50)
            .then(|| format!("shared-key-{}", rng.below(3)));
        let simulated = step(rng, saga, step_seq, key);
        let result = if failing == Some(step_seq) {
            Err(ToolError::denied("the FSM would deny it"))
        } else {
            Ok(ToolOutput::new(json!({"dry_run": true, "n": step_seq})))
        };
        batch.push(LogWrite::SimulateStep {
            step: simulated,
            result,
        });
        if failing == Some(step_seq) {
            break;
        }
    }
    let end = if failing.is_some() {
        SagaState::FailedRolledBack
    } else {
        SagaState::Done
    };
    batch.push(set_state(saga, end));
    batch
}

/// An operator command or a refused plan: records that change no table.
fn audit_event(rng: &mut Rng, n: u64) -> LogWrite {
    if rng.chance(50) {
        LogWrite::Audit(AuditEvent::Operator(OperatorCommand {
            command: "rollback".into(),
            saga_id: rng.chance(50).then(|| SagaId::new(format!("target-{n}"))),
            options: if rng.chance(30) {
                vec!["--skip-verify".into()]
            } else {
                Vec::new()
            },
            by: owner(3),
            uid: Some(1000),
        }))
    } else {
        LogWrite::Audit(AuditEvent::PlanDenied(PlanDenial {
            name: Some(rng.text()),
            actor: None,
            dry_run: rng.chance(30),
            by: owner(3),
            denials: vec![
                StepDenial {
                    step_idx: Some(0),
                    tool: Some("fs.write".into()),
                    args: Some(json!({"path": "/etc/passwd", "content": rng.text()})),
                    reason: format!("outside every allowed root {}", rng.text()),
                },
                StepDenial {
                    step_idx: None,
                    tool: None,
                    args: None,
                    reason: "actor busy".into(),
                },
            ],
        }))
    }
}

fn commit(rng: &mut Rng, saga: &str, step_seq: u32) -> LogWrite {
    LogWrite::CommitStep {
        saga_id: SagaId::new(saga),
        step_seq,
        output: ToolOutput::new(json!({"bytes": rng.below(100), "text": rng.text()}))
            .with_effect(format!("wrote {}", rng.text())),
    }
}

fn set_state(saga: &str, state: SagaState) -> LogWrite {
    LogWrite::SetState {
        saga_id: SagaId::new(saga),
        state,
    }
}

fn compensation(saga: &str, step_seq: u32, ok: bool) -> LogWrite {
    LogWrite::Compensation {
        saga_id: SagaId::new(saga),
        step_seq,
        result: if ok {
            Ok(format!("restored step {step_seq}"))
        } else {
            Err(ToolError::failed("the file changed meanwhile"))
        },
    }
}

async fn write(log: &SqliteLog, batch: Vec<LogWrite>) -> Vec<WriteOutcome> {
    log.write(batch).await.expect("writes")
}

/// Writes one saga of a shape chosen by `rng`; it ends in a terminal state unless
/// `leave_unfinished`.
async fn write_saga(log: &SqliteLog, rng: &mut Rng, saga: &str, leave_unfinished: bool) {
    let n_steps = 1 + rng.below(4) as u32;
    let keyed =
        |rng: &mut Rng, step_seq: u32| rng.chance(40).then(|| format!("key-{saga}-{step_seq}"));
    let first_key = keyed(rng, 0);
    let first = step(rng, saga, 0, first_key);
    match rng.below(7) {
        // Every step commits.
        0 | 1 => {
            write(log, vec![create(saga, n_steps), LogWrite::BeginStep(first)]).await;
            for step_seq in 1..n_steps {
                let next_key = keyed(rng, step_seq);
                let next = step(rng, saga, step_seq, next_key);
                write(
                    log,
                    vec![commit(rng, saga, step_seq - 1), LogWrite::BeginStep(next)],
                )
                .await;
            }
            if leave_unfinished {
                return;
            }
            write(
                log,
                vec![
                    commit(rng, saga, n_steps - 1),
                    set_state(saga, SagaState::Done),
                ],
            )
            .await;
        }
        // A step fails; the committed ones are compensated (one of them perhaps not).
        2 | 3 => {
            write(log, vec![create(saga, n_steps), LogWrite::BeginStep(first)]).await;
            let failing = rng.below(u64::from(n_steps)) as u32;
            for step_seq in 1..=failing {
                let next_key = keyed(rng, step_seq);
                let next = step(rng, saga, step_seq, next_key);
                write(
                    log,
                    vec![commit(rng, saga, step_seq - 1), LogWrite::BeginStep(next)],
                )
                .await;
            }
            write(
                log,
                vec![LogWrite::FailStep {
                    saga_id: SagaId::new(saga),
                    step_seq: failing,
                    error: ToolError::uncertain(format!("disk full {}", rng.text())),
                }],
            )
            .await;
            if leave_unfinished {
                return;
            }
            write(log, vec![set_state(saga, SagaState::Compensating)]).await;
            let mut all_ok = true;
            for step_seq in (0..failing).rev() {
                let ok = rng.chance(85);
                all_ok &= ok;
                write(log, vec![compensation(saga, step_seq, ok)]).await;
            }
            let end = if all_ok {
                SagaState::FailedRolledBack
            } else {
                SagaState::FailedRollbackPartial
            };
            write(log, vec![set_state(saga, end)]).await;
        }
        // Refused before it began (a denial), or reused from an earlier saga.
        4 => {
            let refused = LogWrite::RefuseStep {
                step: first,
                error: ToolError::denied(format!("path outside the roots {}", rng.text())),
            };
            write(log, vec![create(saga, 1), refused]).await;
            if leave_unfinished {
                return;
            }
            write(log, vec![set_state(saga, SagaState::FailedRolledBack)]).await;
        }
        // A dry run: written whole in one batch, never unfinished.
        6 => {
            let batch = dry_run(rng, saga, n_steps);
            write(log, batch).await;
        }
        // Its owner died: another process takes it over and rolls it back.
        _ => {
            if rng.chance(50) {
                let reused = LogWrite::ReuseStep {
                    step: first.clone(),
                    from_saga_id: SagaId::new("elsewhere"),
                    from_step_seq: 3,
                    output: ToolOutput::new(json!({"bytes": 5})),
                };
                write(log, vec![create(saga, 2), reused]).await;
                let next = step(rng, saga, 1, None);
                write(log, vec![LogWrite::BeginStep(next)]).await;
            } else {
                write(log, vec![create(saga, 2), LogWrite::BeginStep(first)]).await;
            }
            let saga_id = SagaId::new(saga);
            assert!(
                log.take_over(&saga_id, &owner(1), SagaState::Acting, &owner(2))
                    .await
                    .expect("takes over")
            );
            if leave_unfinished {
                return;
            }
            write(log, vec![set_state(saga, SagaState::Compensating)]).await;
            write(log, vec![compensation(saga, 0, true)]).await;
            write(log, vec![set_state(saga, SagaState::FailedRolledBack)]).await;
        }
    }
}

/// A realistic log: `n_sagas` sagas of every shape, some left unfinished, two sagas that
/// contend for an idempotency key; it ends with a finished saga, so the head file names
/// the newest record.
async fn build_log(path: &Path, seed: u64, n_sagas: u32, key: Option<AuditKey>) {
    let log = open_log(path, key, Durability::Normal);
    let mut rng = Rng(seed);
    for saga_idx in 0..n_sagas {
        let unfinished = saga_idx + 1 < n_sagas && rng.chance(15);
        write_saga(
            &log,
            &mut rng,
            &format!("saga-{seed}-{saga_idx}"),
            unfinished,
        )
        .await;
        if rng.chance(10) {
            let event = audit_event(&mut rng, u64::from(saga_idx));
            write(&log, vec![event]).await;
        }
    }
    // Key contention: the second claim is rejected and recorded as FAIL.
    let (holder, rival) = (format!("hold-{seed}"), format!("rival-{seed}"));
    let held = step(&mut rng, &holder, 0, Some(format!("shared-{seed}")));
    let mut rival_step = held.clone();
    rival_step.saga_id = SagaId::new(&rival);
    write(&log, vec![create(&holder, 1), LogWrite::BeginStep(held)]).await;
    let outcomes = write(
        &log,
        vec![create(&rival, 1), LogWrite::BeginStep(rival_step)],
    )
    .await;
    assert!(
        matches!(outcomes[1], WriteOutcome::KeyRejected(_)),
        "{outcomes:?}"
    );
    write(&log, vec![set_state(&rival, SagaState::FailedRolledBack)]).await;
    write(
        &log,
        vec![
            commit(&mut rng, &holder, 0),
            set_state(&holder, SagaState::Done),
        ],
    )
    .await;
}

/// The head the head file names, as a JSON object (`seq`, `hash`, `mac`): the slot with
/// the larger `seq`, without its `sum`.
fn head_in_file(db: &Path) -> Value {
    let text = fs::read_to_string(audit_head_path(db)).expect("a head file");
    let mut newest: Option<Value> = None;
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        let mut slot: Value = serde_json::from_str(line).expect("a JSON slot");
        slot.as_object_mut().expect("an object").remove("sum");
        if newest
            .as_ref()
            .is_none_or(|kept| kept["seq"].as_i64() < slot["seq"].as_i64())
        {
            newest = Some(slot);
        }
    }
    newest.expect("a slot holds the head")
}

/// A consistent copy of the database (`VACUUM INTO`) with its head file, as someone
/// with the files would take it.
fn copy_log(from: &Path, to: &Path) {
    let conn = Connection::open(from).expect("opens");
    conn.execute("VACUUM INTO ?1", params![to.to_str().expect("utf8")])
        .expect("copies");
    if audit_head_path(from).exists() {
        fs::copy(audit_head_path(from), audit_head_path(to)).expect("copies the head file");
    }
}

fn assert_intact(path: &Path, key: Option<&AuditKey>) -> AuditReport {
    let report = verify(path, key).expect("verifies");
    assert!(report.is_intact(), "{}: {report:#?}", path.display());
    report
}

/// Verifies and returns the first bad record's seq and reason.
fn first_bad(path: &Path, key: Option<&AuditKey>) -> (u64, String) {
    let report = verify(path, key).expect("verifies");
    let bad = report
        .first_bad
        .unwrap_or_else(|| panic!("tampering not detected in {}", path.display()));
    eprintln!("{}: record {}: {}", path.display(), bad.seq, bad.reason);
    (bad.seq, bad.reason)
}

fn last_seq(conn: &Connection) -> i64 {
    conn.query_row("SELECT max(seq) FROM audit_log", [], |row| row.get(0))
        .expect("reads")
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// The same hash the log computes, for an attacker who rewrites the chain.
pub(crate) fn record_hash(
    prev: &str,
    seq: i64,
    at_ms: i64,
    kind: &str,
    saga: &str,
    body: &str,
) -> String {
    sha256_hex(format!("{prev}\n{seq}\n{at_ms}\n{kind}\n{saga}\n{body}").as_bytes())
}

/// A log for tampering with, and a scratch folder for its copies.
struct Fixture {
    dir: tempfile::TempDir,
    original: PathBuf,
}

impl Fixture {
    async fn new(key: Option<AuditKey>) -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        let original = dir.path().join("log.db");
        build_log(&original, 42, 12, key).await;
        Fixture { dir, original }
    }

    /// A fresh copy to tamper with, through a connection to it.
    fn copy(&self, name: &str) -> (PathBuf, Connection) {
        let path = self.dir.path().join(name);
        copy_log(&self.original, &path);
        let conn = Connection::open(&path).expect("opens the copy");
        // As an attacker would: nothing stops an edit that breaks a reference.
        conn.pragma_update(None, "foreign_keys", "OFF")
            .expect("turns off foreign keys");
        (path, conn)
    }
}

#[tokio::test]
async fn a_hundred_clean_logs_verify_without_a_false_positive() {
    let dir = tempfile::tempdir().expect("temp dir");
    for seed in 0..100_u64 {
        let path = dir.path().join(format!("log-{seed}.db"));
        let key = (seed % 2 == 0).then(key);
        eprintln!("seed {seed}");
        let n_sagas = 2 + (seed % 7) as u32;
        build_log(&path, seed, n_sagas, key.clone()).await;
        // Verified while the log is still in use by nobody, and again on a copy.
        let report = assert_intact(&path, key.as_ref());
        assert!(report.n_records > u64::from(n_sagas), "{report:#?}");
        assert_eq!(
            report.head, report.head_file,
            "the head file names the newest record"
        );
        assert_eq!(report.macs_verified, key.is_some());
        if key.is_some() {
            assert_eq!(report.n_records_with_mac, report.n_records);
            // Without the key, MACs are not checked, and nothing else is wrong.
            assert!(verify(&path, None).expect("verifies").is_intact());
        }
        if seed % 10 == 0 {
            let copy = dir.path().join(format!("copy-{seed}.db"));
            copy_log(&path, &copy);
            assert_intact(&copy, key.as_ref());
        }
    }
}

#[tokio::test]
async fn a_log_verifies_while_it_is_being_written_and_across_reopens() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    let mut rng = Rng(7);
    {
        let log = open_log(&path, None, Durability::Full);
        write_saga(&log, &mut rng, "first", false).await;
        // An unfinished saga: the head file lags behind the newest records.
        write(
            &log,
            vec![
                create("open", 2),
                LogWrite::BeginStep(step(&mut rng, "open", 0, None)),
            ],
        )
        .await;
        let report = assert_intact(&path, None);
        assert!(report.head_file.expect("head file").seq < report.head.expect("head").seq);
    }
    // Two logs on one file, writing at once, keep one chain.
    let (first, second) = (
        open_log(&path, None, Durability::Normal),
        open_log(&path, None, Durability::Normal),
    );
    let (mut rng_a, mut rng_b) = (Rng(8), Rng(9));
    tokio::join!(
        async {
            for n in 0..10 {
                write_saga(&first, &mut rng_a, &format!("a{n}"), false).await;
            }
        },
        async {
            for n in 0..10 {
                write_saga(&second, &mut rng_b, &format!("b{n}"), false).await;
            }
        }
    );
    assert_intact(&path, None);
}

#[tokio::test]
async fn every_change_is_recorded_once_with_hashes_not_bytes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    let log = open_log(&path, None, Durability::Full);
    let mut rng = Rng(3);
    let mut first = step(&mut rng, "s", 0, Some("k".into()));
    first.undo.blob = Some(b"SECRET-PREVIOUS-CONTENT".to_vec());
    write(&log, vec![create("s", 2), LogWrite::BeginStep(first)]).await;
    let refused = LogWrite::RefuseStep {
        step: step(&mut rng, "s", 1, None),
        error: ToolError::denied("path ws/../etc/passwd is outside the allowed roots"),
    };
    write(&log, vec![commit(&mut rng, "s", 0), refused]).await;
    assert!(
        log.take_over(&SagaId::new("s"), &owner(1), SagaState::Acting, &owner(2))
            .await
            .expect("takes over")
    );
    // A take-over that does not happen records nothing.
    assert!(
        !log.take_over(&SagaId::new("s"), &owner(1), SagaState::Acting, &owner(3))
            .await
            .expect("answers")
    );
    write(&log, vec![set_state("s", SagaState::FailedRolledBack)]).await;
    // A batch that fails records nothing either.
    assert!(
        log.write(vec![set_state("nope", SagaState::Done)])
            .await
            .is_err()
    );
    drop(log);

    let conn = Connection::open(&path).expect("opens");
    let rows: Vec<(i64, String, Option<String>, String)> = conn
        .prepare("SELECT seq, kind, saga_id, body FROM audit_log ORDER BY seq")
        .expect("prepares")
        .query_map([], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
        })
        .expect("reads")
        .collect::<Result<_, _>>()
        .expect("reads");
    let kinds: Vec<&str> = rows.iter().map(|row| row.1.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "CreateSaga",
            "BeginStep",
            "CommitStep",
            "RefuseStep",
            "TakeOver",
            "SetState"
        ]
    );
    assert_eq!(
        rows.iter().map(|row| row.0).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6]
    );
    assert!(rows.iter().all(|row| row.2.as_deref() == Some("s")));
    for (_, _, _, body) in &rows {
        assert!(
            !body.contains("SECRET"),
            "blob bytes never enter the chain: {body}"
        );
        let value: Value = serde_json::from_str(body).expect("JSON");
        assert_eq!(
            serde_json::to_string(&value).expect("serializes"),
            *body,
            "canonical"
        );
    }
    let begin: Value = serde_json::from_str(&rows[1].3).expect("JSON");
    assert_eq!(
        begin["undo_blob_sha256"],
        sha256_hex(b"SECRET-PREVIOUS-CONTENT")
    );
    assert_eq!(begin["idempotency_key"], "k");
    let refusal: Value = serde_json::from_str(&rows[3].3).expect("JSON");
    assert!(refusal["tool"].is_string(), "{refusal}");
    assert_eq!(refusal["error"]["kind"], "denied");
    assert!(
        refusal["error"]["message"]
            .as_str()
            .expect("reason")
            .contains("outside the allowed roots")
    );
    assert!(
        refusal["args_summary"]
            .as_str()
            .expect("summary")
            .contains("ws/")
    );
    let take_over: Value = serde_json::from_str(&rows[4].3).expect("JSON");
    assert_eq!(take_over["from_owner"]["pid"], 1);
    assert_eq!(take_over["to_owner"]["pid"], 2);
    assert_intact(&path, None);
}

#[tokio::test]
async fn the_head_file_moves_when_a_saga_ends_or_is_taken_over_not_on_every_step() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    let log = open_log(&path, None, Durability::Full);
    let head_seq = || head_in_file(&path)["seq"].as_i64().expect("seq");
    assert_eq!(head_seq(), 0, "written when the log is first opened");
    let mut rng = Rng(1);
    write(
        &log,
        vec![
            create("s", 2),
            LogWrite::BeginStep(step(&mut rng, "s", 0, None)),
        ],
    )
    .await;
    write(
        &log,
        vec![
            commit(&mut rng, "s", 0),
            LogWrite::BeginStep(step(&mut rng, "s", 1, None)),
        ],
    )
    .await;
    assert_eq!(head_seq(), 0, "steps do not move it");
    assert!(
        log.take_over(&SagaId::new("s"), &owner(1), SagaState::Acting, &owner(2))
            .await
            .expect("takes over")
    );
    assert_eq!(head_seq(), 5);
    write(
        &log,
        vec![commit(&mut rng, "s", 1), set_state("s", SagaState::Done)],
    )
    .await;
    assert_eq!(head_seq(), 7);
    let names: Vec<String> = fs::read_dir(dir.path())
        .expect("lists")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.contains("audit-head"))
        .collect();
    assert_eq!(names, ["log.db.audit-head"], "no temporary head files left");
}

#[tokio::test]
async fn editing_a_record_is_detected_at_that_record() {
    let fixture = Fixture::new(None).await;
    let (path, conn) = fixture.copy("edited.db");
    let seq: i64 = conn
        .query_row(
            "SELECT seq FROM audit_log WHERE kind = 'SetState' ORDER BY seq LIMIT 1",
            [],
            |row| row.get(0),
        )
        .expect("a SetState record");
    conn.execute(
        "UPDATE audit_log SET body = replace(body, '\"state\":\"', '\"state\":\"X') WHERE seq = ?1",
        params![seq],
    )
    .expect("edits");
    let (bad, reason) = first_bad(&path, None);
    assert_eq!(bad, seq as u64, "{reason}");
    assert!(reason.contains("edited"), "{reason}");
}

#[tokio::test]
async fn editing_a_step_status_in_the_tables_is_detected_at_the_record_that_set_it() {
    let fixture = Fixture::new(None).await;
    let (path, conn) = fixture.copy("status.db");
    // Hide a failed compensation, or else a failure, by editing saga_steps alone.
    let (saga_id, step_seq, status): (String, i64, String) = conn
        .query_row(
            "SELECT saga_id, step_seq, status FROM saga_steps
             WHERE status IN ('COMPENSATION_FAILED', 'FAIL') ORDER BY status DESC LIMIT 1",
            [],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .expect("a failed step");
    conn.execute(
        "UPDATE saga_steps SET status = 'COMMIT' WHERE saga_id = ?1 AND step_seq = ?2",
        params![saga_id, step_seq],
    )
    .expect("edits");
    let setter: i64 = conn
        .query_row(
            "SELECT max(seq) FROM audit_log
             WHERE saga_id = ?1 AND json_extract(body, '$.step_seq') = ?2
                 AND json_extract(body, '$.status') = ?3",
            params![saga_id, step_seq, status],
            |row| row.get(0),
        )
        .expect("the record that set the status");
    let (bad, reason) = first_bad(&path, None);
    assert_eq!(bad, setter as u64, "{reason}");
    assert!(
        reason.contains("status") && reason.contains(&saga_id),
        "{reason}"
    );
}

#[tokio::test]
async fn editing_a_saga_state_or_output_in_the_tables_is_detected() {
    let fixture = Fixture::new(None).await;
    let (path, conn) = fixture.copy("state.db");
    conn.execute(
        "UPDATE sagas SET state = 'Done' WHERE state = 'FailedRollbackPartial' OR state = 'FailedRolledBack'",
        [],
    )
    .expect("edits");
    let (_, reason) = first_bad(&path, None);
    assert!(reason.contains("state"), "{reason}");

    let (path, conn) = fixture.copy("output.db");
    conn.execute(
        "UPDATE saga_steps SET output = '{\"data\":\"forged\"}' WHERE output IS NOT NULL",
        [],
    )
    .expect("edits");
    let (_, reason) = first_bad(&path, None);
    assert!(reason.contains("output"), "{reason}");

    // A column the chain knows to be NULL, given a value: caught whatever the bound of
    // verify's memory (`crate::verify` compares the report with one entry in memory).
    let (path, conn) = fixture.copy("compensation.db");
    let n_changed = conn
        .execute(
            "UPDATE saga_steps SET compensation = 'forged' WHERE compensation IS NULL",
            [],
        )
        .expect("edits");
    assert!(n_changed > 0);
    let (_, reason) = first_bad(&path, None);
    assert!(reason.contains("compensation"), "{reason}");
    let (path, conn) = fixture.copy("actor.db");
    let n_changed = conn
        .execute("UPDATE sagas SET actor = 'forged' WHERE actor IS NULL", [])
        .expect("edits");
    assert!(n_changed > 0);
    let (_, reason) = first_bad(&path, None);
    assert!(reason.contains("actor"), "{reason}");

    let (path, conn) = fixture.copy("inserted.db");
    conn.execute(
        "INSERT INTO sagas SELECT 'forged', name, actor, state, owner_host, owner_boot_id,
             owner_pid, owner_start_ticks, n_steps, created_at_ms, updated_at_ms, dry_run
         FROM sagas LIMIT 1",
        [],
    )
    .expect("inserts");
    let last = last_seq(&conn);
    let (bad, reason) = first_bad(&path, None);
    assert_eq!(bad, last as u64 + 1, "{reason}");
    assert!(reason.contains("no audit record creates it"), "{reason}");
}

#[tokio::test]
async fn deleting_a_record_from_the_middle_is_detected() {
    let fixture = Fixture::new(None).await;
    let (path, conn) = fixture.copy("deleted.db");
    let middle = last_seq(&conn) / 2;
    conn.execute("DELETE FROM audit_log WHERE seq = ?1", params![middle])
        .expect("deletes");
    let (bad, reason) = first_bad(&path, None);
    assert_eq!(bad, middle as u64, "{reason}");
    assert!(reason.contains("missing"), "{reason}");
}

#[tokio::test]
async fn swapping_two_records_is_detected() {
    let fixture = Fixture::new(None).await;
    let (path, conn) = fixture.copy("swapped.db");
    let (a, b) = (5_i64, 9_i64);
    conn.execute_batch(&format!(
        "CREATE TEMP TABLE bodies AS SELECT seq, body FROM audit_log WHERE seq IN ({a}, {b});
         UPDATE audit_log SET body = (SELECT body FROM bodies
             WHERE bodies.seq = CASE audit_log.seq WHEN {a} THEN {b} ELSE {a} END)
         WHERE seq IN ({a}, {b});"
    ))
    .expect("swaps");
    // Swap whole rows too: renumber them.
    let (path2, conn2) = fixture.copy("swapped-rows.db");
    conn2
        .execute_batch(&format!(
            "UPDATE audit_log SET seq = -1 WHERE seq = {a};
             UPDATE audit_log SET seq = {a} WHERE seq = {b};
             UPDATE audit_log SET seq = {b} WHERE seq = -1;"
        ))
        .expect("swaps");
    let (bad, reason) = first_bad(&path, None);
    assert_eq!(bad, a as u64, "{reason}");
    let (bad, reason) = first_bad(&path2, None);
    assert_eq!(bad, a as u64, "{reason}");
}
