//! `agent-kernel serve`: the operator console, a web server on loopback whose pages and
//! JSON answers are the operator actions of the command line (`agent_kernel::operator`).
//!
//! Every route but `GET /healthz`, `GET /login` and `POST /login` needs the token: a bearer
//! header (scripts), or the session cookie the login form sets (browsers), whose POSTs also
//! carry the session's CSRF token. A POST from another site is refused whatever it carries.

mod auth;
mod events;
mod outside;
mod pages;
mod tls;

use std::collections::HashMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent_kernel::operator::{ApprovalView, OperatorLock};
use agent_kernel::{AuditKey, Kernel, KernelError, SystemClock, operator};
use agent_kernel_api::{Clock as _, SagaId, SagaQuery, SagaSummary};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use self::auth::{Access, Gate, SESSION_COOKIE, SESSION_TTL, TOKEN_MIN_CHARS};
use self::outside::Outside;
use crate::Compensation;
use crate::args::{Cli, ServeArgs};
use crate::output::{Output, saga_record_document};
use crate::{Failure, exit};
use agent_kernel_api::Durability;
use axum::extract::DefaultBodyLimit;

/// The Content-Security-Policy of every answer: nothing but the console's own style sheet
/// and script (which may reach the console alone), forms posted to the console only, never
/// framed.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// How many sagas a page of the list holds unless asked (`limit`).
const PAGE_SAGAS_DEFAULT: u32 = 50;

/// The most sagas a page of the list holds.
const PAGE_SAGAS_MAX: u32 = 500;

/// The most audit records a saga's timeline shows (the newest).
const SAGA_AUDIT_RECORDS: u32 = 200;

/// The largest request body read.
const BODY_BYTES_MAX: usize = 64 * 1024;

/// What every handler shares.
struct Console {
    /// The kernel of decisions and of every read, as `approve` opens it.
    kernel: Arc<Kernel>,
    /// The kernel of `undo` and dead letters' retries, which compensates from the log's
    /// records as `undo` and `dlq retry` do; `None` without a sandbox policy, without which
    /// no file step could be compensated.
    compensating: Option<Arc<Kernel>>,
    /// The thread that kept its access to the log's folder: the audit check and the
    /// operator lock run there.
    outside: Outside,
    /// The log (a file, or a PostgreSQL URL).
    db: PathBuf,
    audit_key: Option<AuditKey>,
    /// The audit chain's last check by this console, for the overview.
    last_check: std::sync::Mutex<Option<AuditCheck>>,
    /// The changes `GET /events` sends.
    events: events::Events,
    gate: Gate,
    /// The port it listens on, which every request's `Host` must name.
    port: u16,
    /// Whether it answers over TLS (its cookie is then `Secure`, and the certificate, not
    /// the `Host`, keeps other sites' names out).
    tls: bool,
    /// Who decides, as recorded (`--operator`); `None`: the process's user.
    operator: Option<String>,
    operator_key: Option<Vec<u8>>,
}

type Shared = Arc<Console>;

/// `agent-kernel serve`.
pub(crate) async fn serve(cli: &Cli, out: &Output, args: &ServeArgs) -> Result<u8, Failure> {
    let listen: SocketAddr = args.listen.parse().map_err(|error| {
        Failure::bad_input(anyhow::anyhow!(
            "--listen {}: not an address and port ({error}), e.g. 127.0.0.1:7700",
            args.listen
        ))
    })?;
    if args.tls_cert.is_some() != args.tls_key.is_some() {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--tls-cert and --tls-key go together; nothing was started"
        )));
    }
    if !listen.ip().is_loopback() && (args.tls_cert.is_none() || args.token_file.is_none()) {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--listen {listen}: a console beyond loopback needs --token-file and TLS (--tls-cert and --tls-key); nothing was started"
        )));
    }
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(tls::server_config(cert, key).map_err(|message| {
            Failure::bad_input(anyhow::anyhow!("{message}; nothing was started"))
        })?),
        _ => None,
    };
    crate::require_log(cli)?;
    let operator_key = crate::approvals::given_operator_key(args.operator_key_file.as_deref())?;
    let (token, token_file) = console_token(cli, args.token_file.as_deref())?;
    // Bound before the kernel confines the process.
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|error| {
            Failure::bad_input(anyhow::anyhow!("--listen {listen}: cannot listen: {error}"))
        })?;
    let bound = listener
        .local_addr()
        .map_err(|error| Failure::internal(anyhow::Error::new(error)))?;
    let audit_key = crate::audit_key(cli)?;
    // Both kernels open, and the outside thread started, before the process confines
    // itself: from then on only that thread (and the logs' own) reach the log's folder.
    let opened = crate::open_unconfined(
        cli,
        Durability::Full,
        Compensation::AndExecution,
        Vec::new(),
        true,
    )?;
    let compensating = if opened.policy().source().is_some() {
        Some(
            crate::open_unconfined(cli, Durability::Full, Compensation::Only, Vec::new(), true)?
                .kernel,
        )
    } else {
        tracing::warn!(
            "no sandbox policy: the console cannot undo sagas or retry dead letters (pass the policy the sagas ran under with --sandbox)"
        );
        None
    };
    let outside = Outside::start().map_err(|error| {
        Failure::internal(anyhow::anyhow!(
            "cannot start the console's thread for the audit check: {error}"
        ))
    })?;
    opened
        .confine()
        .map_err(|error| Failure::internal(anyhow::Error::new(error)))?;
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let events = events::Events::start(opened.kernel.clone(), stopping).await?;
    let console = Arc::new(Console {
        events,
        kernel: opened.kernel,
        compensating,
        outside,
        db: crate::db_path(cli),
        audit_key,
        last_check: std::sync::Mutex::new(None),
        gate: Gate::new(token),
        port: bound.port(),
        tls: tls.is_some(),
        operator: args.operator.clone(),
        operator_key,
    });
    let url = format!(
        "{}://{bound}/",
        if tls.is_some() { "https" } else { "http" }
    );
    eprintln!(
        "the operator console is at {url} (the token is in {}); Ctrl-C stops it",
        token_file.display()
    );
    if out.is_json() {
        // One line, at once: whoever started the server reads the URL from it.
        let line = json!({"url": url, "token_file": token_file});
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{line}");
        let _ = stdout.flush();
    }
    let served = match tls {
        Some(config) => {
            let listener = tls::TlsListener::start(listener, config)
                .map_err(|error| Failure::internal(anyhow::Error::new(error)))?;
            axum::serve(listener, router(console))
                .with_graceful_shutdown(shutdown_signal(stop))
                .await
        }
        None => {
            axum::serve(listener, router(console))
                .with_graceful_shutdown(shutdown_signal(stop))
                .await
        }
    };
    served.map_err(|error| Failure::internal(anyhow::Error::new(error)))?;
    Ok(exit::OK)
}

/// The token and the file it is in: `--token-file`'s, else a new one written `0600` to
/// `DB.console-token` beside an SQLite log.
fn console_token(cli: &Cli, given: Option<&Path>) -> Result<(String, PathBuf), Failure> {
    if let Some(path) = given {
        let text = std::fs::read_to_string(path).map_err(|error| {
            Failure::bad_input(anyhow::anyhow!(
                "--token-file {}: {error}; nothing was started",
                path.display()
            ))
        })?;
        let token = text.trim().to_owned();
        if token.chars().count() < TOKEN_MIN_CHARS || token.chars().any(char::is_whitespace) {
            return Err(Failure::bad_input(anyhow::anyhow!(
                "--token-file {}: the token must be at least {TOKEN_MIN_CHARS} characters without spaces; nothing was started",
                path.display()
            )));
        }
        if std::fs::metadata(path).is_ok_and(|meta| {
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o077 != 0
        }) {
            tracing::warn!(
                "--token-file {}: others than its owner may read it; whoever reads it decides approvals (chmod 600)",
                path.display()
            );
        }
        return Ok((token, path.to_owned()));
    }
    if crate::is_postgres(cli) {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "a console on a PostgreSQL log needs --token-file (there is no folder beside the log to write one in); nothing was started"
        )));
    }
    let mut name = crate::db_path(cli).into_os_string();
    name.push(".console-token");
    let path = PathBuf::from(name);
    let token = auth::random_token();
    let _ = std::fs::remove_file(&path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut file| file.write_all(token.as_bytes()).map(|()| file))
        .map_err(|error| {
            Failure::bad_input(anyhow::anyhow!(
                "cannot write the console's token to {}: {error}; pass --token-file",
                path.display()
            ))
        })?;
    let _ = file.flush();
    Ok((token, path))
}

/// Until SIGINT or SIGTERM; then `stop` tells the event streams to end.
async fn shutdown_signal(stop: tokio::sync::watch::Sender<bool>) {
    until_signal().await;
    let _ = stop.send(true);
}

/// Until SIGINT or SIGTERM.
async fn until_signal() {
    let interrupt = tokio::signal::ctrl_c();
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(_) => {
                let _ = interrupt.await;
                return;
            }
        };
    tokio::select! {
        _ = interrupt => {}
        _ = terminate.recv() => {}
    }
}

fn router(console: Shared) -> Router {
    Router::new()
        .route("/", get(overview))
        .route("/approvals", get(approvals))
        .route("/approvals/{id}/approve", post(approve))
        .route("/approvals/{id}/reject", post(reject))
        .route("/sagas", get(sagas))
        .route("/sagas/{id}", get(saga))
        .route("/sagas/{id}/undo", get(undo_preview).post(undo))
        .route("/sagas/{id}/audit", get(saga_audit))
        .route("/dead-letters", get(dead_letters))
        .route("/dead-letters/{id}/retry", post(retry))
        .route("/dead-letters/{id}/resolve", post(resolve))
        .route("/audit/verify", post(verify))
        .route(
            "/events",
            get(|State(console): State<Shared>| async move { console.events.stream() }),
        )
        .route("/logout", post(logout))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(console.clone(), guard))
        .route("/healthz", get(|| async { "ok" }))
        .route("/login", get(login_form).post(login))
        .route("/assets/console.css", get(style))
        .route("/assets/console.js", get(script))
        .layer(middleware::from_fn_with_state(console.clone(), named_host))
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
        .layer(middleware::map_response(secure_headers))
        .with_state(console)
}

/// Every answer: the CSP and the headers that keep pages out of frames, caches and
/// content sniffing.
async fn secure_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        ("content-security-policy", CONTENT_SECURITY_POLICY),
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        // Not `no-referrer`: under it a browser's form posts carry `Origin: null`.
        ("referrer-policy", "same-origin"),
        ("cache-control", "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// Whether the client asked for JSON.
fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|accept| accept.contains("application/json"))
}

/// A refusal: `{"error": {"status", "message"}}` in JSON, else a page.
fn refusal(json: bool, status: StatusCode, message: &str) -> Response {
    if json {
        return (
            status,
            axum::Json(json!({"error": {"status": status.as_u16(), "message": message}})),
        )
            .into_response();
    }
    (
        status,
        Html(pages::problem("Refused", message).into_string()),
    )
        .into_response()
}

/// Every request over plain HTTP names the console by a loopback name and its port: a page
/// of another site that made its own name resolve to 127.0.0.1 (DNS rebinding) does not.
async fn named_host(State(console): State<Shared>, request: Request, next: Next) -> Response {
    // Over TLS a browser checks the certificate against the name it asked for: a rebound
    // name fails there.
    if console.tls || auth::is_host_of(request.headers(), console.port) {
        return next.run(request).await;
    }
    refusal(
        wants_json(request.headers()),
        StatusCode::MISDIRECTED_REQUEST,
        "the request names another host than this console (127.0.0.1, localhost or [::1] with its port): refused",
    )
}

/// The token, or a login; for a POST, no other site, and a session's CSRF token.
async fn guard(State(console): State<Shared>, request: Request, next: Next) -> Response {
    let json = wants_json(request.headers());
    let Some(access) = console.gate.access(request.headers()) else {
        if !json && request.method() == Method::GET {
            return (
                StatusCode::UNAUTHORIZED,
                Html(pages::login(None).into_string()),
            )
                .into_response();
        }
        return refusal(
            json,
            StatusCode::UNAUTHORIZED,
            "no token, or a wrong one: send `Authorization: Bearer TOKEN` or sign in at /login",
        );
    };
    if request.method() != Method::POST {
        let mut request = request;
        request.extensions_mut().insert(access);
        return next.run(request).await;
    }
    if auth::is_cross_site(request.headers()) {
        return refusal(
            json,
            StatusCode::FORBIDDEN,
            "a request from another site: nothing was changed",
        );
    }
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, BODY_BYTES_MAX).await else {
        return refusal(
            json,
            StatusCode::PAYLOAD_TOO_LARGE,
            "the request's body is too large: nothing was changed",
        );
    };
    let fields = match form_fields(&parts.headers, &bytes) {
        Ok(fields) => fields,
        Err(message) => return refusal(json, StatusCode::UNPROCESSABLE_ENTITY, &message),
    };
    if let Access::Session { csrf } = &access
        && !fields
            .get("csrf")
            .is_some_and(|given| auth::constant_time_eq(given.as_bytes(), csrf.as_bytes()))
    {
        return refusal(
            json,
            StatusCode::FORBIDDEN,
            "the form's CSRF token is missing or wrong: reload the page; nothing was changed",
        );
    }
    let mut request = Request::from_parts(parts, axum::body::Body::from(bytes));
    request.extensions_mut().insert(access);
    request.extensions_mut().insert(Fields(fields));
    next.run(request).await
}

/// A POST's fields, from a form or a JSON object.
#[derive(Debug, Clone, Default)]
struct Fields(HashMap<String, String>);

impl Fields {
    fn get(&self, name: &str) -> Option<String> {
        self.0
            .get(name)
            .map(|value| value.trim().to_owned())
            .filter(|value| !value.is_empty())
    }
}

/// The fields of a POST body: `application/x-www-form-urlencoded` or a JSON object (its
/// values text, numbers or booleans).
fn form_fields(headers: &HeaderMap, body: &[u8]) -> Result<HashMap<String, String>, String> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|kind| kind.starts_with("application/json"));
    if !is_json {
        return Ok(url::form_urlencoded::parse(body).into_owned().collect());
    }
    if body.is_empty() {
        return Ok(HashMap::new());
    }
    let value: Value = serde_json::from_slice(body)
        .map_err(|error| format!("the body is not JSON: {error}; nothing was changed"))?;
    let Value::Object(map) = value else {
        return Err("the body must be a JSON object; nothing was changed".to_owned());
    };
    map.into_iter()
        .map(|(name, value)| match value {
            Value::String(text) => Ok((name, text)),
            Value::Bool(_) | Value::Number(_) => Ok((name, value.to_string())),
            _ => Err(format!(
                "field `{name}` must be text, a number or a boolean; nothing was changed"
            )),
        })
        .collect()
}

async fn style() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        pages::STYLE,
    )
        .into_response()
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        pages::SCRIPT,
    )
        .into_response()
}

async fn login_form(State(console): State<Shared>, headers: HeaderMap) -> Response {
    if console.gate.access(&headers).is_some() {
        return Redirect::to("/").into_response();
    }
    Html(pages::login(None).into_string()).into_response()
}

/// `POST /login` (`token`): a session cookie for the right token.
async fn login(State(console): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let json = wants_json(&headers);
    if auth::is_cross_site(&headers) {
        return refusal(
            json,
            StatusCode::FORBIDDEN,
            "a sign-in from another site: refused",
        );
    }
    let fields = match form_fields(&headers, &body) {
        Ok(fields) => fields,
        Err(message) => return refusal(json, StatusCode::UNPROCESSABLE_ENTITY, &message),
    };
    let token = fields.get("token").cloned().unwrap_or_default();
    match console.gate.try_login(&token) {
        Ok(true) => {}
        Ok(false) if !json => {
            return (
                StatusCode::UNAUTHORIZED,
                Html(pages::login(Some("That is not the console's token.")).into_string()),
            )
                .into_response();
        }
        Ok(false) => {
            return refusal(
                json,
                StatusCode::UNAUTHORIZED,
                "that is not the console's token",
            );
        }
        Err(()) => {
            return refusal(
                json,
                StatusCode::TOO_MANY_REQUESTS,
                "a sign-in with a wrong token was just refused: try again in a second",
            );
        }
    }
    let session = console.gate.start_session();
    let cookie = format!(
        "{SESSION_COOKIE}={session}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{}",
        SESSION_TTL.as_secs(),
        if console.tls { "; Secure" } else { "" }
    );
    (
        StatusCode::SEE_OTHER,
        [(header::SET_COOKIE, cookie), (header::LOCATION, "/".into())],
    )
        .into_response()
}

async fn logout(State(console): State<Shared>, headers: HeaderMap) -> Response {
    console.gate.end_session(&headers);
    let cookie = format!("{SESSION_COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0");
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, cookie),
            (header::LOCATION, "/login".into()),
        ],
    )
        .into_response()
}

/// The status of an operator action's error: 404 an unknown id, 409 a request or letter no
/// longer open, 403 the operator key, 422 bad input, 500 the rest.
fn failed(json: bool, error: &KernelError) -> Response {
    let status = match error {
        KernelError::SagaNotFound(_)
        | KernelError::ApprovalNotFound(_)
        | KernelError::DeadLetterNotFound(_) => StatusCode::NOT_FOUND,
        KernelError::ApprovalClosed { .. }
        | KernelError::DeadLetterClosed { .. }
        | KernelError::UndoRefused { .. }
        | KernelError::TakenOver(_)
        | KernelError::Tampered { .. } => StatusCode::CONFLICT,
        KernelError::OperatorKeyRequired(_) | KernelError::OperatorKeyMismatch(_) => {
            StatusCode::FORBIDDEN
        }
        KernelError::InvalidRequest(_) => StatusCode::UNPROCESSABLE_ENTITY,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    refusal(json, status, &error.to_string())
}

/// A route the console does not have.
async fn not_found(headers: HeaderMap) -> Response {
    refusal(
        wants_json(&headers),
        StatusCode::NOT_FOUND,
        "the console has no such page",
    )
}

/// `GET /`: sagas by state, pending approvals, open dead letters.
async fn overview(
    State(console): State<Shared>,
    headers: HeaderMap,
    axum::Extension(access): axum::Extension<Access>,
) -> Response {
    let json = wants_json(&headers);
    let kernel = &console.kernel;
    let counts = match kernel.log().saga_counts().await {
        Ok(counts) => counts,
        Err(error) => return failed(json, &KernelError::Log(error)),
    };
    let pending = match operator::pending_approvals(kernel).await {
        Ok(pending) => pending,
        Err(error) => return failed(json, &error),
    };
    let letters = match operator::dead_letters(kernel).await {
        Ok(letters) => letters.len(),
        Err(error) => return failed(json, &error),
    };
    if json {
        let counts: serde_json::Map<String, Value> = counts
            .iter()
            .map(|(state, n)| (state.as_str().to_owned(), json!(n)))
            .collect();
        return axum::Json(json!({
            "counts": counts,
            "approvals_pending": pending.len(),
            "dead_letters_open": letters,
        }))
        .into_response();
    }
    let orphans: Vec<SagaSummary> = match kernel.recoverable_sagas().await {
        Ok(orphans) => orphans,
        Err(error) => return failed(json, &error),
    };
    let last_check = console.last_check.lock().ok().and_then(|last| last.clone());
    Html(
        pages::overview(&pages::Overview {
            counts: &counts,
            pending: &pending,
            dead_letters_open: letters,
            orphans: &orphans,
            last_check: last_check.as_ref(),
            now_ms: SystemClock.now_ms(),
            csrf: access.csrf(),
        })
        .into_string(),
    )
    .into_response()
}

/// `GET /approvals`: as `approvals --json`, or the inbox.
async fn approvals(
    State(console): State<Shared>,
    headers: HeaderMap,
    axum::Extension(access): axum::Extension<Access>,
) -> Response {
    let json = wants_json(&headers);
    let pending = match operator::pending_approvals(&console.kernel).await {
        Ok(pending) => pending,
        Err(error) => return failed(json, &error),
    };
    if json {
        return axum::Json(crate::approvals::list_document(&pending)).into_response();
    }
    Html(pages::approvals(&pending, access.csrf()).into_string()).into_response()
}

async fn approve(
    state: State<Shared>,
    headers: HeaderMap,
    id: UrlPath<String>,
    fields: axum::Extension<Fields>,
) -> Response {
    decide(state, headers, id, fields, true).await
}

async fn reject(
    state: State<Shared>,
    headers: HeaderMap,
    id: UrlPath<String>,
    fields: axum::Extension<Fields>,
) -> Response {
    decide(state, headers, id, fields, false).await
}

/// `POST /approvals/ID/approve` (`note`) and `…/reject` (`reason`): the decision, once,
/// recorded as the console's operator.
async fn decide(
    State(console): State<Shared>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    axum::Extension(fields): axum::Extension<Fields>,
    approve: bool,
) -> Response {
    let json = wants_json(&headers);
    let note = fields.get(if approve { "note" } else { "reason" });
    if !approve && note.is_none() {
        return refusal(
            json,
            StatusCode::UNPROCESSABLE_ENTITY,
            "a rejection needs a reason (field `reason`); nothing was changed",
        );
    }
    let decided = operator::decide(
        &console.kernel,
        operator::Decision {
            approval_id: id,
            approve,
            note,
            operator_key: console.operator_key.clone(),
            by: console.operator.clone(),
        },
    )
    .await;
    match decided {
        Ok(view) if json => axum::Json(json!({
            "id": view.request.approval_id,
            "status": view.status,
        }))
        .into_response(),
        Ok(_) => Redirect::to("/approvals").into_response(),
        Err(error) => failed(json, &error),
    }
}

/// `GET /sagas/ID`: as `log --saga ID --json`, or its timeline.
async fn saga(
    State(console): State<Shared>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    axum::Extension(access): axum::Extension<Access>,
) -> Response {
    let json = wants_json(&headers);
    let saga_id = SagaId::new(id);
    let record = match operator::saga(console.kernel.log().as_ref(), &saga_id).await {
        Ok(record) => record,
        Err(error) => return failed(json, &error),
    };
    if json {
        return axum::Json(saga_record_document(&record)).into_response();
    }
    let approval = match console.kernel.log().saga_approval(&saga_id).await {
        Ok(approval) => approval.map(|approval| ApprovalView::of(approval, SystemClock.now_ms())),
        Err(error) => return failed(json, &KernelError::Log(error)),
    };
    Html(pages::saga(&record, approval.as_ref(), access.csrf()).into_string()).into_response()
}

/// `GET /sagas/ID/audit`: the saga's audit records, as `audit list --saga ID --json`
/// (newest first, at most [`SAGA_AUDIT_RECORDS`]), or a page of them oldest first. Read on
/// demand: the chain has no index by saga, so this reads back from its end.
async fn saga_audit(
    State(console): State<Shared>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    axum::Extension(access): axum::Extension<Access>,
) -> Response {
    let json = wants_json(&headers);
    let saga_id = SagaId::new(id);
    if let Err(error) = operator::saga(console.kernel.log().as_ref(), &saga_id).await {
        return failed(json, &error);
    }
    let records = console.saga_audit_records(&saga_id).await;
    if json {
        return match records {
            Ok(mut records) => {
                records.reverse();
                axum::Json(json!({"records": records})).into_response()
            }
            Err(message) => refusal(json, StatusCode::CONFLICT, &message),
        };
    }
    Html(pages::saga_audit(&saga_id, &records, access.csrf()).into_string()).into_response()
}

/// `GET /dead-letters`: as `dlq list --json`, or the list with a form to resolve each.
async fn dead_letters(
    State(console): State<Shared>,
    headers: HeaderMap,
    axum::Extension(access): axum::Extension<Access>,
) -> Response {
    let json = wants_json(&headers);
    let letters = match operator::dead_letters(&console.kernel).await {
        Ok(letters) => letters,
        Err(error) => return failed(json, &error),
    };
    if json {
        return axum::Json(crate::dlq::list_document(&letters)).into_response();
    }
    // What each compensation would put back, as its tool says.
    let mut restores = Vec::with_capacity(letters.len());
    for letter in &letters {
        let record = console.kernel.log().saga(&letter.saga_id).await;
        let step = record.ok().flatten().and_then(|record| {
            record
                .steps
                .into_iter()
                .find(|step| step.step_seq == letter.step_seq)
        });
        restores.push(match step {
            Some(step) => console.kernel.step_restores(&step).await,
            None => None,
        });
    }
    Html(pages::dead_letters(&letters, &restores, access.csrf()).into_string()).into_response()
}

/// `POST /dead-letters/ID/resolve` (`note`): the letter settled by hand, recorded as the
/// console's operator.
async fn resolve(
    State(console): State<Shared>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    axum::Extension(fields): axum::Extension<Fields>,
) -> Response {
    let json = wants_json(&headers);
    let Some(note) = fields.get("note") else {
        return refusal(
            json,
            StatusCode::UNPROCESSABLE_ENTITY,
            "resolving a dead letter needs a note saying how it was settled (field `note`); nothing was changed",
        );
    };
    match operator::resolve_dead_letter(&console.kernel, &id, &note, console.operator.clone()).await
    {
        Ok(outcome) if json => axum::Json(json!({
            "id": outcome.letter.letter_id,
            "status": outcome.letter.status,
        }))
        .into_response(),
        Ok(_) => Redirect::to("/dead-letters").into_response(),
        Err(error) => failed(json, &error),
    }
}

/// The filters of `GET /sagas`, from its query string, as given (for the page's form and
/// its next link).
#[derive(Debug, Default)]
pub(crate) struct ListFilters {
    pub(crate) state: String,
    pub(crate) tool: String,
    pub(crate) actor: String,
    pub(crate) text: String,
    pub(crate) name: String,
    pub(crate) from: String,
    pub(crate) until: String,
    pub(crate) limit: Option<u32>,
}

impl ListFilters {
    /// The query string of these filters, with `after` when given.
    pub(crate) fn query_string(&self, after: Option<&str>) -> String {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        for (name, value) in [
            ("state", self.state.as_str()),
            ("tool", &self.tool),
            ("actor", &self.actor),
            ("q", &self.text),
            ("name", &self.name),
            ("from", &self.from),
            ("until", &self.until),
        ] {
            if !value.is_empty() {
                query.append_pair(name, value);
            }
        }
        if let Some(limit) = self.limit {
            query.append_pair("limit", &limit.to_string());
        }
        if let Some(after) = after {
            query.append_pair("after", after);
        }
        query.finish()
    }
}

/// The query of `GET /sagas?state=&tool=&actor=&q=&name=&from=&until=&limit=&after=`, or
/// why it is bad input.
fn list_query(raw: Option<&str>) -> Result<(ListFilters, SagaQuery), String> {
    let mut filters = ListFilters::default();
    let mut after = None;
    for (name, value) in url::form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        let value = value.trim().to_owned();
        match name.as_ref() {
            "state" => filters.state = value,
            "tool" => filters.tool = value,
            "actor" => filters.actor = value,
            "q" => filters.text = value,
            "name" => filters.name = value,
            "from" => filters.from = value,
            "until" => filters.until = value,
            "limit" if !value.is_empty() => {
                let limit = value
                    .parse::<u32>()
                    .ok()
                    .filter(|limit| (1..=PAGE_SAGAS_MAX).contains(limit))
                    .ok_or_else(|| {
                        format!("`limit` must be a whole number from 1 to {PAGE_SAGAS_MAX}")
                    })?;
                filters.limit = Some(limit);
            }
            "after" if !value.is_empty() => after = Some(value),
            _ => {}
        }
    }
    let state = if filters.state.is_empty() {
        None
    } else {
        Some(
            filters
                .state
                .parse()
                .map_err(|_| format!("`state` {:?} is not a saga state", filters.state))?,
        )
    };
    let before = after
        .map(|cursor| {
            cursor
                .split_once(':')
                .and_then(|(at_ms, saga_id)| Some((at_ms.parse::<i64>().ok()?, saga_id)))
                .filter(|(_, saga_id)| !saga_id.is_empty())
                .map(|(at_ms, saga_id)| (at_ms, SagaId::new(saga_id)))
                .ok_or_else(|| format!("`after` {cursor:?} is not a cursor this list gave"))
        })
        .transpose()?;
    let time = |field: &str, text: &str| -> Result<Option<i64>, String> {
        if text.is_empty() {
            return Ok(None);
        }
        agent_kernel_api::parse_utc_ms(text).map(Some).ok_or_else(|| {
            format!(
                "`{field}` {text:?} is not a time: give a UTC date and time such as 2026-12-01 or 2026-12-01T14:30"
            )
        })
    };
    let created_from_ms = time("from", &filters.from)?;
    let created_until_ms = time("until", &filters.until)?;
    let given = |text: &str| (!text.is_empty()).then(|| text.to_owned());
    let query = SagaQuery {
        state,
        actor: given(&filters.actor),
        tool: given(&filters.tool),
        text: given(&filters.text),
        name: given(&filters.name),
        created_from_ms,
        created_until_ms,
        before,
        // One more, to know whether a next page exists.
        limit: filters.limit.unwrap_or(PAGE_SAGAS_DEFAULT) + 1,
    };
    Ok((filters, query))
}

/// `GET /sagas`: a page of the saga list, newest first, with its filters, and the cursor
/// of the next page.
async fn sagas(
    State(console): State<Shared>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    axum::Extension(access): axum::Extension<Access>,
) -> Response {
    let json = wants_json(&headers);
    let (filters, query) = match list_query(uri.query()) {
        Ok(parsed) => parsed,
        Err(message) => return refusal(json, StatusCode::UNPROCESSABLE_ENTITY, &message),
    };
    let mut page = match console.kernel.log().saga_page(&query).await {
        Ok(page) => page,
        Err(error) => return failed(json, &KernelError::Log(error)),
    };
    let wanted = (query.limit - 1) as usize;
    let next = (page.len() > wanted).then(|| {
        page.truncate(wanted);
        let last = &page[wanted - 1].saga;
        format!("{}:{}", last.created_at_ms, last.saga_id)
    });
    if json {
        let sagas: Vec<Value> = page
            .iter()
            .map(|listing| {
                let saga = &listing.saga;
                json!({
                    "saga_id": saga.saga_id,
                    "state": saga.state,
                    "name": saga.name,
                    "actor": saga.actor,
                    "created_at": agent_kernel_api::format_rfc3339_ms(saga.created_at_ms),
                    "steps": listing.n_begun,
                })
            })
            .collect();
        return axum::Json(json!({"sagas": sagas, "next": next})).into_response();
    }
    Html(pages::sagas(&page, &filters, next.as_deref(), access.csrf()).into_string())
        .into_response()
}

/// `GET /sagas/ID/undo`: what an undo would do to each step, nothing undone (`undo
/// --preview`); the undo itself is the command line's for now.
async fn undo_preview(
    State(console): State<Shared>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    axum::Extension(access): axum::Extension<Access>,
) -> Response {
    let json = wants_json(&headers);
    let preview = match operator::undo_preview(&console.kernel, &SagaId::new(id)).await {
        Ok(preview) => preview,
        Err(error) => return failed(json, &error),
    };
    if !json {
        return Html(pages::undo_preview(&preview, access.csrf()).into_string()).into_response();
    }
    let steps: Vec<Value> = preview
        .steps
        .iter()
        .map(|step| {
            let reason = pages::undo_refusal(step);
            json!({
                "seq": step.step_seq,
                "tool": step.tool_id,
                "undoable": reason.is_none(),
                "reason": reason,
                "restores": step.restores,
                "window_closes_at": step.window_closes_at_ms.map(agent_kernel_api::format_rfc3339_ms),
            })
        })
        .collect();
    axum::Json(json!({
        "saga_id": preview.saga_id,
        "state": preview.state,
        "undoable": preview.undoable(false),
        "refused": preview.refused,
        "steps": steps,
    }))
    .into_response()
}

/// The audit chain's last check by this console: when, and what it found.
#[derive(Debug, Clone)]
pub(crate) struct AuditCheck {
    /// When it ran, in ms since the Unix epoch.
    pub(crate) at_ms: i64,
    /// How many records it checked (`None`: the log predates the chain).
    pub(crate) n_records: Option<u64>,
    /// The first bad record and why (`None`: intact).
    pub(crate) first_bad: Option<(u64, String)>,
}

impl Console {
    /// The kernel that compensates, or the refusal of a console started without a policy.
    fn compensating(&self, json: bool) -> Result<&Arc<Kernel>, Box<Response>> {
        self.compensating.as_ref().ok_or_else(|| {
            Box::new(refusal(
                json,
                StatusCode::CONFLICT,
                "this console was started without a sandbox policy, so it cannot compensate: restart it with --sandbox and the policy the sagas ran under; nothing was done",
            ))
        })
    }

    /// The audit records about `saga_id`, oldest first (at most [`SAGA_AUDIT_RECORDS`]),
    /// read from the log's file on the outside thread; on PostgreSQL, or when they cannot
    /// be read, why not.
    async fn saga_audit_records(
        &self,
        saga_id: &SagaId,
    ) -> Result<Vec<agent_kernel_txlog::AuditRecord>, String> {
        if agent_kernel::is_postgres(&self.db) {
            return Err(
                "the audit records of a PostgreSQL log are read with `agent-kernel audit verify` only so far"
                    .to_owned(),
            );
        }
        let query = agent_kernel_txlog::AuditQuery {
            saga_id: Some(saga_id.as_str().to_owned()),
            limit: SAGA_AUDIT_RECORDS,
            ..agent_kernel_txlog::AuditQuery::default()
        };
        let db = self.db.clone();
        let records = self
            .outside
            .run(async move { operator::audit_records(&db, query).await })
            .await
            .and_then(|records| records)
            .map_err(|error| format!("cannot read its audit records: {error}"))?;
        Ok(records.into_iter().rev().collect())
    }

    fn remember(&self, check: AuditCheck) {
        if let Ok(mut last) = self.last_check.lock() {
            *last = Some(check);
        }
    }

    /// What a compensating action takes first, as `undo` and `dlq retry` do: the operator
    /// lock of the log (one compensating action at a time, this console's or a command
    /// line's), then the audit chain's word for the undo records it acts on.
    async fn before_compensating(&self, json: bool) -> Result<OperatorLock, Response> {
        let db = self.db.clone();
        let lock = self
            .outside
            .run(async move { OperatorLock::acquire(&db, operator::OPERATOR_LOCK_WAIT).await })
            .await
            .and_then(|locked| locked)
            .map_err(|error| match error {
                // Another action holds it: that is a conflict, not bad input.
                KernelError::InvalidRequest(message) => {
                    refusal(json, StatusCode::CONFLICT, &message)
                }
                error => failed(json, &error),
            })?;
        let (db, key) = (self.db.clone(), self.audit_key.clone());
        let vouched = self
            .outside
            .run(async move { operator::vouch_for_log(&db, key).await })
            .await
            .and_then(|vouched| vouched);
        let at_ms = SystemClock.now_ms();
        match vouched {
            Ok(operator::Vouched::Intact) => Ok(lock),
            Ok(operator::Vouched::PredatesChain) => {
                self.remember(AuditCheck {
                    at_ms,
                    n_records: None,
                    first_bad: None,
                });
                Ok(lock)
            }
            Err(KernelError::Tampered { seq, reason }) => {
                self.remember(AuditCheck {
                    at_ms,
                    n_records: None,
                    first_bad: Some((seq, reason.clone())),
                });
                Err(refusal(
                    json,
                    StatusCode::CONFLICT,
                    &format!(
                        "the log failed its audit check at record {seq}: {reason}; nothing was done, since its undo records cannot be trusted (see Audit, or `agent-kernel audit verify`)"
                    ),
                ))
            }
            Err(error) => Err(failed(json, &error)),
        }
    }
}

/// Whether a form's checkbox or a JSON boolean field is set.
fn flag(fields: &Fields, name: &str) -> bool {
    fields
        .get(name)
        .is_some_and(|value| matches!(value.as_str(), "true" | "on" | "1" | "yes"))
}

/// `POST /sagas/ID/undo` (`reason`, `force`): the saga undone as `undo --saga ID` does,
/// recorded as the console's operator; answers its record as `log --saga ID --json`.
async fn undo(
    State(console): State<Shared>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    axum::Extension(fields): axum::Extension<Fields>,
) -> Response {
    let json = wants_json(&headers);
    let Some(reason) = fields.get("reason") else {
        return refusal(
            json,
            StatusCode::UNPROCESSABLE_ENTITY,
            "an undo needs a reason (field `reason`); nothing was undone",
        );
    };
    let kernel = match console.compensating(json) {
        Ok(kernel) => kernel,
        Err(refused) => return *refused,
    };
    let _lock = match console.before_compensating(json).await {
        Ok(lock) => lock,
        Err(refused) => return refused,
    };
    let saga_id = SagaId::new(id);
    let request = agent_kernel::UndoRequest {
        reason,
        force: flag(&fields, "force"),
        by: console.operator.clone(),
    };
    match operator::undo(kernel, &saga_id, &request, &agent_kernel::NoObserver).await {
        Ok(report) => console
            .events
            .send(json!({"type": "saga", "saga_id": saga_id, "state": report.state})),
        Err(error) => return failed(json, &error),
    }
    if !json {
        return Redirect::to(&format!("/sagas/{}", saga_path(&saga_id))).into_response();
    }
    match operator::saga(console.kernel.log().as_ref(), &saga_id).await {
        Ok(record) => axum::Json(saga_record_document(&record)).into_response(),
        Err(error) => failed(json, &error),
    }
}

/// A saga id as a path segment.
fn saga_path(saga_id: &SagaId) -> String {
    url::form_urlencoded::byte_serialize(saga_id.as_str().as_bytes()).collect()
}

/// `POST /dead-letters/ID/retry` (`force`): the compensation tried again now, as `dlq retry
/// ID` does; `{"id", "status", "saga_state", "detail"}`, the status `retried` when it was
/// compensated, still `open` when it failed again.
async fn retry(
    State(console): State<Shared>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    axum::Extension(fields): axum::Extension<Fields>,
    axum::Extension(access): axum::Extension<Access>,
) -> Response {
    let json = wants_json(&headers);
    let kernel = match console.compensating(json) {
        Ok(kernel) => kernel,
        Err(refused) => return *refused,
    };
    let _lock = match console.before_compensating(json).await {
        Ok(lock) => lock,
        Err(refused) => return refused,
    };
    let request = operator::RetryRequest {
        letter_id: id,
        force: flag(&fields, "force"),
        by: console.operator.clone(),
    };
    match operator::retry_dead_letter(kernel, &request).await {
        Ok(outcome) if json => axum::Json(json!({
            "id": outcome.letter.letter_id,
            "status": outcome.letter.status,
            "saga_state": outcome.saga_state,
            "detail": outcome.detail,
        }))
        .into_response(),
        Ok(outcome) => Html(pages::retried(&outcome, access.csrf()).into_string()).into_response(),
        Err(error) => failed(json, &error),
    }
}

/// `POST /audit/verify`: the whole audit chain checked now (`audit verify --json`).
async fn verify(
    State(console): State<Shared>,
    headers: HeaderMap,
    axum::Extension(access): axum::Extension<Access>,
) -> Response {
    let json = wants_json(&headers);
    let (db, key) = (console.db.clone(), console.audit_key.clone());
    let report = match console
        .outside
        .run(async move { operator::verify(&db, key).await })
        .await
        .and_then(|report| report)
    {
        Ok(report) => report,
        Err(error) => return failed(json, &error),
    };
    console.remember(AuditCheck {
        at_ms: SystemClock.now_ms(),
        n_records: Some(report.n_records),
        first_bad: report
            .first_bad
            .as_ref()
            .map(|bad| (bad.seq, bad.reason.clone())),
    });
    if json {
        return axum::Json(crate::audit::report_document(&report)).into_response();
    }
    Html(pages::audit(&report, access.csrf()).into_string()).into_response()
}
