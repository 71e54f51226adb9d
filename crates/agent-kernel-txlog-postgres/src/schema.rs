//! Opening a database as a log: refusing one that is not, creating the schema in one that
//! is empty, refusing a newer schema or one with triggers or rules on the log's tables.

use agent_kernel_api::TxError;
use postgres::Client;

/// What `agent_kernel_meta.application` holds in every log.
pub(crate) const APPLICATION: &str = "agent-kernel log";

/// The schema version this build creates and reads.
pub const SCHEMA_VERSION: i64 = 6;

/// The schema, version 1.
const SCHEMA_SQL: &str = include_str!("schema.sql");

/// What version 2 adds to version 1: isolation's tables.
const SCHEMA_V2_SQL: &str = include_str!("schema_v2.sql");

/// What version 3 changes in version 2: a begun step's resources kept in its row.
const SCHEMA_V3_SQL: &str = include_str!("schema_v3.sql");

/// What version 4 adds to version 3: the log's identity.
const SCHEMA_V4_SQL: &str = include_str!("schema_v4.sql");

/// What version 5 adds to version 4: the locks held, as a view.
const SCHEMA_V5_SQL: &str = include_str!("schema_v5.sql");

/// Version 6: no table changes; writers take their own log's lock ([`write_lock`]).
const SCHEMA_V6_SQL: &str = include_str!("schema_v6.sql");

/// The first schema version with a log identity (`agent_kernel_meta.log_id`).
const LOG_ID_VERSION: i64 = 4;

/// The upgrades, in order: `UPGRADES[n]` takes the schema from version `n + 1` to `n + 2`.
const UPGRADES: [&str; SCHEMA_VERSION as usize - 1] = [
    SCHEMA_V2_SQL,
    SCHEMA_V3_SQL,
    SCHEMA_V4_SQL,
    SCHEMA_V5_SQL,
    SCHEMA_V6_SQL,
];

/// The tables of the schema: no trigger or rule may sit on them.
const TABLES: [&str; 10] = [
    "agent_kernel_meta",
    "sagas",
    "saga_steps",
    "idempotency_keys",
    "audit_log",
    "approvals",
    "dead_letters",
    "leases",
    "step_keys",
    "locks",
];

/// The advisory lock the first opens of a database serialize on, so that two processes
/// never both create the schema ("AKLG", 1).
const SCHEMA_LOCK: i64 = 0x414B_4C47_0000_0001;

/// The advisory lock every write transaction of the log `log_id` names takes first, so
/// that its writers in every process apply their batches one at a time and its audit chain
/// never forks: "AKLG" in the high 32 bits, a hash (FNV-1a) of the log's identity in the
/// low ones. Logs in other schemas of the same database take other locks, so that a writer
/// stalled in one log never holds up another's (two identities that hash alike only share
/// a lock). `pg_locks` shows who holds it: `locktype = 'advisory'`, `classid` and `objid`
/// its two halves. Until schema version 6 every log of a database took one lock,
/// [`WRITE_LOCK_BEFORE_V6`]. Every build that writes one log must derive the same key: the
/// formula is part of the schema version.
pub fn write_lock(log_id: &str) -> i64 {
    let hash = log_id.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    });
    (0x414B_4C47_i64 << 32) | i64::from(hash)
}

/// The one write lock of every log of a database before schema version 6 ("AKLG", 2). A
/// writer takes it shared with its own log's lock, so that a process of an older build that
/// opened the log before it was migrated (and takes this lock alone, exclusive) still waits
/// for every writer of this build, and they for it; writers of this build never wait for
/// one another on it.
pub const WRITE_LOCK_BEFORE_V6: i64 = 0x414B_4C47_0000_0002;

/// How a write transaction takes its log's write lock ([`write_lock_sql`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Taking {
    /// Waits for it.
    Wait,
    /// Tries it first: the statement's second column says whether it was free. When it was
    /// taken, waits for it, and the transaction commits before the server's flush
    /// (`synchronous_commit` off for it alone).
    TryThenWait,
}

/// The statement every write transaction of the log `log_id` names begins with: its
/// [`write_lock`] (waited for, or tried: [`Taking`]), [`WRITE_LOCK_BEFORE_V6`] shared, both
/// only if `agent_kernel_meta` still names the log as `log_id` (written into the statement
/// as a constant, so that it travels with others in one simple query): no row, and nothing
/// taken, when the identity was edited or another schema came ahead in the `search_path`
/// since the connection was made, whose writers would take another lock. With
/// `commit_before_flush`, the transaction's COMMIT will not wait for the server's WAL to be
/// flushed (`synchronous_commit` off for this transaction alone), so that it lets go of the
/// lock first: the writer then waits for the flush itself
/// ([`lease::flush`](crate::lease::flush)) before it answers anyone.
pub(crate) fn write_lock_sql(log_id: &str, taking: Taking, commit_before_flush: bool) -> String {
    let mut identity = String::new();
    crate::held::text_literal(log_id, &mut identity);
    const BEFORE_FLUSH: &str = "set_config('synchronous_commit', 'off', true)";
    let key = write_lock(log_id);
    // Only the branch a CASE reaches is evaluated: the wait, and what comes with it, only
    // when the try found the lock taken.
    let lock = match taking {
        Taking::Wait => format!("pg_advisory_xact_lock({key})"),
        Taking::TryThenWait => format!(
            "CASE WHEN pg_try_advisory_xact_lock({key}) THEN true \
             ELSE (SELECT false FROM (SELECT pg_advisory_xact_lock({key}), {BEFORE_FLUSH}) \
                   AS waited) END"
        ),
    };
    let commit = if commit_before_flush {
        format!(", {BEFORE_FLUSH}")
    } else {
        String::new()
    };
    format!(
        "SELECT pg_advisory_xact_lock_shared({WRITE_LOCK_BEFORE_V6}), {lock}{commit} \
         FROM agent_kernel_meta WHERE singleton = 1 AND log_id = {identity}"
    )
}

/// A database error as [`TxError::Storage`], saying what the server said.
pub(crate) fn storage(err: postgres::Error) -> TxError {
    TxError::Storage(crate::db::describe_error(&err))
}

/// Checks the database `target` names (its schema, `current_schema()`) and creates the
/// log's tables when it holds none (upgrading an older log's); the log's identity.
pub(crate) fn prepare(client: &mut Client, target: &str) -> Result<String, TxError> {
    let mut tx = client.transaction().map_err(storage)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])
        .map_err(storage)?;
    let schema: Option<String> = tx
        .query_one("SELECT current_schema()::text", &[])
        .map_err(storage)?
        .get(0);
    let Some(schema) = schema else {
        return Err(TxError::Storage(format!(
            "{target} has no current schema (its search_path names none that exists)"
        )));
    };
    let version = if let Some(version) = read_meta(&mut tx, &schema, target)? {
        if version < SCHEMA_VERSION {
            // An older log: upgraded in this transaction.
            let from = usize::try_from(version - 1).expect("a version of at least 1");
            for upgrade in &UPGRADES[from..] {
                tx.batch_execute(upgrade).map_err(storage)?;
            }
            tx.execute(
                "UPDATE agent_kernel_meta SET schema_version = $1 WHERE singleton = 1",
                &[&SCHEMA_VERSION],
            )
            .map_err(storage)?;
        }
        SCHEMA_VERSION
    } else {
        let n_relations = relations(&mut tx, &schema)?;
        if n_relations > 0 {
            return Err(TxError::NotALog {
                path: target.to_owned(),
                reason: format!(
                    "its schema `{schema}` holds {n_relations} tables or views of something else"
                ),
            });
        }
        tx.batch_execute(SCHEMA_SQL).map_err(storage)?;
        for upgrade in UPGRADES {
            tx.batch_execute(upgrade).map_err(storage)?;
        }
        tx.execute(
            "INSERT INTO agent_kernel_meta (singleton, application, schema_version, log_id)
             VALUES (1, $1, $2, gen_random_uuid()::text)",
            &[&APPLICATION, &SCHEMA_VERSION],
        )
        .map_err(storage)?;
        SCHEMA_VERSION
    };
    if let Some(reason) = tampering(&mut tx, &schema, version)? {
        return Err(TxError::Tampered {
            path: target.to_owned(),
            reason,
        });
    }
    let log_id = log_id(&mut tx, target)?.ok_or_else(|| TxError::Tampered {
        path: target.to_owned(),
        reason: "agent_kernel_meta names no log id".to_owned(),
    })?;
    tx.commit().map_err(storage)?;
    Ok(log_id)
}

/// The log's identity, `None` before schema version 4; call once the schema is known to
/// hold a log of at least that version.
fn log_id(tx: &mut postgres::Transaction<'_>, target: &str) -> Result<Option<String>, TxError> {
    let row = tx
        .query_one(
            "SELECT log_id FROM agent_kernel_meta WHERE singleton = 1",
            &[],
        )
        .map_err(storage)?;
    let log_id: Option<String> = row.get(0);
    match log_id {
        Some(id) if !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') => {
            Ok(Some(id))
        }
        Some(id) => Err(TxError::Tampered {
            path: target.to_owned(),
            reason: format!("agent_kernel_meta names the log id {id:?}, which no build makes"),
        }),
        None => Ok(None),
    }
}

/// The log's schema version, when the schema `schema` holds a log: `None` when it holds no
/// `agent_kernel_meta` table; an error when that table names another application or a
/// version this build cannot read.
fn read_meta(
    tx: &mut postgres::Transaction<'_>,
    schema: &str,
    target: &str,
) -> Result<Option<i64>, TxError> {
    let has_meta: bool = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables
                 WHERE schemaname = $1 AND tablename = 'agent_kernel_meta')",
            &[&schema],
        )
        .map_err(storage)?
        .get(0);
    if !has_meta {
        return Ok(None);
    }
    {
        let row = tx
            .query_opt(
                "SELECT application, schema_version FROM agent_kernel_meta WHERE singleton = 1",
                &[],
            )
            .map_err(storage)?;
        let Some(row) = row else {
            return Err(TxError::NotALog {
                path: target.to_owned(),
                reason: "its agent_kernel_meta table is empty".to_owned(),
            });
        };
        let application: String = row.get(0);
        let version: i64 = row.get(1);
        if application != APPLICATION {
            return Err(TxError::NotALog {
                path: target.to_owned(),
                reason: format!("agent_kernel_meta names the application `{application}`"),
            });
        }
        if version > SCHEMA_VERSION {
            return Err(TxError::SchemaTooNew {
                path: target.to_owned(),
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        if version < 1 {
            return Err(TxError::Tampered {
                path: target.to_owned(),
                reason: format!("agent_kernel_meta holds schema version {version}"),
            });
        }
        Ok(Some(version))
    }
}

/// A trigger or a rule on one of the log's tables, or one of them missing: what the
/// schema was given that this build never creates, first found.
fn tampering(
    tx: &mut postgres::Transaction<'_>,
    schema: &str,
    version: i64,
) -> Result<Option<String>, TxError> {
    // Version 1 has all but isolation's two tables.
    let n_tables = if version >= 2 {
        TABLES.len()
    } else {
        TABLES.len() - 2
    };
    let tables: Vec<String> = TABLES[..n_tables]
        .iter()
        .map(|&table| table.to_owned())
        .collect();
    let present: Vec<String> = tx
        .query(
            "SELECT tablename::text FROM pg_catalog.pg_tables
             WHERE schemaname = $1 AND tablename = ANY($2)",
            &[&schema, &tables],
        )
        .map_err(storage)?
        .iter()
        .map(|row| row.get(0))
        .collect();
    if let Some(missing) = TABLES[..n_tables]
        .iter()
        .find(|&&table| !present.iter().any(|p| p == table))
    {
        return Ok(Some(format!("the table `{missing}` is missing")));
    }
    let trigger = tx
        .query_opt(
            "SELECT t.tgname::text, c.relname::text FROM pg_catalog.pg_trigger t
             JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relname = ANY($2) AND NOT t.tgisinternal
             LIMIT 1",
            &[&schema, &tables],
        )
        .map_err(storage)?;
    if let Some(row) = trigger {
        let (name, table): (String, String) = (row.get(0), row.get(1));
        return Ok(Some(format!(
            "the trigger `{name}` sits on the table `{table}`"
        )));
    }
    let rule = tx
        .query_opt(
            "SELECT rulename::text, tablename::text FROM pg_catalog.pg_rules
             WHERE schemaname = $1 AND tablename = ANY($2) LIMIT 1",
            &[&schema, &tables],
        )
        .map_err(storage)?;
    if let Some(row) = rule {
        let (name, table): (String, String) = (row.get(0), row.get(1));
        return Ok(Some(format!(
            "the rule `{name}` sits on the table `{table}`"
        )));
    }
    Ok(None)
}

/// For verification, without writing: whether the schema is empty, holds a log, or holds
/// one with something this build never creates; a schema of something else is `NotALog`,
/// and a log [`read_meta`] refuses is refused.
pub(crate) fn inspect(
    tx: &mut postgres::Transaction<'_>,
    target: &str,
) -> Result<Inspected, TxError> {
    let schema: Option<String> = tx
        .query_one("SELECT current_schema()::text", &[])
        .map_err(storage)?
        .get(0);
    let Some(schema) = schema else {
        return Err(TxError::Storage(format!(
            "{target} has no current schema (its search_path names none that exists)"
        )));
    };
    let Some(version) = read_meta(tx, &schema, target)? else {
        let n_relations = relations(tx, &schema)?;
        if n_relations == 0 {
            // No log yet: nothing was recorded, so nothing can have been tampered with.
            return Ok(Inspected::Empty);
        }
        return Err(TxError::NotALog {
            path: target.to_owned(),
            reason: format!(
                "its schema `{schema}` holds {n_relations} tables or views of something else"
            ),
        });
    };
    if let Some(reason) = tampering(tx, &schema, version)? {
        return Ok(Inspected::Tampered(reason));
    }
    let log_id = if version >= LOG_ID_VERSION {
        log_id(tx, target)?
    } else {
        None
    };
    Ok(Inspected::Log { log_id })
}

/// What [`inspect`] found.
pub(crate) enum Inspected {
    /// An empty schema: no log was ever created there.
    Empty,
    /// A log, as this build creates it, with its identity (`None` before schema version
    /// 4, until a writer upgrades it).
    Log { log_id: Option<String> },
    /// A log with something this build never creates (why).
    Tampered(String),
}

/// How many tables and views the schema `schema` holds.
fn relations(tx: &mut postgres::Transaction<'_>, schema: &str) -> Result<i64, TxError> {
    Ok(tx
        .query_one(
            "SELECT count(*) FROM pg_catalog.pg_class c
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
            &[&schema],
        )
        .map_err(storage)?
        .get(0))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_logs_write_lock_is_fixed_by_its_identity() {
        // The formula is an agreement between every build that writes a log of version 6.
        assert_eq!(
            super::write_lock("00000000-0000-4000-8000-000000000000"),
            0x414B_4C47_D070_3F35
        );
        assert_ne!(super::write_lock("a"), super::write_lock("b"));
    }

    #[test]
    fn a_write_lock_tried_says_whether_it_was_free_and_a_commit_before_the_flush_is_its_transactions_alone()
     {
        use super::{Taking, write_lock, write_lock_sql};
        use agent_kernel_log_contract::postgres::{Schema, blocking, server};
        let Some(server) = server() else { return };
        let schema = Schema::create(&server);
        schema.execute(
            "CREATE TABLE agent_kernel_meta (singleton INTEGER PRIMARY KEY, log_id TEXT NOT NULL);
             INSERT INTO agent_kernel_meta VALUES (1, 'the-log')",
        );
        let url = schema.url();
        blocking(|| {
            let connect = || postgres::Client::connect(&url, postgres::NoTls).expect("connects");
            let (mut holder, mut writer) = (connect(), connect());
            fn sync(client: &mut impl postgres::GenericClient) -> String {
                client
                    .query_one("SHOW synchronous_commit", &[])
                    .expect("shows")
                    .get(0)
            }
            assert_eq!(sync(&mut writer), "on");
            let mut held = holder.transaction().expect("begins");
            held.execute(&write_lock_sql("the-log", Taking::Wait, false), &[])
                .expect("locks");
            // Tried while another session holds it: waited for, committing before the flush.
            let mut tx = writer.transaction().expect("begins");
            let (mut tx, free) = std::thread::scope(|scope| {
                let waiting = scope.spawn(move || {
                    let row = tx
                        .query_one(&write_lock_sql("the-log", Taking::TryThenWait, false), &[])
                        .expect("tries, waits, then locks");
                    (tx, row.get::<_, bool>(1))
                });
                // Let go of it once the writer waits for it.
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
                let key = write_lock("the-log");
                while held
                    .query_one(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
                             AND classid::bigint = $1 AND objid::bigint = $2",
                        &[&(key >> 32), &(key & 0xFFFF_FFFF)],
                    )
                    .expect("reads")
                    .get::<_, i64>(0)
                    == 0
                {
                    assert!(std::time::Instant::now() < deadline, "never waited");
                    std::thread::yield_now();
                }
                held.commit().expect("lets go");
                waiting.join().expect("locked")
            });
            assert!(!free, "found taken by the other session");
            assert_eq!(sync(&mut tx), "off", "set for the transaction by the wait");
            let key = write_lock("the-log");
            let granted: i64 = tx
                .query_one(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
                         AND pid = pg_backend_pid() AND classid::bigint = $1
                         AND objid::bigint = $2",
                    &[&(key >> 32), &(key & 0xFFFF_FFFF)],
                )
                .expect("reads")
                .get(0);
            assert_eq!(granted, 1);
            tx.commit().expect("commits");
            assert_eq!(sync(&mut writer), "on", "the session's own again");
            // Tried while free: taken at once, committing through the flush…
            let mut tx = writer.transaction().expect("begins");
            let tried = tx
                .query_one(&write_lock_sql("the-log", Taking::TryThenWait, false), &[])
                .expect("tries");
            assert!(tried.get::<_, bool>(1), "free");
            assert_eq!(sync(&mut tx), "on");
            tx.commit().expect("commits");
            // …or before it, lately contended.
            let mut tx = writer.transaction().expect("begins");
            let tried = tx
                .query_one(&write_lock_sql("the-log", Taking::TryThenWait, true), &[])
                .expect("tries");
            assert!(tried.get::<_, bool>(1), "free");
            assert_eq!(sync(&mut tx), "off");
            tx.commit().expect("commits");
            // Another log's identity: nothing taken.
            let mut tx = writer.transaction().expect("begins");
            let rows = tx
                .query(&write_lock_sql("another", Taking::TryThenWait, true), &[])
                .expect("tries");
            assert!(rows.is_empty());
            assert_eq!(sync(&mut tx), "on");
        });
    }
}
