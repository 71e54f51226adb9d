//! The tables as the chain describes them: one model per row kind, kept by [`Replay`].

#[allow(clippy::wildcard_imports)]
use super::*;

/// A process that owns a saga, as the `sagas` table stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct OwnerModel {
    pub(super) host: String,
    pub(super) boot_id: String,
    pub(super) pid: i64,
    /// Stored as the `i64` with the same bits as the `u64`.
    pub(super) start_ticks: i64,
}

/// What the chain says a saga row holds. `None` fields are not known: the saga predates
/// the chain (it came from a `Genesis` record) and no record has set them since.
/// Its steps are [`Replay::steps`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct SagaModel {
    /// The record that last changed the row.
    pub(super) last_seq: i64,
    pub(super) state: SagaState,
    pub(super) owner: Option<OwnerModel>,
    pub(super) n_steps: Option<i64>,
    pub(super) dry_run: Option<bool>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "known"
    )]
    pub(super) name: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "known"
    )]
    pub(super) actor: Option<Option<String>>,
    pub(super) created_at_ms: Option<i64>,
    pub(super) updated_at_ms: Option<i64>,
    /// How many of its steps the chain has begun.
    pub(super) n_known_steps: i64,
    /// The running hash of its records, which a `Prune` checkpoint carries.
    pub(super) records: SagaRecords,
}

impl Entry for SagaModel {}

/// Reads a column the chain knows (`Some`, its value or `None` for NULL) in the scratch
/// database's encoding: a known column is written as its value or `null`, an unknown one is
/// left out (`#[serde(default, skip_serializing_if = "Option::is_none")]`), so that the two
/// never read back as each other.
pub(super) fn known<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

/// What a step was begun with; unknown for steps that predate the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct StepContent {
    pub(super) tool_id: String,
    pub(super) tool_version: String,
    pub(super) effect: String,
    pub(super) idempotency_key: Option<String>,
    pub(super) args_hash: String,
    pub(super) args_sha256: String,
    pub(super) undo_sha256: String,
    pub(super) undo_blob_sha256: Option<String>,
    pub(super) reused_from: Option<(String, i64)>,
    /// The resources it declared, sorted (empty when none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) resources: Vec<String>,
}

/// What the chain says a step row holds (`None`: not known, as for [`SagaModel`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct StepModel {
    pub(super) last_seq: i64,
    pub(super) status: StepStatus,
    pub(super) content: Option<StepContent>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "known"
    )]
    pub(super) output_sha256: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "known"
    )]
    pub(super) error_sha256: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "known"
    )]
    pub(super) compensation_sha256: Option<Option<String>>,
    pub(super) created_at_ms: Option<i64>,
    pub(super) updated_at_ms: Option<i64>,
}

/// Keyed by `(saga_id, step_seq)`.
impl Entry for StepModel {}

/// What the chain says an idempotency key is bound to.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct KeyModel {
    pub(super) last_seq: i64,
    pub(super) args_hash: String,
    pub(super) saga_id: String,
    pub(super) step_seq: i64,
}

impl Entry for KeyModel {
    fn group<'a>(&'a self, _: &'a Key) -> &'a str {
        &self.saga_id
    }
}

/// What the chain says an approval request row holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct ApprovalModel {
    pub(super) last_seq: i64,
    pub(super) saga_id: String,
    pub(super) step_seq: i64,
    pub(super) tool_id: String,
    pub(super) args_sha256: String,
    pub(super) idempotency_key: Option<String>,
    pub(super) digest: String,
    pub(super) rest_sha256: Option<String>,
    pub(super) status: String,
    pub(super) requested_at_ms: i64,
    pub(super) expires_at_ms: i64,
    pub(super) decided_at_ms: Option<i64>,
    /// Quoted as the record quotes it.
    pub(super) decided_by: Option<String>,
    pub(super) note_sha256: Option<String>,
    /// The record of the decision.
    pub(super) decision_seq: Option<i64>,
    pub(super) operator_key_check: Option<String>,
}

impl Entry for ApprovalModel {
    fn group<'a>(&'a self, _: &'a Key) -> &'a str {
        &self.saga_id
    }

    fn open(&self) -> bool {
        self.status == ApprovalStatus::Pending.as_str()
            || self.status == ApprovalStatus::Approved.as_str()
    }
}

/// What the chain says a dead letter row holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct DeadLetterModel {
    pub(super) last_seq: i64,
    pub(super) saga_id: String,
    pub(super) step_seq: i64,
    pub(super) tool_id: String,
    pub(super) error_sha256: String,
    pub(super) attempts: i64,
    pub(super) first_failed_at_ms: i64,
    pub(super) last_failed_at_ms: i64,
    pub(super) next_retry_at_ms: i64,
    pub(super) status: String,
    pub(super) settled_at_ms: Option<i64>,
    /// Quoted as the record quotes it.
    pub(super) settled_by: Option<String>,
    pub(super) note_sha256: Option<String>,
}

impl Entry for DeadLetterModel {
    fn group<'a>(&'a self, _: &'a Key) -> &'a str {
        &self.saga_id
    }

    fn open(&self) -> bool {
        self.status == DeadLetterStatus::Open.as_str()
    }
}

/// The tables as the chain describes them, built record by record: each map keeps at most
/// a bound of entries in memory, the rest in one scratch database on disk.
pub(super) struct Replay {
    pub(super) scratch: Scratch,
    /// Keyed by `(saga_id, 0)`.
    pub(super) sagas: Spill<SagaModel>,
    /// Keyed by `(saga_id, step_seq)`.
    pub(super) steps: Spill<StepModel>,
    /// Keyed by `(key, 0)`.
    pub(super) keys: Spill<KeyModel>,
    /// Keyed by `(approval_id, 0)`.
    pub(super) approvals: Spill<ApprovalModel>,
    /// Keyed by `(letter_id, 0)`.
    pub(super) dead_letters: Spill<DeadLetterModel>,
}

/// A key of a map keyed by one id.
pub(super) fn id_key(id: &str) -> Key {
    (id.to_owned(), 0)
}

/// Typed access to a record body, with messages naming the missing field.
pub(super) struct Body<'a>(pub(super) &'a Map<String, Value>);

impl<'a> Body<'a> {
    pub(super) fn field(&self, name: &str) -> Result<&'a Value, String> {
        self.0
            .get(name)
            .ok_or_else(|| format!("its body lacks `{name}`"))
    }

    pub(super) fn str(&self, name: &str) -> Result<&'a str, String> {
        self.field(name)?
            .as_str()
            .ok_or_else(|| format!("its body's `{name}` is not text"))
    }

    pub(super) fn opt_str(&self, name: &str) -> Result<Option<String>, String> {
        match self.field(name)? {
            Value::Null => Ok(None),
            Value::String(text) => Ok(Some(text.clone())),
            _ => Err(format!("its body's `{name}` is neither text nor null")),
        }
    }

    pub(super) fn int(&self, name: &str) -> Result<i64, String> {
        self.field(name)?
            .as_i64()
            .ok_or_else(|| format!("its body's `{name}` is not an integer"))
    }

    /// A flag written only when true: absent means false.
    pub(super) fn flag(&self, name: &str) -> Result<bool, String> {
        match self.0.get(name) {
            None => Ok(false),
            Some(Value::Bool(true)) => Ok(true),
            Some(_) => Err(format!("its body's `{name}` is present but not `true`")),
        }
    }

    /// An array of text written only when not empty, sorted: absent means empty.
    pub(super) fn sorted_strs(&self, name: &str) -> Result<Vec<String>, String> {
        let Some(value) = self.0.get(name) else {
            return Ok(Vec::new());
        };
        let mut items = value
            .as_array()
            .and_then(|items| {
                items
                    .iter()
                    .map(|item| item.as_str().map(str::to_owned))
                    .collect::<Option<Vec<String>>>()
            })
            .ok_or_else(|| format!("its body's `{name}` is not an array of text"))?;
        items.sort_unstable();
        Ok(items)
    }

    pub(super) fn object(&self, name: &str) -> Result<Body<'a>, String> {
        self.field(name)?
            .as_object()
            .map(Body)
            .ok_or_else(|| format!("its body's `{name}` is not an object"))
    }

    /// The text field `name`, parsed as a `T` (a state, a status).
    pub(super) fn parsed<T>(&self, name: &str) -> Result<T, String>
    where
        T: std::str::FromStr,
        T::Err: std::fmt::Display,
    {
        self.str(name)?
            .parse()
            .map_err(|err| format!("its body's `{name}`: {err}"))
    }

    pub(super) fn state(&self, name: &str) -> Result<SagaState, String> {
        self.parsed(name)
    }

    pub(super) fn status(&self, name: &str) -> Result<StepStatus, String> {
        self.parsed(name)
    }

    pub(super) fn owner(&self, name: &str) -> Result<OwnerModel, String> {
        let owner = self.object(name)?;
        let start_ticks = owner
            .field("start_ticks")?
            .as_u64()
            .ok_or_else(|| format!("its body's `{name}.start_ticks` is not an integer"))?;
        Ok(OwnerModel {
            host: owner.str("host")?.to_owned(),
            boot_id: owner.str("boot_id")?.to_owned(),
            pid: owner.int("pid")?,
            // The same conversion the store makes.
            start_ticks: start_ticks as i64,
        })
    }
}
