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

#[tokio::test]
async fn duplicating_a_record_is_detected() {
    let fixture = Fixture::new(None).await;
    // Appended at the end.
    let (path, conn) = fixture.copy("dup-end.db");
    let last = last_seq(&conn);
    conn.execute(
        "INSERT INTO audit_log (seq, at_ms, kind, saga_id, body, prev_hash, hash, mac)
         SELECT ?1, at_ms, kind, saga_id, body, prev_hash, hash, mac FROM audit_log WHERE seq = 3",
        params![last + 1],
    )
    .expect("duplicates");
    let (bad, reason) = first_bad(&path, None);
    assert_eq!(bad, last as u64 + 1, "{reason}");

    // Inserted in the middle, the records after it renumbered.
    let (path, conn) = fixture.copy("dup-middle.db");
    conn.execute_batch(
        "UPDATE audit_log SET seq = -(seq + 1) WHERE seq > 6;
         UPDATE audit_log SET seq = -seq WHERE seq < 0;
         INSERT INTO audit_log (seq, at_ms, kind, saga_id, body, prev_hash, hash, mac)
             SELECT 7, at_ms, kind, saga_id, body, prev_hash, hash, mac FROM audit_log WHERE seq = 6;",
    )
    .expect("duplicates");
    let (bad, reason) = first_bad(&path, None);
    assert_eq!(bad, 7, "{reason}");
}

#[tokio::test]
async fn deleting_the_newest_records_is_detected_by_the_head_file() {
    let fixture = Fixture::new(None).await;
    let (path, conn) = fixture.copy("truncated.db");
    let last = last_seq(&conn);
    conn.execute("DELETE FROM audit_log WHERE seq > ?1", params![last - 3])
        .expect("deletes");
    let (bad, reason) = first_bad(&path, None);
    assert_eq!(bad, last as u64, "{reason}");
    assert!(reason.contains("deleted at the end"), "{reason}");

    // Without its head file, the log cannot vouch for its newest records either.
    let (path, _conn) = fixture.copy("headless.db");
    fs::remove_file(audit_head_path(&path)).expect("removes");
    let (bad, reason) = first_bad(&path, None);
    assert_eq!(bad, last as u64, "{reason}");
    assert!(reason.contains("missing"), "{reason}");

    // A garbled head file is no head file.
    let (path, _conn) = fixture.copy("garbled.db");
    fs::write(audit_head_path(&path), "{\"seq\": \"ten\"}").expect("writes");
    let (_, reason) = first_bad(&path, None);
    assert!(reason.contains("not a head file"), "{reason}");
}

#[tokio::test]
async fn an_older_copy_of_the_database_is_detected_by_the_newer_head_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    let older = dir.path().join("older.db");
    let mut rng = Rng(11);
    {
        let log = open_log(&path, None, Durability::Full);
        for n in 0..3 {
            write_saga(&log, &mut rng, &format!("early{n}"), false).await;
        }
        copy_log(&path, &older);
        for n in 0..3 {
            write_saga(&log, &mut rng, &format!("late{n}"), false).await;
        }
    }
    let report = assert_intact(&path, None);
    let newest = report.head.expect("a head").seq;
    // The older database put in place, its newer head file kept.
    let swapped_dir = tempfile::tempdir().expect("temp dir");
    let swapped = swapped_dir.path().join("log.db");
    fs::copy(&older, &swapped).expect("copies");
    fs::copy(audit_head_path(&path), audit_head_path(&swapped)).expect("copies");
    let (bad, reason) = first_bad(&swapped, None);
    assert_eq!(bad, newest, "{reason}");
    assert!(reason.contains("older copy"), "{reason}");

    // Today's limit, stated: an older copy *with its own* head file verifies. The head
    // file must be protected like the database.
    assert_intact(&older, None);

    // Life goes on in the swapped log: the writer does not move a head file the chain
    // contradicts, so the evidence stays until an operator looks.
    let head_before = fs::read(audit_head_path(&swapped)).expect("reads");
    {
        let log = open_log(&swapped, None, Durability::Full);
        for n in 0..4 {
            write_saga(&log, &mut rng, &format!("after{n}"), false).await;
        }
    }
    assert_eq!(
        fs::read(audit_head_path(&swapped)).expect("reads"),
        head_before,
        "the head file was left as it was"
    );
    let (_, reason) = first_bad(&swapped, None);
    assert!(reason.contains("head file"), "{reason}");
}

#[tokio::test]
async fn a_lost_head_file_is_not_recreated_until_the_operator_seals_the_log() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    let mut rng = Rng(13);
    {
        let log = open_log(&path, Some(key()), Durability::Full);
        for n in 0..3 {
            write_saga(&log, &mut rng, &format!("before{n}"), false).await;
        }
    }
    fs::remove_file(audit_head_path(&path)).expect("removes the head file");
    // Neither opening the log nor writing to it recreates the head file: its absence is
    // what `verify` reports.
    let log = open_log(&path, Some(key()), Durability::Full);
    for n in 0..2 {
        write_saga(&log, &mut rng, &format!("during{n}"), false).await;
    }
    assert!(!audit_head_path(&path).exists());
    let (_, reason) = first_bad(&path, Some(&key()));
    assert!(reason.contains("missing"), "{reason}");
    // The chain and tables alone are consistent.
    let report = verify_ignoring_head_file(&path, Some(&key())).expect("verifies");
    assert!(report.is_intact(), "{report:#?}");

    // The operator seals: a record of it, and a head file naming it.
    let head = log
        .seal(AuditEvent::Operator(OperatorCommand {
            command: "audit seal".into(),
            saga_id: None,
            options: Vec::new(),
            by: owner(4),
            uid: Some(0),
        }))
        .await
        .expect("seals");
    let report = assert_intact(&path, Some(&key()));
    assert_eq!(report.head.as_ref(), Some(&head));
    assert_eq!(report.head_file.as_ref(), Some(&head));
    // And the writer moves it forward again.
    write_saga(&log, &mut rng, "after", false).await;
    let report = assert_intact(&path, Some(&key()));
    assert!(report.head_file.expect("a head file").seq > head.seq);
}

#[tokio::test]
async fn with_a_key_a_consistent_rewrite_of_the_whole_chain_is_detected() {
    let key = key();
    let fixture = Fixture::new(Some(key.clone())).await;
    assert_intact(&fixture.original, Some(&key));
    let (path, conn) = fixture.copy("rewritten.db");
    // The attacker turns a failed saga into a finished one everywhere: the tables, the
    // record bodies, every hash from there on, and the head file. Only the MACs cannot
    // be recomputed without the key.
    let (saga_id, seq): (String, i64) = conn
        .query_row(
            "SELECT saga_id, seq FROM audit_log WHERE kind = 'SetState'
                 AND json_extract(body, '$.state') LIKE 'Failed%' ORDER BY seq LIMIT 1",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .expect("a failed saga");
    conn.execute(
        "UPDATE audit_log SET body = json_set(body, '$.state', 'Done') WHERE seq = ?1",
        params![seq],
    )
    .expect("edits the record");
    conn.execute(
        "UPDATE sagas SET state = 'Done' WHERE saga_id = ?1",
        params![saga_id],
    )
    .expect("edits the table");
    let rows: Vec<(i64, i64, String, Option<String>, String)> = conn
        .prepare(
            "SELECT seq, at_ms, kind, saga_id, body FROM audit_log WHERE seq >= ?1 ORDER BY seq",
        )
        .expect("prepares")
        .query_map(params![seq], |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                row.get(4)?,
            ))
        })
        .expect("reads")
        .collect::<Result<_, _>>()
        .expect("reads");
    let mut prev: String = conn
        .query_row(
            "SELECT hash FROM audit_log WHERE seq = ?1",
            params![seq - 1],
            |row| row.get(0),
        )
        .expect("reads");
    for (row_seq, at_ms, kind, saga, body) in rows {
        let hash = record_hash(
            &prev,
            row_seq,
            at_ms,
            &kind,
            saga.as_deref().unwrap_or(""),
            &body,
        );
        conn.execute(
            "UPDATE audit_log SET prev_hash = ?2, hash = ?3 WHERE seq = ?1",
            params![row_seq, prev, hash],
        )
        .expect("rehashes");
        prev = hash;
    }
    // Written back in the one-line form, which readers still accept.
    let mut head = head_in_file(&path);
    head["hash"] = Value::String(prev);
    fs::write(audit_head_path(&path), head.to_string()).expect("writes");

    // Without the key, the rewrite cannot be told from the real history: the reason to
    // configure one.
    assert_intact(&path, None);
    let (bad, reason) = first_bad(&path, Some(&key));
    assert_eq!(bad, seq as u64, "{reason}");
    assert!(reason.contains("MAC"), "{reason}");

    // Removing the MACs does not help.
    conn.execute("UPDATE audit_log SET mac = NULL", [])
        .expect("strips");
    let (bad, reason) = first_bad(&path, Some(&key));
    assert_eq!(bad, 1, "{reason}");
    assert!(reason.contains("no MAC"), "{reason}");
}

#[tokio::test]
async fn a_wrong_key_fails_at_the_first_record() {
    let fixture = Fixture::new(Some(key())).await;
    let other = AuditKey::from_hex(&"a5".repeat(32)).expect("a key");
    let (bad, reason) = first_bad(&fixture.original, Some(&other));
    assert_eq!(bad, 1, "{reason}");
    assert!(reason.contains("key is wrong"), "{reason}");
    // A log written without a key cannot be verified with one.
    let unkeyed = Fixture::new(None).await;
    let (bad, reason) = first_bad(&unkeyed.original, Some(&other));
    assert_eq!(bad, 1, "{reason}");
}

#[tokio::test]
async fn verify_changes_nothing_in_the_database() {
    let fixture = Fixture::new(None).await;
    let (path, conn) = fixture.copy("readonly.db");
    drop(conn);
    let before = fs::read(&path).expect("reads");
    let head_before = fs::read(audit_head_path(&path)).expect("reads");
    assert_intact(&path, None);
    assert_eq!(fs::read(&path).expect("reads"), before);
    assert_eq!(
        fs::read(audit_head_path(&path)).expect("reads"),
        head_before
    );
    let journal_mode: String = Connection::open(&path)
        .expect("opens")
        .query_row("PRAGMA journal_mode", [], |row| row.get(0))
        .expect("reads");
    assert_eq!(
        journal_mode, "delete",
        "the journal mode of the copy is left alone"
    );
}

#[tokio::test]
async fn a_version_1_log_starts_its_chain_with_a_genesis_record() {
    let fixture = Fixture::new(None).await;
    // A log as version 1 left it: no audit_log, no head file.
    let (path, conn) = fixture.copy("v1.db");
    drop(conn);
    downgrade_in_place(&path, 1).expect("downgrades");
    let conn = Connection::open(&path).expect("opens");
    fs::remove_file(audit_head_path(&path)).expect("removes");
    let error = verify(&path, None).expect_err("no chain to verify");
    assert!(matches!(error, TxError::Storage(_)), "{error:?}");
    assert!(error.to_string().contains("no audit chain"), "{error}");

    // A version 1 log whose chain was removed but whose head file remains: tampering.
    let (stripped, stripped_conn) = fixture.copy("stripped.db");
    drop(stripped_conn);
    downgrade_in_place(&stripped, 1).expect("downgrades");
    let (_, reason) = first_bad(&stripped, None);
    assert!(reason.contains("chain was removed"), "{reason}");

    let n_sagas: i64 = conn
        .query_row("SELECT count(*) FROM sagas", [], |row| row.get(0))
        .expect("counts");
    let unfinished: String = conn
        .query_row(
            "SELECT saga_id FROM sagas WHERE state = 'Acting' ORDER BY saga_id LIMIT 1",
            [],
            |row| row.get(0),
        )
        .unwrap_or_else(|_| "none".to_owned());
    drop(conn);
    {
        let log = open_log(&path, Some(key()), Durability::Full);
        let report = assert_intact(&path, Some(&key()));
        assert_eq!(report.n_records, 1, "one genesis record");
        assert_eq!(report.head_file.expect("written at open").seq, 1);
        // Life goes on: new sagas, and the old unfinished ones recovered.
        let mut rng = Rng(5);
        write_saga(&log, &mut rng, "after", false).await;
        if unfinished != "none" {
            let saga_id = SagaId::new(&unfinished);
            log.take_over(&saga_id, &owner(1), SagaState::Acting, &owner(9))
                .await
                .expect("takes over");
            write(
                &log,
                vec![set_state(&unfinished, SagaState::FailedRolledBack)],
            )
            .await;
        }
    }
    assert_intact(&path, Some(&key()));
    let conn = Connection::open(&path).expect("opens");
    let genesis: Value = serde_json::from_str(
        &conn
            .query_row("SELECT body FROM audit_log WHERE seq = 1", [], |row| {
                row.get::<_, String>(0)
            })
            .expect("reads"),
    )
    .expect("JSON");
    assert_eq!(
        genesis["sagas"].as_object().expect("sagas").len() as i64,
        n_sagas
    );
    assert!(
        genesis["note"]
            .as_str()
            .expect("note")
            .contains("not covered")
    );

    // A step older than the chain, edited afterwards, is caught at the genesis record.
    let n_edited = conn
        .execute(
            "UPDATE saga_steps SET status = 'BEGIN'
             WHERE (saga_id, step_seq) = (SELECT saga_id, step_seq FROM saga_steps
                 WHERE saga_id <> 'after' AND status <> 'BEGIN' ORDER BY saga_id LIMIT 1)",
            [],
        )
        .expect("edits");
    assert_eq!(n_edited, 1);
    let (bad, reason) = first_bad(&path, Some(&key()));
    assert_eq!(bad, 1, "{reason}");
}

#[tokio::test]
async fn a_saga_older_than_the_chain_marked_as_a_dry_run_is_detected() {
    let fixture = Fixture::new(None).await;
    let (path, conn) = fixture.copy("v1.db");
    drop(conn);
    downgrade_in_place(&path, 1).expect("downgrades");
    let conn = Connection::open(&path).expect("opens");
    fs::remove_file(audit_head_path(&path)).expect("removes");
    drop(conn);
    drop(open_log(&path, None, Durability::Full));
    assert_intact(&path, None);
    // A dry run's steps are never compensated: marking an old saga as one would spare its
    // effects from recovery. No log before version 3 holds a dry run.
    let conn = Connection::open(&path).expect("opens");
    conn.execute(
        "UPDATE sagas SET dry_run = 1 WHERE saga_id = (SELECT min(saga_id) FROM sagas)",
        [],
    )
    .expect("edits");
    let (bad, reason) = first_bad(&path, None);
    assert_eq!(bad, 1, "{reason}");
    assert!(reason.contains("dry_run"), "{reason}");
}

#[tokio::test]
async fn hostile_rows_are_reported_without_panicking() {
    let fixture = Fixture::new(None).await;
    let edits = [
        "UPDATE audit_log SET body = 'not json' WHERE seq = 4",
        "UPDATE audit_log SET body = '[1,2]' WHERE seq = 4",
        "UPDATE audit_log SET kind = 'Nonsense' WHERE seq = 4",
        "UPDATE audit_log SET hash = 'short' WHERE seq = 4",
        "UPDATE audit_log SET mac = 'zz' WHERE seq = 4",
        "UPDATE audit_log SET saga_id = NULL WHERE seq = 4",
        "UPDATE audit_log SET seq = -4 WHERE seq = 4",
        "UPDATE audit_log SET seq = 9223372036854775807 WHERE seq = 4",
        "DELETE FROM audit_log",
        "DROP TABLE audit_log",
        "DROP TABLE saga_steps",
        "PRAGMA ignore_check_constraints = ON; UPDATE saga_steps SET status = 'BOGUS'",
        "UPDATE sagas SET owner_pid = -1",
        "UPDATE idempotency_keys SET saga_id = 'elsewhere'",
        "DELETE FROM idempotency_keys",
        "DELETE FROM saga_steps WHERE step_seq = 0",
        // A table that is no longer STRICT, holding values of any type.
        "ALTER TABLE audit_log RENAME TO old_log;
         CREATE TABLE audit_log (seq, at_ms, kind, saga_id, body, prev_hash, hash, mac);
         INSERT INTO audit_log SELECT * FROM old_log;
         UPDATE audit_log SET at_ms = x'00ff', body = 3.5 WHERE seq = 2;",
        "ALTER TABLE audit_log RENAME TO old_log;
         CREATE TABLE audit_log (seq, at_ms, kind, saga_id, body, prev_hash, hash, mac);
         INSERT INTO audit_log SELECT * FROM old_log;
         INSERT INTO audit_log SELECT * FROM old_log WHERE seq = 3;",
    ];
    for (edit_idx, edit) in edits.iter().enumerate() {
        let (path, conn) = fixture.copy(&format!("hostile-{edit_idx}.db"));
        // Foreign keys are off on this connection, as an attacker would have them.
        conn.execute_batch(edit).expect("tampers");
        drop(conn);
        let report = verify(&path, Some(&key())).expect("verifies");
        assert!(!report.is_intact(), "{edit}: {report:#?}");
        let report = verify(&path, None).expect("verifies");
        assert!(!report.is_intact(), "{edit}: {report:#?}");
        eprintln!("{edit}: {:?}", report.first_bad);
    }
}

#[test]
fn verify_refuses_what_is_not_a_log() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("missing.db");
    let error = verify(&missing, None).expect_err("refused");
    assert!(error.to_string().contains("no log"), "{error}");
    assert!(!missing.exists(), "verify creates nothing");
    let text = dir.path().join("notes.db");
    fs::write(&text, "my notes").expect("writes");
    assert!(matches!(verify(&text, None), Err(TxError::NotALog { .. })));
    let other = dir.path().join("other.db");
    Connection::open(&other)
        .expect("opens")
        .execute_batch("CREATE TABLE t (x)")
        .expect("creates");
    assert!(matches!(verify(&other, None), Err(TxError::NotALog { .. })));
}

#[tokio::test]
async fn a_version_2_log_migrates_to_dry_runs_with_its_chain_intact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v2.db");
    {
        let log = open_log(&path, None, Durability::Normal);
        let mut rng = Rng(11);
        for saga in ["a", "b"] {
            let first = step(&mut rng, saga, 0, None);
            write(&log, vec![create(saga, 1), LogWrite::BeginStep(first)]).await;
            write(
                &log,
                vec![commit(&mut rng, saga, 0), set_state(saga, SagaState::Done)],
            )
            .await;
        }
    }
    // As version 2 left it: no `dry_run` column.
    downgrade_in_place(&path, 2).expect("downgrades");
    let report = assert_intact(&path, None);
    assert_eq!(report.n_records, 8);

    let log = open_log(&path, None, Durability::Normal);
    let version: i64 = Connection::open(&path)
        .expect("opens")
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .expect("reads");
    assert_eq!(version, agent_kernel_txlog::SCHEMA_VERSION);
    assert_intact(&path, None);
    let mut rng = Rng(12);
    let batch = dry_run(&mut rng, "dry", 3);
    write(&log, batch).await;
    let record = log
        .saga(&SagaId::new("dry"))
        .await
        .expect("reads")
        .expect("recorded");
    assert!(record.saga.dry_run);
    assert!(
        !log.saga(&SagaId::new("a"))
            .await
            .expect("reads")
            .expect("there")
            .saga
            .dry_run
    );
    let report = assert_intact(&path, None);
    assert!(report.n_records > 8);
}

#[tokio::test]
async fn dry_runs_hold_only_simulated_steps_and_claim_no_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("dry.db");
    let log = open_log(&path, None, Durability::Normal);
    let mut rng = Rng(21);

    // A simulated step in a saga that is not a dry run is refused, and nothing is written.
    let simulated = step(&mut rng, "live", 0, None);
    let error = log
        .write(vec![
            create("live", 1),
            LogWrite::SimulateStep {
                step: simulated,
                result: Ok(ToolOutput::new(json!({}))),
            },
        ])
        .await
        .expect_err("refused");
    assert!(error.to_string().contains("not a dry run"), "{error}");
    assert!(
        log.saga(&SagaId::new("live"))
            .await
            .expect("reads")
            .is_none()
    );

    // A begun step in a dry run is refused too.
    let mut batch = dry_run(&mut rng, "dry", 1);
    batch.truncate(1);
    batch.push(LogWrite::BeginStep(step(&mut rng, "dry", 0, None)));
    let error = log.write(batch).await.expect_err("refused");
    assert!(error.to_string().contains("is a dry run"), "{error}");

    // A dry run's keyed step leaves the key free.
    let mut keyed = step(&mut rng, "dry2", 0, Some("order-1".into()));
    keyed.args_hash = "h".repeat(64);
    write(
        &log,
        vec![
            LogWrite::CreateSaga(NewSaga {
                saga_id: SagaId::new("dry2"),
                name: None,
                actor: None,
                owner: owner(1),
                n_steps: 1,
                state: SagaState::Acting,
                dry_run: true,
                require_actor_idle: false,
            }),
            LogWrite::SimulateStep {
                step: keyed,
                result: Ok(ToolOutput::new(json!({"dry_run": true}))),
            },
            set_state("dry2", SagaState::Done),
        ],
    )
    .await;
    assert!(log.key_binding("order-1").await.expect("reads").is_none());
    let sagas = log.sagas(10).await.expect("lists");
    assert!(
        sagas
            .iter()
            .any(|saga| saga.saga_id.as_str() == "dry2" && saga.dry_run)
    );
    let report = assert_intact(&path, None);
    assert_eq!(report.n_records, 3);

    // Marking the dry run as a live saga in the table (so that recovery would compensate its
    // simulated steps) is detected at the record that last changed the row.
    let conn = Connection::open(&path).expect("opens");
    conn.execute("UPDATE sagas SET dry_run = 0 WHERE saga_id = 'dry2'", [])
        .expect("edits");
    let (bad, reason) = first_bad(&path, None);
    assert_eq!(bad, 3, "{reason}");
    assert!(reason.contains("dry_run"), "{reason}");
}

#[tokio::test]
async fn operator_commands_and_denied_plans_are_chained_and_move_the_head() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("events.db");
    let log = open_log(&path, Some(key()), Durability::Normal);
    let mut rng = Rng(31);
    for n in 0..6 {
        let event = audit_event(&mut rng, n);
        write(&log, vec![event]).await;
        // Each event is covered by the head file at once.
        let report = assert_intact(&path, Some(&key()));
        assert_eq!(report.head_file.expect("written").seq, n + 1);
    }
    let conn = Connection::open(&path).expect("opens");
    let kinds: Vec<String> = conn
        .prepare("SELECT kind FROM audit_log ORDER BY seq")
        .expect("prepares")
        .query_map([], |row| row.get(0))
        .expect("queries")
        .collect::<Result<_, _>>()
        .expect("reads");
    assert!(
        kinds
            .iter()
            .all(|kind| kind == "Operator" || kind == "PlanDenied"),
        "{kinds:?}"
    );
    let denied: Option<String> = conn
        .query_row(
            "SELECT body FROM audit_log WHERE kind = 'PlanDenied' LIMIT 1",
            [],
            |row| row.get(0),
        )
        .ok();
    if let Some(body) = denied {
        let body: Value = serde_json::from_str(&body).expect("json");
        assert_eq!(body["n_denials"], 2);
        assert_eq!(body["denials"][0]["tool"], "fs.write");
        assert!(
            body["denials"][0]["args_summary"]
                .as_str()
                .expect("quoted")
                .contains("/etc/passwd")
        );
        assert!(
            body["denials"][0]["reason"]
                .as_str()
                .expect("quoted")
                .contains("outside every allowed root")
        );
    }

    // Deleting the newest event is detected by the head file.
    conn.execute(
        "DELETE FROM audit_log WHERE seq = (SELECT max(seq) FROM audit_log)",
        [],
    )
    .expect("deletes");
    let (bad, reason) = first_bad(&path, Some(&key()));
    assert_eq!(bad, 6, "{reason}");
}

/// Prunes every saga the log calls prunable at `before_ms`, page by page; their count.
async fn prune_all(log: &SqliteLog, before_ms: i64) -> u64 {
    let mut n_pruned = 0;
    loop {
        let page = log
            .prune_candidates(before_ms, None, 50)
            .await
            .expect("lists");
        if page.is_empty() {
            return n_pruned;
        }
        for record in &page {
            assert!(record.saga.state.is_terminal(), "{:?}", record.saga);
            assert!(record.saga.updated_at_ms < before_ms);
        }
        let saga_ids = page
            .iter()
            .map(|record| record.saga.saga_id.clone())
            .collect();
        let outcomes = write(
            log,
            vec![LogWrite::Prune(agent_kernel_api::PruneSagas {
                saga_ids,
                before_ms,
            })],
        )
        .await;
        match outcomes.as_slice() {
            [WriteOutcome::Pruned { n_sagas, .. }] => {
                assert_eq!(*n_sagas, page.len() as u64);
                n_pruned += n_sagas;
            }
            other => panic!("a prune answered {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_pruned_log_verifies_keeps_its_open_sagas_and_goes_on() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    build_log(&path, 7, 40, Some(key())).await;
    let conn = Connection::open(&path).expect("opens");
    let unfinished: Vec<String> = conn
        .prepare(
            "SELECT saga_id FROM sagas WHERE state NOT IN ('Done', 'FailedRolledBack', 'Undone')
                 ORDER BY saga_id",
        )
        .expect("prepares")
        .query_map([], |row| row.get(0))
        .expect("reads")
        .collect::<Result<_, _>>()
        .expect("reads");
    // Open sagas, and those an operator must still see to (`FailedRollbackPartial`).
    assert!(!unfinished.is_empty(), "the seed leaves some saga open");
    let log = open_log(&path, Some(key()), Durability::Full);
    let n_pruned = prune_all(&log, i64::MAX).await;
    assert!(n_pruned > 20, "{n_pruned}");
    drop(log);
    assert_intact(&path, Some(&key()));
    // Only those are left, with their steps; no row of a pruned saga survives.
    let left: Vec<String> = conn
        .prepare("SELECT saga_id FROM sagas ORDER BY saga_id")
        .expect("prepares")
        .query_map([], |row| row.get(0))
        .expect("reads")
        .collect::<Result<_, _>>()
        .expect("reads");
    assert_eq!(left, unfinished);
    for table in ["saga_steps", "idempotency_keys"] {
        let orphans: i64 = conn
            .query_row(
                &format!(
                    "SELECT count(*) FROM {table} WHERE saga_id NOT IN (SELECT saga_id FROM sagas)"
                ),
                [],
                |row| row.get(0),
            )
            .expect("counts");
        assert_eq!(orphans, 0, "{table}");
    }
    // The chain keeps every record and one checkpoint per page.
    let checkpoints: i64 = conn
        .query_row(
            "SELECT count(*) FROM audit_log WHERE kind = 'Prune'",
            [],
            |row| row.get(0),
        )
        .expect("counts");
    assert!(checkpoints >= 1);
    // Writing goes on, and a second prune of the new sagas verifies too.
    build_log(&path, 8, 10, Some(key())).await;
    let log = open_log(&path, Some(key()), Durability::Full);
    assert!(prune_all(&log, i64::MAX).await > 0);
    // Nothing left to prune: a prune naming an open saga removes nothing, records nothing.
    let before = last_seq(&conn);
    let outcomes = write(
        &log,
        vec![LogWrite::Prune(agent_kernel_api::PruneSagas {
            saga_ids: vec![SagaId::new(&unfinished[0])],
            before_ms: i64::MAX,
        })],
    )
    .await;
    assert_eq!(
        outcomes,
        [WriteOutcome::Pruned {
            n_sagas: 0,
            n_steps: 0
        }]
    );
    assert_eq!(last_seq(&conn), before);
    drop(log);
    assert_intact(&path, Some(&key()));
}

/// Appends a record to the chain as someone without the key would, hashes and all.
fn forge_record(conn: &Connection, kind: &str, body: &str) -> i64 {
    let (seq, prev, at_ms): (i64, String, i64) = conn
        .query_row(
            "SELECT seq, hash, at_ms FROM audit_log ORDER BY seq DESC LIMIT 1",
            [],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .expect("reads the head");
    let (seq, at_ms) = (seq + 1, at_ms + 1);
    let hash = record_hash(&prev, seq, at_ms, kind, "", body);
    conn.execute(
        "INSERT INTO audit_log (seq, at_ms, kind, saga_id, body, prev_hash, hash, mac)
         VALUES (?1, ?2, ?3, NULL, ?4, ?5, ?6, NULL)",
        params![seq, at_ms, kind, body, prev, hash],
    )
    .expect("forges");
    seq
}

/// Deletes a saga's rows from the tables, as someone holding the file would.
fn delete_saga_rows(conn: &Connection, saga_id: &str) {
    for table in ["idempotency_keys", "saga_steps", "sagas"] {
        conn.execute(
            &format!("DELETE FROM {table} WHERE saga_id = ?1"),
            params![saga_id],
        )
        .expect("deletes");
    }
}

/// Appends a `Prune` checkpoint naming `saga_id` with `n_steps` and a hash of zeros, as a
/// forger without the records would; its sequence number.
fn forge_prune(conn: &Connection, saga_id: &str, n_steps: i64) -> i64 {
    let body = format!(
        r#"{{"before_ms":9000000000000,"n_steps":{n_steps},"records_sha256":"{}","saga_ids":["{saga_id}"]}}"#,
        "0".repeat(64)
    );
    forge_record(conn, "Prune", &body)
}

#[tokio::test]
async fn a_forged_prune_checkpoint_is_detected() {
    let fixture = Fixture::new(None).await;
    // It hides an unfinished saga: the rows go, a checkpoint claims them pruned.
    let (path, conn) = fixture.copy("open-pruned.db");
    let open: String = conn
        .query_row(
            "SELECT saga_id FROM sagas WHERE state = 'Acting' LIMIT 1",
            [],
            |row| row.get(0),
        )
        .expect("an unfinished saga");
    delete_saga_rows(&conn, &open);
    let seq = forge_prune(&conn, &open, 0);
    let (bad, reason) = first_bad(&path, None);
    assert_eq!(bad, seq as u64, "{reason}");
    assert!(reason.contains("not finished"), "{reason}");

    // A finished saga, but the checkpoint's hash is not that of its records.
    let (path, conn) = fixture.copy("wrong-hash.db");
    let (done, n_steps): (String, i64) = conn
        .query_row(
            "SELECT saga_id, (SELECT count(*) FROM saga_steps t WHERE t.saga_id = s.saga_id)
             FROM sagas s WHERE state = 'Done' LIMIT 1",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .expect("a finished saga");
    delete_saga_rows(&conn, &done);
    let seq = forge_prune(&conn, &done, n_steps);
    let (bad, reason) = first_bad(&path, None);
    assert_eq!(bad, seq as u64, "{reason}");
    assert!(reason.contains("records_sha256"), "{reason}");

    // Rows removed with no checkpoint at all: the chain still names them.
    let (path, conn) = fixture.copy("silently-pruned.db");
    delete_saga_rows(&conn, &done);
    let report = verify(&path, None).expect("verifies");
    assert!(!report.is_intact(), "{report:#?}");
}

#[tokio::test]
async fn a_saga_id_created_again_after_a_prune_is_pruned_again_and_verifies() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    let log = open_log(&path, Some(key()), Durability::Normal);
    let mut rng = Rng(11);
    for round in 0..3 {
        // The same id each round, as a business-keyed id source would give.
        write(
            &log,
            vec![
                create("order-42", 1),
                LogWrite::BeginStep(step(&mut rng, "order-42", 0, None)),
            ],
        )
        .await;
        write(
            &log,
            vec![
                commit(&mut rng, "order-42", 0),
                set_state("order-42", SagaState::Done),
            ],
        )
        .await;
        assert_eq!(prune_all(&log, i64::MAX).await, 1, "round {round}");
    }
    drop(log);
    assert_intact(&path, Some(&key()));
}

#[tokio::test]
async fn a_saga_whose_compensation_failed_is_never_pruned() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    let log = open_log(&path, Some(key()), Durability::Normal);
    let mut rng = Rng(12);
    // As a log migrated from version 4 holds it: FailedRollbackPartial with no dead letter.
    write(
        &log,
        vec![
            create("partial", 1),
            LogWrite::BeginStep(step(&mut rng, "partial", 0, None)),
        ],
    )
    .await;
    write(
        &log,
        vec![
            compensation("partial", 0, false),
            set_state("partial", SagaState::FailedRollbackPartial),
        ],
    )
    .await;
    assert!(
        log.prune_candidates(i64::MAX, None, 10)
            .await
            .expect("lists")
            .is_empty()
    );
    let outcomes = write(
        &log,
        vec![LogWrite::Prune(agent_kernel_api::PruneSagas {
            saga_ids: vec![SagaId::new("partial")],
            before_ms: i64::MAX,
        })],
    )
    .await;
    assert_eq!(
        outcomes,
        [WriteOutcome::Pruned {
            n_sagas: 0,
            n_steps: 0
        }]
    );
    assert!(
        log.saga(&SagaId::new("partial"))
            .await
            .expect("reads")
            .is_some()
    );
    drop(log);
    assert_intact(&path, Some(&key()));
}
