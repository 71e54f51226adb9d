//! Sagas as a list shows them: one saga without its steps, and a page of the list.

use serde::{Deserialize, Serialize};

use crate::{Owner, SagaId, SagaState};

/// One saga, without its steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SagaSummary {
    /// The saga's id.
    pub saga_id: SagaId,
    /// The plan's label.
    pub name: Option<String>,
    /// Who ran it.
    pub actor: Option<String>,
    /// Where it stands.
    pub state: SagaState,
    /// The process that owns it.
    pub owner: Owner,
    /// How many steps the plan has.
    pub n_steps: u32,
    /// Whether it is a dry run (see [`NewSaga::dry_run`](crate::NewSaga::dry_run)).
    #[serde(default)]
    pub dry_run: bool,
    /// When it was created, in ms since the Unix epoch.
    pub created_at_ms: i64,
    /// When it last changed, in ms since the Unix epoch.
    pub updated_at_ms: i64,
}

/// Which sagas a page of the saga list holds ([`TxLog::saga_page`](crate::TxLog::saga_page)): every filter given must
/// hold; newest first, after `before` when given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SagaQuery {
    /// Only sagas in this state.
    pub state: Option<SagaState>,
    /// Only sagas of this actor.
    pub actor: Option<String>,
    /// Only sagas with a step of this tool.
    pub tool: Option<String>,
    /// Only sagas of this name (the plan's label).
    pub name: Option<String>,
    /// Only sagas created at or after this time, in ms since the Unix epoch.
    pub created_from_ms: Option<i64>,
    /// Only sagas created before this time, in ms since the Unix epoch.
    pub created_until_ms: Option<i64>,
    /// Only sagas with a step whose arguments (their JSON) contain this text, letters A to Z
    /// matched in either case.
    pub text: Option<String>,
    /// Only sagas older than this one (its `created_at_ms` and id): the previous page's last.
    pub before: Option<(i64, SagaId)>,
    /// At most this many.
    pub limit: u32,
}

/// One saga of a page of the saga list.
#[derive(Debug, Clone, PartialEq)]
pub struct SagaListing {
    /// The saga.
    pub saga: SagaSummary,
    /// How many of its steps began.
    pub n_begun: u32,
}
