//! `agent-kernel serve`: the operator console, a web server on loopback whose pages and
//! JSON answers are the operator actions of the command line (`agent_kernel::operator`).
//!
//! Every route but `GET /healthz`, `GET /login` and `POST /login` needs the token: a bearer
//! header (scripts), or the session cookie the login form sets (browsers), whose POSTs also
//! carry the session's CSRF token. A POST from another site is refused whatever it carries.

mod actions;
mod auth;
mod events;
mod outside;
mod pages;
mod tls;
mod views;

use std::collections::HashMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent_kernel::{AuditKey, Kernel, KernelError};
use agent_kernel_api::{SagaId, TxError};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use self::actions::AuditCheck;
use self::auth::{Access, Gate, SESSION_COOKIE, SESSION_TTL, TOKEN_MIN_CHARS};
use self::outside::Outside;
use crate::Compensation;
use crate::args::{Cli, ServeArgs};
use crate::output::Output;
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
        .route("/", get(views::overview))
        .route("/approvals", get(views::approvals))
        .route("/approvals/{id}/approve", post(actions::approve))
        .route("/approvals/{id}/reject", post(actions::reject))
        .route("/sagas", get(views::sagas))
        .route("/sagas/{id}", get(views::saga))
        .route(
            "/sagas/{id}/undo",
            get(views::undo_preview).post(actions::undo),
        )
        .route("/sagas/{id}/audit", get(views::saga_audit))
        .route("/dead-letters", get(views::dead_letters))
        .route("/dead-letters/{id}/retry", post(actions::retry))
        .route("/dead-letters/{id}/resolve", post(actions::resolve))
        .route("/audit/verify", post(actions::verify))
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

    /// Field `name`, or the refusal (422) that says it is missing with `message`.
    fn required(&self, json: bool, name: &str, message: &str) -> Result<String, Refused> {
        self.get(name)
            .ok_or_else(|| refused(json, StatusCode::UNPROCESSABLE_ENTITY, message))
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
        | KernelError::HolderGone { .. }
        | KernelError::DeadLetterClosed { .. }
        | KernelError::UndoRefused { .. }
        | KernelError::TakenOver(_)
        | KernelError::SagaBusy { .. }
        | KernelError::Tampered { .. } => StatusCode::CONFLICT,
        KernelError::OperatorKeyRequired(_) | KernelError::OperatorKeyMismatch(_) => {
            StatusCode::FORBIDDEN
        }
        KernelError::InvalidRequest(_) => StatusCode::UNPROCESSABLE_ENTITY,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    refusal(json, status, &error.to_string())
}

/// A refusal ready to send: what a route's `?` returns early.
pub(crate) struct Refused(Box<Response>);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        *self.0
    }
}

/// What a route answers: its response, or a refusal.
type Answer = Result<Response, Refused>;

/// [`refusal`], to return early.
fn refused(json: bool, status: StatusCode, message: &str) -> Refused {
    Refused(Box::new(refusal(json, status, message)))
}

/// An operator action's error as the route's refusal ([`failed`]).
trait Refuse<T> {
    fn refuse(self, json: bool) -> Result<T, Refused>;
}

impl<T> Refuse<T> for Result<T, KernelError> {
    fn refuse(self, json: bool) -> Result<T, Refused> {
        self.map_err(|error| Refused(Box::new(failed(json, &error))))
    }
}

impl<T> Refuse<T> for Result<T, TxError> {
    fn refuse(self, json: bool) -> Result<T, Refused> {
        self.map_err(KernelError::Log).refuse(json)
    }
}

/// The saga a path names, or 404 for an empty id (`/sagas//undo`), which names none.
fn saga_id_of(json: bool, id: String) -> Result<SagaId, Refused> {
    if id.trim().is_empty() {
        return Err(refused(
            json,
            StatusCode::NOT_FOUND,
            "no saga has an empty id",
        ));
    }
    Ok(SagaId::new(id))
}

/// A route the console does not have.
async fn not_found(headers: HeaderMap) -> Response {
    refusal(
        wants_json(&headers),
        StatusCode::NOT_FOUND,
        "the console has no such page",
    )
}
