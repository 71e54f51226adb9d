//! Live export (reference §12): with `OTEL_EXPORTER_OTLP_ENDPOINT` set, the spans of this
//! process's sagas go to an OTLP/HTTP collector as the sagas progress.
//!
//! The exporter never touches a step: it runs on its own thread and tails the log's audit
//! chain through a read-only connection ([`ChainReader`]), every `OTEL_BSP_SCHEDULE_DELAY`.
//! The records it reads are durable already; it builds the same spans as
//! [`saga_spans`](crate::saga_spans) from them and sends each span once, when it has ended:
//! a step's when its outcome is recorded, a compensation's when it is, the saga's root when
//! the saga reaches a final state. Spans wait in a queue bounded by
//! `OTEL_BSP_MAX_QUEUE_SIZE`; what does not fit, and every batch the collector refuses or
//! does not answer in time, is dropped and counted, and a warning says so.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use agent_kernel_api::{Owner, SagaId};
use agent_kernel_txlog::{AuditRecord, ChainReader};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

use crate::{SagaHistory, export_request, saga_spans};

/// Records read from the chain in one query.
pub const TAIL_RECORDS_MAX: u32 = 4_096;

/// Sagas followed at once; the records of more are not exported (and counted as dropped).
pub const TRACKED_SAGAS_MAX: usize = 4_096;

/// The longest the exporter waits for the collector when the process ends.
pub const FLUSH_AT_EXIT_MAX: Duration = Duration::from_secs(2);

/// How spans are encoded on the wire (`OTEL_EXPORTER_OTLP_PROTOCOL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `http/json`: OTLP/JSON (the default here).
    HttpJson,
    /// `http/protobuf`: the protobuf encoding.
    HttpProtobuf,
}

/// Where and how spans are sent, from the standard `OTEL_*` variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveConfig {
    /// The traces URL: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` followed by `/v1/traces`.
    pub url: String,
    /// `OTEL_EXPORTER_OTLP_PROTOCOL` (`http/json`, the default, or `http/protobuf`).
    pub protocol: Protocol,
    /// `OTEL_EXPORTER_OTLP_HEADERS` (`key=value,…`), sent with every request.
    pub headers: Vec<(String, String)>,
    /// `OTEL_EXPORTER_OTLP_TIMEOUT` (ms, default 10,000): the longest one request may take.
    pub timeout: Duration,
    /// `OTEL_BSP_SCHEDULE_DELAY` (ms, default 5,000): how often the chain is read and
    /// spans are sent.
    pub schedule_delay: Duration,
    /// `OTEL_BSP_MAX_QUEUE_SIZE` (default 2,048): spans waiting to be sent.
    pub max_queue: usize,
    /// `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` (default 512): spans in one request.
    pub max_batch: usize,
}

impl LiveConfig {
    /// The configuration the variables of `env` describe (`std::env::var` in a program);
    /// `Ok(None)` when no endpoint is set or `OTEL_SDK_DISABLED` is `true`.
    ///
    /// # Errors
    ///
    /// An [`std::io::ErrorKind::InvalidInput`] error whose message names the variable whose
    /// value is malformed.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> std::io::Result<Option<LiveConfig>> {
        Self::from_env_text(env)
            .map_err(|message| std::io::Error::new(std::io::ErrorKind::InvalidInput, message))
    }

    fn from_env_text(env: impl Fn(&str) -> Option<String>) -> Result<Option<LiveConfig>, String> {
        if env("OTEL_SDK_DISABLED").is_some_and(|value| value.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let nonempty = |name: &str| env(name).filter(|value| !value.trim().is_empty());
        let url = match (
            nonempty("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            nonempty("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ) {
            (Some(url), _) => url.trim().to_owned(),
            (None, Some(base)) => format!("{}/v1/traces", base.trim().trim_end_matches('/')),
            (None, None) => return Ok(None),
        };
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "the OTLP endpoint `{url}` is not an http:// or https:// URL"
            ));
        }
        let protocol = match nonempty("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| nonempty("OTEL_EXPORTER_OTLP_PROTOCOL"))
            .as_deref()
            .map(str::trim)
        {
            None | Some("http/json") => Protocol::HttpJson,
            Some("http/protobuf") => Protocol::HttpProtobuf,
            Some(other) => {
                return Err(format!(
                    "OTEL_EXPORTER_OTLP_PROTOCOL `{other}` is not supported (http/json or http/protobuf)"
                ));
            }
        };
        let mut headers = Vec::new();
        if let Some(text) = nonempty("OTEL_EXPORTER_OTLP_HEADERS") {
            for pair in text.split(',').filter(|pair| !pair.trim().is_empty()) {
                let Some((key, value)) = pair.split_once('=') else {
                    return Err(format!(
                        "OTEL_EXPORTER_OTLP_HEADERS: `{pair}` is not key=value"
                    ));
                };
                headers.push((key.trim().to_owned(), value.trim().to_owned()));
            }
        }
        let number = |name: &str, default: u64| -> Result<u64, String> {
            nonempty(name).map_or(Ok(default), |text| {
                text.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("{name} `{text}` is not a positive whole number"))
            })
        };
        let size = |name: &str, default: u64| -> Result<usize, String> {
            number(name, default).map(|n| usize::try_from(n).unwrap_or(usize::MAX))
        };
        let max_queue = size("OTEL_BSP_MAX_QUEUE_SIZE", 2_048)?;
        Ok(Some(LiveConfig {
            url,
            protocol,
            headers,
            timeout: Duration::from_millis(
                number("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", 0)
                    .ok()
                    .filter(|n| *n > 0)
                    .map_or_else(|| number("OTEL_EXPORTER_OTLP_TIMEOUT", 10_000), Ok)?,
            ),
            schedule_delay: Duration::from_millis(number("OTEL_BSP_SCHEDULE_DELAY", 5_000)?),
            max_queue,
            max_batch: size("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)?.min(max_queue),
        }))
    }
}

/// What the exporter did, counted as it goes.
#[derive(Debug, Default)]
pub struct LiveCounts {
    /// Spans the collector accepted.
    pub exported: AtomicU64,
    /// Spans dropped: the queue was full, the collector refused or did not answer, or more
    /// sagas were open than [`TRACKED_SAGAS_MAX`].
    pub dropped: AtomicU64,
}

/// A running live exporter; [`LiveExporter::shutdown`] (or dropping it) sends what is
/// left, waiting at most [`FLUSH_AT_EXIT_MAX`].
#[derive(Debug)]
pub struct LiveExporter {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    counts: Arc<LiveCounts>,
}

impl LiveExporter {
    /// Starts exporting the sagas `owner` creates in the log at `db` from now on.
    ///
    /// # Errors
    ///
    /// An I/O error when the log cannot be opened for reading (its message the log's), or
    /// the thread cannot be started.
    pub fn start(db: PathBuf, owner: Owner, config: LiveConfig) -> std::io::Result<LiveExporter> {
        let reader = ChainReader::open(&db).map_err(std::io::Error::other)?;
        let after = reader.last_seq().map_err(std::io::Error::other)?;
        let counts = Arc::new(LiveCounts::default());
        let (stop, stopped) = mpsc::channel();
        let tail_counts = Arc::clone(&counts);
        let thread = std::thread::Builder::new()
            .name("otlp-export".to_owned())
            .spawn(move || {
                // Built (and dropped) on this thread: a blocking client must never be
                // made or dropped on an async runtime's thread.
                let client = match reqwest::blocking::Client::builder()
                    .timeout(config.timeout)
                    .build()
                {
                    Ok(client) => client,
                    Err(error) => {
                        tracing::warn!(%error, "OTLP export: cannot build the HTTP client; no span will be sent");
                        return;
                    }
                };
                let mut tail = Tail {
                    reader,
                    owner,
                    after,
                    tracked: BTreeMap::new(),
                    queue: VecDeque::new(),
                    client,
                    config,
                    counts: tail_counts,
                    warned_at: None,
                };
                tail.run(&stopped);
            })
            .map_err(|error| {
                std::io::Error::new(
                    error.kind(),
                    format!("cannot start the OTLP exporter: {error}"),
                )
            })?;
        Ok(LiveExporter {
            stop: Some(stop),
            thread: Some(thread),
            counts,
        })
    }

    /// The counts so far.
    pub fn counts(&self) -> &LiveCounts {
        &self.counts
    }

    /// Reads the chain a last time, sends what is left (within [`FLUSH_AT_EXIT_MAX`]) and
    /// stops; returns (exported, dropped).
    pub fn shutdown(mut self) -> (u64, u64) {
        self.stop_and_join();
        (
            self.counts.exported.load(Ordering::Relaxed),
            self.counts.dropped.load(Ordering::Relaxed),
        )
    }

    fn stop_and_join(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for LiveExporter {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// One saga being followed.
#[derive(Default)]
struct Tracked {
    chain: Vec<AuditRecord>,
    sent: BTreeSet<Vec<u8>>,
    dirty: bool,
}

/// The exporter thread's state.
struct Tail {
    reader: ChainReader,
    owner: Owner,
    after: i64,
    tracked: BTreeMap<String, Tracked>,
    queue: VecDeque<Span>,
    client: reqwest::blocking::Client,
    config: LiveConfig,
    counts: Arc<LiveCounts>,
    warned_at: Option<Instant>,
}

impl Tail {
    fn run(&mut self, stopped: &mpsc::Receiver<()>) {
        loop {
            let last = matches!(
                stopped.recv_timeout(self.config.schedule_delay),
                Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected)
            );
            self.read_chain();
            let deadline = last.then(|| Instant::now() + FLUSH_AT_EXIT_MAX);
            self.send(deadline);
            if last {
                let left = self.queue.len();
                self.drop_spans(left, "the process ended before the collector took them");
                return;
            }
        }
    }

    /// Reads the new records, follows the sagas this process created, and queues the
    /// spans that ended.
    fn read_chain(&mut self) {
        loop {
            let records = match self.reader.records_after(self.after, TAIL_RECORDS_MAX) {
                Ok(records) => records,
                Err(error) => {
                    self.warn(&format!("cannot read the log: {error}"));
                    return;
                }
            };
            let n = records.len();
            for record in records {
                self.after = record.seq;
                self.follow(record);
            }
            if n < TAIL_RECORDS_MAX as usize {
                break;
            }
        }
        let dirty: Vec<String> = self
            .tracked
            .iter()
            .filter(|(_, saga)| saga.dirty)
            .map(|(id, _)| id.clone())
            .collect();
        for saga_id in dirty {
            self.queue_ended_spans(&saga_id);
        }
    }

    fn follow(&mut self, record: AuditRecord) {
        let Some(saga_id) = record.saga_id.clone() else {
            return;
        };
        if record.kind == "CreateSaga" && is_owner(&record, &self.owner) {
            if self.tracked.len() >= TRACKED_SAGAS_MAX {
                self.drop_spans(1, "too many sagas are open at once");
                return;
            }
            self.tracked.entry(saga_id.clone()).or_default();
        }
        if let Some(saga) = self.tracked.get_mut(&saga_id) {
            saga.chain.push(record);
            saga.dirty = true;
        }
    }

    fn queue_ended_spans(&mut self, saga_id: &str) {
        let record = match self.reader.saga(&SagaId::new(saga_id.to_owned())) {
            Ok(Some(record)) => record,
            Ok(None) => {
                self.tracked.remove(saga_id);
                return;
            }
            Err(error) => {
                self.warn(&format!("cannot read saga {saga_id}: {error}"));
                return;
            }
        };
        let Some(saga) = self.tracked.get_mut(saga_id) else {
            return;
        };
        saga.dirty = false;
        let spans = saga_spans(SagaHistory {
            record: &record,
            chain: &saga.chain,
        });
        let finished = record.saga.state.is_terminal();
        let mut dropped = 0;
        // `saga_spans` gives the root, then one span per step in order, then compensations.
        for (i, span) in spans.into_iter().enumerate() {
            let ended = match i.checked_sub(1) {
                None => finished,
                Some(n) => record
                    .steps
                    .get(n)
                    .is_none_or(|step| step.status != agent_kernel_api::StepStatus::Begin),
            };
            if !ended || saga.sent.contains(&span.span_id) {
                continue;
            }
            saga.sent.insert(span.span_id.clone());
            if self.queue.len() < self.config.max_queue {
                self.queue.push_back(span);
            } else {
                dropped += 1;
            }
        }
        if finished {
            // Its spans are all sent; an undo later is another process's business.
            self.tracked.remove(saga_id);
        }
        if dropped > 0 {
            self.drop_spans(dropped, "the export queue is full");
        }
    }

    /// Sends the queue in batches; before `deadline` when the process ends.
    fn send(&mut self, deadline: Option<Instant>) {
        while !self.queue.is_empty() {
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                return;
            }
            let n = self.queue.len().min(self.config.max_batch);
            let batch: Vec<Span> = self.queue.drain(..n).collect();
            let mut request = export_request(&[]);
            request.resource_spans[0].scope_spans[0].spans = batch;
            match self.post(&request, deadline) {
                Ok(()) => {
                    self.counts.exported.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(error) => {
                    self.drop_spans(n, &error);
                }
            }
        }
    }

    fn post(
        &self,
        request: &ExportTraceServiceRequest,
        deadline: Option<Instant>,
    ) -> Result<(), String> {
        let (content_type, body) = match self.config.protocol {
            Protocol::HttpJson => (
                "application/json",
                serde_json::to_vec(request).map_err(|error| error.to_string())?,
            ),
            Protocol::HttpProtobuf => ("application/x-protobuf", request.encode_to_vec()),
        };
        let mut builder = self
            .client
            .post(&self.config.url)
            .header("content-type", content_type)
            .body(body);
        for (key, value) in &self.config.headers {
            builder = builder.header(key.as_str(), value.as_str());
        }
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            builder = builder.timeout(left.min(self.config.timeout));
        }
        let response = builder.send().map_err(|error| {
            format!(
                "the collector at {} did not take them: {error}",
                self.config.url
            )
        })?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(format!(
                "the collector at {} answered {}",
                self.config.url,
                response.status()
            ))
        }
    }

    fn drop_spans(&mut self, n: usize, why: &str) {
        if n == 0 {
            return;
        }
        let total = self.counts.dropped.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
        self.warn(&format!("dropped {n} spans ({total} so far): {why}"));
    }

    /// Logs a warning, at most once per schedule delay.
    fn warn(&mut self, message: &str) {
        let now = Instant::now();
        if self
            .warned_at
            .is_some_and(|at| now.duration_since(at) < self.config.schedule_delay)
        {
            return;
        }
        self.warned_at = Some(now);
        tracing::warn!(target: "agent_kernel::otlp", "OTLP export: {message}");
    }
}

/// Whether a `CreateSaga` record names `owner` as the saga's owner.
fn is_owner(record: &AuditRecord, owner: &Owner) -> bool {
    let body = &record.body["owner"];
    body["host"].as_str() == Some(owner.host.as_str())
        && body["boot_id"].as_str() == Some(owner.boot_id.as_str())
        && body["pid"].as_u64() == Some(u64::from(owner.pid))
        && body["start_ticks"].as_u64() == Some(owner.start_ticks)
}
