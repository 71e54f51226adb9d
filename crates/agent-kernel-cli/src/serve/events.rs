//! `GET /events`: one server-sent event per change the console sees in the log (a saga
//! created or changing state, a request asked or decided, a dead letter opened, failing
//! again or settled, the counts by state), found by one watcher that compares snapshots of
//! the log's small, indexed sets, whatever process made the change.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use agent_kernel::Kernel;
use agent_kernel::operator::ApprovalView;
use agent_kernel_api::{Clock as _, SagaId, SagaQuery, SagaState};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};

/// How often the watcher looks at the log.
pub(crate) const EVENTS_POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Every how many looks the counts by state (a scan of the sagas) are compared too, and
/// only while someone listens: they catch what the other sets cannot (an `undo` of a
/// settled saga from another process, a prune).
const COUNTS_EVERY_POLLS: u32 = 8;

/// How many of the newest sagas each look compares (besides every unfinished one): a saga
/// created and settled between two looks is seen there.
const NEWEST_SAGAS: u32 = 20;

/// How many events a slow listener may fall behind before it is told to reload.
const EVENTS_BACKLOG: usize = 256;

/// What one look at the log found.
#[derive(Debug, Default, PartialEq)]
struct Snapshot {
    /// The newest sagas and every unfinished one, with their states.
    sagas: HashMap<SagaId, SagaState>,
    /// Of those, the unfinished.
    unfinished: Vec<SagaId>,
    /// Pending requests: id → saga.
    approvals: HashMap<String, SagaId>,
    /// Open dead letters: id → (saga, attempts).
    letters: HashMap<String, (SagaId, u32)>,
    /// Sagas by state, when looked at.
    counts: Option<Vec<(SagaState, u64)>>,
}

/// The stream of change events, shared by every listener.
#[derive(Debug, Clone)]
pub(crate) struct Events {
    sender: broadcast::Sender<String>,
    /// Turns `true` when the console stops: every stream then ends, so that the server's
    /// graceful shutdown does not wait for browsers that would listen forever.
    stopping: watch::Receiver<bool>,
}

impl Events {
    /// Looks at `kernel`'s log once, then starts the watcher on this runtime: every change
    /// after this returns is seen.
    ///
    /// # Errors
    ///
    /// When the log cannot be read.
    pub(crate) async fn start(
        kernel: Arc<Kernel>,
        stopping: watch::Receiver<bool>,
    ) -> Result<Self, agent_kernel::KernelError> {
        let (sender, _) = broadcast::channel(EVENTS_BACKLOG);
        let events = Self { sender, stopping };
        let first = snapshot(&kernel, false).await?;
        let watcher = events.clone();
        tokio::spawn(async move { watcher.watch(&kernel, first).await });
        Ok(events)
    }

    /// Sends `event` to every listener now (an action of this console, before the
    /// watcher's next look).
    pub(crate) fn send(&self, event: Value) {
        let _ = self.sender.send(event.to_string());
    }

    async fn watch(&self, kernel: &Kernel, first: Snapshot) {
        let mut last = Some(first);
        let mut polls: u32 = 0;
        loop {
            tokio::time::sleep(EVENTS_POLL_INTERVAL).await;
            polls = polls.wrapping_add(1);
            let with_counts =
                self.sender.receiver_count() > 0 && polls.is_multiple_of(COUNTS_EVERY_POLLS);
            let now = match snapshot(kernel, with_counts).await {
                Ok(now) => now,
                Err(error) => {
                    tracing::warn!(%error, "the console cannot read the log for its live updates");
                    continue;
                }
            };
            if let Some(before) = &last {
                for event in changes(kernel, before, &now).await {
                    let _ = self.sender.send(event.to_string());
                }
            }
            let counts = now.counts.clone().or_else(|| last.take()?.counts);
            last = Some(Snapshot { counts, ..now });
        }
    }

    /// `text/event-stream`: each change as one `message` event whose data is a JSON
    /// object with a `type` (`saga`, `approval`, `dead_letter`, `counts`, or `lagged` when
    /// this listener fell behind and should reload).
    pub(crate) fn stream(&self) -> Sse<impl Stream<Item = Result<Event, Infallible>> + use<>> {
        let receiver = self.sender.subscribe();
        let stopping = self.stopping.clone();
        let stream = futures_util::stream::unfold(
            (receiver, stopping),
            |(mut receiver, mut stopping)| async move {
                if *stopping.borrow() {
                    return None;
                }
                let received = tokio::select! {
                    received = receiver.recv() => received,
                    _ = stopping.changed() => return None,
                };
                let data = match received {
                    Ok(data) => data,
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        json!({"type": "lagged", "missed": missed}).to_string()
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                };
                Some((Ok(Event::default().data(data)), (receiver, stopping)))
            },
        );
        Sse::new(stream).keep_alive(KeepAlive::default())
    }
}

async fn snapshot(
    kernel: &Kernel,
    with_counts: bool,
) -> Result<Snapshot, agent_kernel::KernelError> {
    let log = kernel.log();
    let mut snapshot = Snapshot::default();
    let newest = log
        .saga_page(&SagaQuery {
            limit: NEWEST_SAGAS,
            ..SagaQuery::default()
        })
        .await?;
    for listing in newest {
        snapshot
            .sagas
            .insert(listing.saga.saga_id, listing.saga.state);
    }
    for saga in log.unfinished_sagas().await? {
        snapshot.unfinished.push(saga.saga_id.clone());
        snapshot.sagas.insert(saga.saga_id, saga.state);
    }
    for record in log.pending_approvals().await? {
        snapshot
            .approvals
            .insert(record.request.approval_id, record.request.saga_id);
    }
    for letter in log.open_dead_letters(None).await? {
        snapshot
            .letters
            .insert(letter.letter_id, (letter.saga_id, letter.attempts));
    }
    if with_counts {
        snapshot.counts = Some(log.saga_counts().await?);
    }
    Ok(snapshot)
}

/// The events between two looks. What left a set is read once more for where it went.
async fn changes(kernel: &Kernel, before: &Snapshot, now: &Snapshot) -> Vec<Value> {
    let log = kernel.log();
    let mut events = Vec::new();
    let saga = |saga_id: &SagaId, state: SagaState| json!({"type": "saga", "saga_id": saga_id, "state": state});
    for (saga_id, state) in &now.sagas {
        if before.sagas.get(saga_id) != Some(state) {
            events.push(saga(saga_id, *state));
        }
    }
    for saga_id in &before.unfinished {
        if now.sagas.contains_key(saga_id) {
            continue;
        }
        // Settled, and older than the newest few.
        if let Ok(Some(record)) = log.saga(saga_id).await {
            events.push(saga(saga_id, record.saga.state));
        }
    }
    for (approval_id, saga_id) in &now.approvals {
        if !before.approvals.contains_key(approval_id) {
            events.push(json!({"type": "approval", "id": approval_id, "saga_id": saga_id, "status": "pending"}));
        }
    }
    for (approval_id, saga_id) in &before.approvals {
        if now.approvals.contains_key(approval_id) {
            continue;
        }
        let status = match log.approval(approval_id).await {
            Ok(Some(record)) => {
                json!(ApprovalView::of(record, agent_kernel::SystemClock.now_ms()).status)
            }
            _ => Value::Null,
        };
        events.push(
            json!({"type": "approval", "id": approval_id, "saga_id": saga_id, "status": status}),
        );
    }
    for (letter_id, (saga_id, attempts)) in &now.letters {
        if before.letters.get(letter_id).map(|(_, n)| n) != Some(attempts) {
            events.push(json!({"type": "dead_letter", "id": letter_id, "saga_id": saga_id, "status": "open", "attempts": attempts}));
        }
    }
    for (letter_id, (saga_id, _)) in &before.letters {
        if now.letters.contains_key(letter_id) {
            continue;
        }
        let status = match log.dead_letter(letter_id).await {
            Ok(Some(letter)) => json!(letter.status),
            _ => Value::Null,
        };
        events.push(
            json!({"type": "dead_letter", "id": letter_id, "saga_id": saga_id, "status": status}),
        );
    }
    if let (Some(was), Some(counts)) = (&before.counts, &now.counts)
        && was != counts
    {
        let counts: serde_json::Map<String, Value> = counts
            .iter()
            .map(|(state, n)| (state.as_str().to_owned(), json!(n)))
            .collect();
        events.push(json!({"type": "counts", "counts": counts}));
    }
    events
}
