//! agent-kernel's sagas as OpenTelemetry traces (reference §12).
//!
//! [`export_request`] turns sagas, as the log holds them (the [`SagaRecord`] and the saga's
//! records in the audit chain, oldest first), into an OTLP `ExportTraceServiceRequest`
//! built from the `opentelemetry-proto` types, so its JSON form (`serde_json`) is OTLP/JSON
//! by construction:
//!
//! - one resource (`service.name = "agent-kernel"`) and one instrumentation scope;
//! - one trace per saga, its id the saga's UUID (16 bytes);
//! - a root span for the saga (`saga NAME`), from its creation to its last record;
//! - a child span per step, `execute_tool TOOL`, with the OpenTelemetry GenAI attributes
//!   for tool execution (`gen_ai.operation.name = "execute_tool"`, `gen_ai.tool.name`,
//!   `gen_ai.tool.call.id`, `error.type` when it failed) and `agent_kernel.*` attributes:
//!   the step's status, the tool's version and effect class, the arguments' SHA-256, the
//!   idempotency key, the outcome of a failure (`not_applied` or `uncertain`), the step a
//!   reused output came from; approvals of the step are events on it;
//! - a child span per compensation, `compensate TOOL`, linked to its step's span;
//! - every other record of the saga (its changes of state, operator commands, take-overs,
//!   dead letters) an event on the root span.
//!
//! Times are the audit records' (milliseconds), made monotone within a saga. Span ids are
//! derived from the saga id and what the span stands for, so an export is deterministic: the
//! same log gives the same JSON. Nothing here reads the log or the clock, except
//! [`LiveExporter`], which follows a log from its own thread and sends the same spans to an
//! OTLP/HTTP collector as they end.

use std::collections::BTreeMap;

mod live;

pub use live::{
    FLUSH_AT_EXIT_MAX, LiveConfig, LiveCounts, LiveExporter, Protocol, TAIL_RECORDS_MAX,
    TRACKED_SAGAS_MAX,
};

use agent_kernel_api::{SagaRecord, SagaState, StepRecord, StepStatus};
use agent_kernel_txlog::AuditRecord;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    ResourceSpans, ScopeSpans, Span, Status, span, status,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The `service.name` of every export.
pub const SERVICE_NAME: &str = "agent-kernel";

/// The most events one span carries; more are counted in `dropped_events_count`.
pub const EVENTS_PER_SPAN_MAX: usize = 128;

/// The most attributes an event takes from its audit record's body; more are counted in
/// `dropped_attributes_count`.
pub const EVENT_ATTRIBUTES_MAX: usize = 16;

/// The most bytes of a string attribute taken from a record (longer ones are cut at a
/// character boundary and end with `…`).
pub const ATTRIBUTE_BYTES_MAX: usize = 512;

/// One saga to export: its record and its records in the audit chain, oldest first.
#[derive(Debug, Clone, Copy)]
pub struct SagaHistory<'a> {
    /// The saga and its steps.
    pub record: &'a SagaRecord,
    /// The saga's audit records, in chain order.
    pub chain: &'a [AuditRecord],
}

/// The OTLP request holding one trace per saga of `sagas`.
pub fn export_request(sagas: &[SagaHistory<'_>]) -> ExportTraceServiceRequest {
    let spans = sagas.iter().flat_map(|saga| saga_spans(*saga)).collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    string("service.name", SERVICE_NAME),
                    string("service.version", env!("CARGO_PKG_VERSION")),
                ],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: SERVICE_NAME.to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    ..Default::default()
                }),
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// The trace id of a saga: its UUID's 16 bytes, or for an id that is not a UUID, the first
/// 16 bytes of its SHA-256. Never all zeros (which OTLP reserves for "no trace").
pub fn trace_id(saga_id: &str) -> [u8; 16] {
    let hex: String = saga_id.chars().filter(|c| *c != '-').collect();
    let mut id = [0_u8; 16];
    let parsed = hex.len() == 32
        && id.iter_mut().enumerate().all(|(i, byte)| {
            u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
                .map(|value| *byte = value)
                .is_ok()
        });
    if !parsed {
        id.copy_from_slice(&Sha256::digest(saga_id.as_bytes())[..16]);
    }
    if id == [0; 16] {
        id[15] = 1;
    }
    id
}

/// What a span stands for, which with the saga id makes its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanOf {
    /// The saga's root span.
    Saga,
    /// The span of step `n`.
    Step(u32),
    /// The span of the `k`-th compensation of step `n` (`(n, k)`; a compensation retried
    /// from a dead letter is another one).
    Compensation(u32, u32),
}

/// The span id of `what` in saga `saga_id`: the first 8 bytes of a SHA-256 over both,
/// never all zeros.
pub fn span_id(saga_id: &str, what: SpanOf) -> [u8; 8] {
    let label = match what {
        SpanOf::Saga => "saga".to_owned(),
        SpanOf::Step(n) => format!("step:{n}"),
        SpanOf::Compensation(n, k) => format!("compensation:{n}:{k}"),
    };
    let digest = Sha256::digest(format!("{saga_id}\n{label}").as_bytes());
    let mut id = [0_u8; 8];
    id.copy_from_slice(&digest[..8]);
    if id == [0; 8] {
        id[7] = 1;
    }
    id
}

/// A step's span while the chain is read.
#[derive(Default)]
struct StepTimes {
    start: Option<u64>,
    end: Option<u64>,
    events: Vec<span::Event>,
    dropped_events: u32,
}

/// A compensation's span while the chain is read.
struct CompensationTimes {
    step_seq: u32,
    start: u64,
    end: u64,
    body: Value,
}

/// The spans of one saga: its root, then one per step of `saga.record.steps`, in that
/// order, then its compensations in the order they ran.
pub fn saga_spans(saga: SagaHistory<'_>) -> Vec<Span> {
    let summary = &saga.record.saga;
    let saga_id = summary.saga_id.as_str();
    let trace = trace_id(saga_id).to_vec();
    let root_id = span_id(saga_id, SpanOf::Saga).to_vec();

    let first = saga
        .chain
        .first()
        .map_or(nanos(summary.created_at_ms), |record| nanos(record.at_ms));
    let mut clock = first;
    let mut root_events = Vec::new();
    let mut root_dropped = 0_u32;
    let mut steps: BTreeMap<u32, StepTimes> = BTreeMap::new();
    let mut compensations = Vec::new();
    for record in saga.chain {
        let previous = clock;
        clock = clock.max(nanos(record.at_ms));
        let step_seq = record.body["step_seq"]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok());
        match (record.kind.as_str(), step_seq) {
            ("CreateSaga", _) => {}
            ("BeginStep", Some(n)) => {
                steps.entry(n).or_default().start.get_or_insert(clock);
            }
            ("CommitStep" | "FailStep", Some(n)) => {
                steps.entry(n).or_default().end = Some(clock);
            }
            ("RefuseStep" | "ReuseStep" | "SimulateStep", Some(n)) => {
                let step = steps.entry(n).or_default();
                step.start.get_or_insert(clock);
                step.end = Some(clock);
            }
            ("Compensation", Some(n)) => compensations.push(CompensationTimes {
                step_seq: n,
                start: previous,
                end: clock,
                body: record.body.clone(),
            }),
            (_, Some(n)) if steps.contains_key(&n) => {
                let step = steps.entry(n).or_default();
                push_event(
                    &mut step.events,
                    &mut step.dropped_events,
                    record_event(record, clock),
                );
            }
            _ => push_event(
                &mut root_events,
                &mut root_dropped,
                record_event(record, clock),
            ),
        }
    }
    let last = clock;

    let mut spans = Vec::with_capacity(1 + saga.record.steps.len() + compensations.len());
    let (code, message, error_type) = match summary.state {
        SagaState::FailedRolledBack => (
            status::StatusCode::Error,
            "the saga failed and was rolled back",
            Some("rolled_back"),
        ),
        SagaState::FailedRollbackPartial => (
            status::StatusCode::Error,
            "a compensation failed: the saga needs an operator",
            Some("rollback_partial"),
        ),
        _ => (status::StatusCode::Unset, "", None),
    };
    let mut attributes = vec![
        string("agent_kernel.saga.id", saga_id),
        string("agent_kernel.saga.state", summary.state.as_str()),
        int("agent_kernel.saga.n_steps", i64::from(summary.n_steps)),
        boolean("agent_kernel.saga.dry_run", summary.dry_run),
        int(
            "agent_kernel.saga.n_compensations",
            i64::try_from(compensations.len()).unwrap_or(i64::MAX),
        ),
    ];
    if let Some(name) = &summary.name {
        attributes.push(string("agent_kernel.saga.name", name));
    }
    if let Some(actor) = &summary.actor {
        attributes.push(string("agent_kernel.saga.actor", actor));
    }
    if let Some(error_type) = error_type {
        attributes.push(string("error.type", error_type));
    }
    spans.push(Span {
        trace_id: trace.clone(),
        span_id: root_id.clone(),
        name: summary
            .name
            .as_ref()
            .map_or_else(|| "saga".to_owned(), |name| format!("saga {name}")),
        kind: span::SpanKind::Internal as i32,
        start_time_unix_nano: first,
        end_time_unix_nano: last,
        attributes,
        events: root_events,
        dropped_events_count: root_dropped,
        status: Some(Status {
            message: message.to_owned(),
            code: code as i32,
        }),
        ..Default::default()
    });

    for step in &saga.record.steps {
        let times = steps.remove(&step.step_seq).unwrap_or_default();
        let start = times.start.unwrap_or_else(|| nanos(step.created_at_ms));
        let end = times.end.unwrap_or(last).max(start);
        spans.push(Span {
            trace_id: trace.clone(),
            span_id: span_id(saga_id, SpanOf::Step(step.step_seq)).to_vec(),
            parent_span_id: root_id.clone(),
            name: format!("execute_tool {}", step.tool_id),
            kind: span::SpanKind::Internal as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: end,
            attributes: step_attributes(saga_id, step),
            events: times.events,
            dropped_events_count: times.dropped_events,
            status: Some(match &step.error {
                Some(error) if step.status != StepStatus::Commit => Status {
                    message: bounded(error.message()).into_owned(),
                    code: status::StatusCode::Error as i32,
                },
                _ => Status::default(),
            }),
            ..Default::default()
        });
    }

    let mut attempts: BTreeMap<u32, u32> = BTreeMap::new();
    for compensation in compensations {
        let n = compensation.step_seq;
        let attempt = attempts.entry(n).or_default();
        let id = span_id(saga_id, SpanOf::Compensation(n, *attempt));
        *attempt += 1;
        let tool = step_of(saga.record, n).map_or("unknown", |step| step.tool_id.as_str());
        let outcome = compensation.body["status"].as_str().unwrap_or("");
        let failed = outcome == StepStatus::CompensationFailed.as_str();
        let note = compensation.body["compensation"].as_str().unwrap_or("");
        let mut attributes = vec![
            string("gen_ai.tool.name", tool),
            string("agent_kernel.saga.id", saga_id),
            int("agent_kernel.step.seq", i64::from(n)),
            string("agent_kernel.compensation.status", outcome),
            int("agent_kernel.compensation.attempt", i64::from(*attempt)),
        ];
        if !note.is_empty() {
            attributes.push(string("agent_kernel.compensation.note", note));
        }
        if failed {
            attributes.push(string("error.type", "compensation_failed"));
        }
        spans.push(Span {
            trace_id: trace.clone(),
            span_id: id.to_vec(),
            parent_span_id: root_id.clone(),
            name: format!("compensate {tool}"),
            kind: span::SpanKind::Internal as i32,
            start_time_unix_nano: compensation.start,
            end_time_unix_nano: compensation.end,
            attributes,
            links: vec![span::Link {
                trace_id: trace.clone(),
                span_id: span_id(saga_id, SpanOf::Step(n)).to_vec(),
                attributes: vec![string("agent_kernel.link", "compensates")],
                ..Default::default()
            }],
            status: Some(if failed {
                Status {
                    message: bounded(note).into_owned(),
                    code: status::StatusCode::Error as i32,
                }
            } else {
                Status::default()
            }),
            ..Default::default()
        });
    }
    spans
}

/// Step `step_seq` of `record` (its steps are in `step_seq` order).
fn step_of(record: &SagaRecord, step_seq: u32) -> Option<&StepRecord> {
    record
        .steps
        .binary_search_by_key(&step_seq, |step| step.step_seq)
        .ok()
        .map(|i| &record.steps[i])
}

/// The attributes of a step's span.
fn step_attributes(saga_id: &str, step: &StepRecord) -> Vec<KeyValue> {
    let mut attributes = vec![
        string("gen_ai.operation.name", "execute_tool"),
        string("gen_ai.tool.name", &step.tool_id),
        string(
            "gen_ai.tool.call.id",
            &format!("{saga_id}/{}", step.step_seq),
        ),
        string("agent_kernel.saga.id", saga_id),
        int("agent_kernel.step.seq", i64::from(step.step_seq)),
        string("agent_kernel.step.status", step.status.as_str()),
        string("agent_kernel.tool.version", &step.tool_version),
        string("agent_kernel.tool.effect", step.effect.as_str()),
        string("agent_kernel.args.sha256", &step.args_hash),
    ];
    if let Some(key) = &step.idempotency_key {
        attributes.push(string("agent_kernel.idempotency_key", key));
    }
    if let Some((saga, seq)) = &step.reused_from {
        attributes.push(string(
            "agent_kernel.step.reused_from",
            &format!("{saga}/{seq}"),
        ));
    }
    if let Some(error) = &step.error {
        let kind = serde_json::to_value(error.kind())
            .ok()
            .and_then(|kind| kind.as_str().map(str::to_owned))
            .unwrap_or_else(|| "failed".to_owned());
        attributes.push(string("error.type", &kind));
        attributes.push(string(
            "agent_kernel.outcome",
            if error.is_uncertain() {
                "uncertain"
            } else {
                "not_applied"
            },
        ));
    }
    attributes
}

/// An event for an audit record: named by its kind, with the record's sequence number and
/// the scalar fields of its body (`saga_id` and `step_seq` left out: the span says them).
fn record_event(record: &AuditRecord, at: u64) -> span::Event {
    let mut attributes = vec![int("agent_kernel.audit.seq", record.seq)];
    let mut dropped = 0_u32;
    if let Some(body) = record.body.as_object() {
        for (key, value) in body {
            if key == "saga_id" || key == "step_seq" {
                continue;
            }
            let name = format!("agent_kernel.{key}");
            let attribute = match value {
                Value::String(text) => string(&name, text),
                Value::Bool(flag) => boolean(&name, *flag),
                Value::Number(number) => match number.as_i64() {
                    Some(n) => int(&name, n),
                    None => string(&name, &number.to_string()),
                },
                _ => continue,
            };
            if attributes.len() > EVENT_ATTRIBUTES_MAX {
                dropped += 1;
            } else {
                attributes.push(attribute);
            }
        }
    }
    span::Event {
        time_unix_nano: at,
        name: record.kind.clone(),
        attributes,
        dropped_attributes_count: dropped,
    }
}

/// Adds `event` to `events` within [`EVENTS_PER_SPAN_MAX`], counting what does not fit.
fn push_event(events: &mut Vec<span::Event>, dropped: &mut u32, event: span::Event) {
    if events.len() < EVENTS_PER_SPAN_MAX {
        events.push(event);
    } else {
        *dropped = dropped.saturating_add(1);
    }
}

/// Milliseconds since the epoch as OTLP nanoseconds (a time before the epoch as 0).
fn nanos(ms: i64) -> u64 {
    u64::try_from(ms).unwrap_or(0).saturating_mul(1_000_000)
}

/// `text` within [`ATTRIBUTE_BYTES_MAX`].
fn bounded(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= ATTRIBUTE_BYTES_MAX {
        return text.into();
    }
    let mut end = ATTRIBUTE_BYTES_MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end]).into()
}

fn attribute(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn string(key: &str, value: &str) -> KeyValue {
    attribute(
        key,
        any_value::Value::StringValue(bounded(value).into_owned()),
    )
}

fn int(key: &str, value: i64) -> KeyValue {
    attribute(key, any_value::Value::IntValue(value))
}

fn boolean(key: &str, value: bool) -> KeyValue {
    attribute(key, any_value::Value::BoolValue(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uuid_is_its_own_trace_id_and_anything_else_is_hashed() {
        let id = trace_id("01a232c1-a338-7048-96b5-683f8581e7cc");
        assert_eq!(id[0], 0x01);
        assert_eq!(id[15], 0xcc);
        let other = trace_id("not-a-uuid");
        assert_ne!(other, [0; 16]);
        assert_eq!(other, trace_id("not-a-uuid"), "deterministic");
        assert_ne!(trace_id("0000000000000000000000000000000g"), [0; 16]);
        assert_ne!(trace_id("00000000-0000-0000-0000-000000000000"), [0; 16]);
    }

    #[test]
    fn span_ids_differ_by_what_they_stand_for() {
        let ids = [
            span_id("s", SpanOf::Saga),
            span_id("s", SpanOf::Step(0)),
            span_id("s", SpanOf::Step(1)),
            span_id("s", SpanOf::Compensation(0, 0)),
            span_id("s", SpanOf::Compensation(0, 1)),
            span_id("t", SpanOf::Saga),
        ];
        let unique: std::collections::BTreeSet<_> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len());
    }

    #[test]
    fn long_strings_are_cut_at_a_character_boundary() {
        let long = "é".repeat(ATTRIBUTE_BYTES_MAX);
        let cut = bounded(&long);
        assert!(cut.len() <= ATTRIBUTE_BYTES_MAX + '…'.len_utf8());
        assert!(cut.ends_with('…'));
        assert_eq!(bounded("short"), "short");
    }

    #[test]
    fn events_beyond_the_bound_are_counted() {
        let mut events = Vec::new();
        let mut dropped = 0;
        for _ in 0..EVENTS_PER_SPAN_MAX + 3 {
            push_event(&mut events, &mut dropped, span::Event::default());
        }
        assert_eq!(events.len(), EVENTS_PER_SPAN_MAX);
        assert_eq!(dropped, 3);
    }
}
