//! `http.get` against real servers on the loopback interface.
//!
//! No test sends a DNS query or reaches beyond loopback: every tool resolves names from a
//! fixed map (an allowed name points at a test server), and every address used is 127.0.0.x.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_kernel_api::{DynTool, Settlement, ToolEntry, ToolError, ToolOutput, Undo};
use agent_kernel_sandbox::{HttpSandbox, Policy};
use agent_kernel_tools::{HTTP_GET_REDIRECTS_MAX, HttpGet};
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::{Fixture, ctx};

/// A test server: answers by path, counts and records every request it sees.
struct Server {
    addr: SocketAddr,
    state: Arc<ServerState>,
}

#[derive(Default)]
struct ServerState {
    n_requests: AtomicUsize,
    paths: Mutex<Vec<String>>,
    /// Path → `Location` of a 302 answer.
    redirects: HashMap<String, String>,
}

impl Server {
    async fn start(ip: &str) -> Server {
        Server::with_redirects(ip, HashMap::new()).await
    }

    async fn with_redirects(ip: &str, redirects: HashMap<String, String>) -> Server {
        let listener = TcpListener::bind((ip, 0))
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("local address");
        let state = Arc::new(ServerState {
            redirects,
            ..ServerState::default()
        });
        let app = Router::new()
            .fallback(answer)
            .with_state(Arc::clone(&state));
        tokio::spawn(async move {
            axum::serve(listener, app).await.expect("serve");
        });
        Server { addr, state }
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn n_requests(&self) -> usize {
        self.state.n_requests.load(Ordering::SeqCst)
    }

    fn paths(&self) -> Vec<String> {
        self.state.paths.lock().expect("paths").clone()
    }
}

async fn answer(State(state): State<Arc<ServerState>>, uri: Uri) -> Response {
    state.n_requests.fetch_add(1, Ordering::SeqCst);
    let path = uri.path().to_owned();
    state.paths.lock().expect("paths").push(path.clone());
    if let Some(location) = state.redirects.get(&path) {
        return (StatusCode::FOUND, [(header::LOCATION, location.clone())]).into_response();
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["ok"] => (
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "hello",
        )
            .into_response(),
        ["bytes"] => (
            [(header::CONTENT_TYPE, "application/octet-stream")],
            vec![0xff_u8, 0x00, 0xfe, 0x41],
        )
            .into_response(),
        ["big", n] => {
            let n: usize = n.parse().expect("a size");
            Body::from(vec![b'a'; n]).into_response()
        }
        ["status", code] => {
            let code: u16 = code.parse().expect("a status");
            StatusCode::from_u16(code)
                .expect("a valid status")
                .into_response()
        }
        ["chain", n] => {
            let n: usize = n.parse().expect("a count");
            if n == 0 {
                "end".into_response()
            } else {
                (
                    StatusCode::FOUND,
                    [(header::LOCATION, format!("/chain/{}", n - 1))],
                )
                    .into_response()
            }
        }
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

/// A bare HTTP/1.1 server that answers every request with a chunked body of `n_chunks` chunks
/// of `chunk_bytes` bytes, slowly, without `Content-Length`.
/// It counts the chunks it wrote and notes when the client hung up before the end.
struct ChunkedServer {
    addr: SocketAddr,
    n_written: Arc<AtomicUsize>,
    hung_up: Arc<AtomicBool>,
}

impl ChunkedServer {
    async fn start(n_chunks: usize, chunk_bytes: usize) -> ChunkedServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let n_written = Arc::new(AtomicUsize::new(0));
        let hung_up = Arc::new(AtomicBool::new(false));
        let (written, hang_up) = (Arc::clone(&n_written), Arc::clone(&hung_up));
        tokio::spawn(async move {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let mut head = Vec::new();
            let mut buf = [0_u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let start = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n";
            let chunk = format!("{chunk_bytes:x}\r\n{}\r\n", "b".repeat(chunk_bytes));
            if stream.write_all(start).await.is_err() {
                hang_up.store(true, Ordering::SeqCst);
                return;
            }
            for _ in 0..n_chunks {
                if stream.write_all(chunk.as_bytes()).await.is_err() {
                    hang_up.store(true, Ordering::SeqCst);
                    return;
                }
                written.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let _ = stream.write_all(b"0\r\n\r\n").await;
        });
        ChunkedServer {
            addr,
            n_written,
            hung_up,
        }
    }
}

fn http_sandbox(allow_domains: &str, max_response_bytes: u64) -> Arc<HttpSandbox> {
    let policy = Policy::from_toml_str(
        &format!(
            "[http]\nallow_domains = {allow_domains}\nmax_response_bytes = {max_response_bytes}\n"
        ),
        Path::new("."),
    )
    .expect("policy");
    Arc::new(HttpSandbox::new(&policy))
}

/// `http.get` under `allow_domains`, resolving names from `names` only (no DNS).
fn tool_with(allow_domains: &str, names: &[(&str, &str)]) -> Arc<dyn DynTool> {
    tool_with_limit(allow_domains, names, 1024 * 1024)
}

fn tool_with_limit(
    allow_domains: &str,
    names: &[(&str, &str)],
    max_response_bytes: u64,
) -> Arc<dyn DynTool> {
    let overrides: HashMap<String, Vec<IpAddr>> = names
        .iter()
        .map(|(name, ip)| ((*name).to_owned(), vec![ip.parse().expect("an address")]))
        .collect();
    ToolEntry::new(HttpGet::with_resolver_overrides(
        http_sandbox(allow_domains, max_response_bytes),
        overrides,
    ))
    .into_dyn()
}

fn dyn_tool(tool: HttpGet) -> Arc<dyn DynTool> {
    ToolEntry::new(tool).into_dyn()
}

async fn get(tool: &Arc<dyn DynTool>, url: &str) -> Result<ToolOutput, ToolError> {
    tool.execute(&ctx("http.get", 0), &json!({ "url": url }))
        .await
}

#[track_caller]
fn assert_denied(result: &Result<ToolOutput, ToolError>, url: &str) -> String {
    match result {
        Err(error) if error.is_denied() => {
            assert!(!error.is_uncertain(), "{url}: {error}");
            error.message().to_owned()
        }
        other => panic!("{url}: expected a denial, got {other:?}"),
    }
}

#[tokio::test]
async fn allowed_fetch_returns_the_body() {
    let server = Server::start("127.0.0.1").await;
    let tool = tool_with(r#"["127.0.0.1"]"#, &[]);
    assert_eq!(tool.id(), "http.get");
    assert!(tool.idempotent());
    assert_eq!(tool.settlement(), Settlement::Compensate);
    let url = server.url("/ok");
    let args = json!({ "url": url });
    let ctx = ctx("http.get", 0);
    tool.check(&args).expect("check passes");
    let undo = tool.prepare(&ctx, &args).await.expect("prepare");
    assert!(undo.is_none());
    assert_eq!(server.n_requests(), 0, "check and prepare send nothing");
    let output = tool.execute(&ctx, &args).await.expect("fetched");
    assert_eq!(
        output.data,
        json!({
            "url": url,
            "status": 200,
            "bytes": 5,
            "content_type": "text/plain; charset=utf-8",
            "body": "hello",
        })
    );
    assert_eq!(output.effects, [format!("fetched 5 bytes from {url}")]);
    tool.compensate(&ctx, &args, &Undo::none(), Some(&output))
        .await
        .expect("nothing to undo");
    tool.compensate(&ctx, &args, &Undo::none(), None)
        .await
        .expect("nothing to undo");
    assert_eq!(server.paths(), ["/ok"]);

    // The decimal notation of a listed address is that address.
    let output = get(&tool, &format!("http://2130706433:{}/ok", server.port()))
        .await
        .expect("fetched");
    assert_eq!(output.data["body"], "hello");
    assert_eq!(
        output.data["url"],
        format!("http://127.0.0.1:{}/ok", server.port())
    );
}

#[tokio::test]
async fn a_body_that_is_not_utf8_comes_as_base64() {
    let server = Server::start("127.0.0.1").await;
    let tool = tool_with(r#"["127.0.0.1"]"#, &[]);
    let output = get(&tool, &server.url("/bytes")).await.expect("fetched");
    assert_eq!(output.data["bytes"], 4);
    assert_eq!(output.data["body_base64"], "/wD+QQ==");
    assert!(output.data.get("body").is_none());
    assert_eq!(output.data["content_type"], "application/octet-stream");
}

#[tokio::test]
async fn redirects_within_the_policy_are_followed() {
    let server = Server::start("127.0.0.1").await;
    let tool = tool_with(r#"["127.0.0.1"]"#, &[]);
    let output = get(
        &tool,
        &server.url(&format!("/chain/{HTTP_GET_REDIRECTS_MAX}")),
    )
    .await
    .expect("fetched");
    assert_eq!(output.data["body"], "end");
    assert_eq!(output.data["url"], server.url("/chain/0"));
    assert_eq!(server.n_requests(), HTTP_GET_REDIRECTS_MAX + 1);
}

#[tokio::test]
async fn a_redirect_chain_longer_than_the_limit_is_denied() {
    let server = Server::start("127.0.0.1").await;
    let tool = tool_with(r#"["127.0.0.1"]"#, &[]);
    let start = HTTP_GET_REDIRECTS_MAX + 1;
    let url = server.url(&format!("/chain/{start}"));
    let message = assert_denied(&get(&tool, &url).await, &url);
    assert!(message.contains("redirects more than 5 times"), "{message}");
    // The first request and the redirects allowed; the one past the limit is never sent.
    assert_eq!(server.n_requests(), HTTP_GET_REDIRECTS_MAX + 1);
    assert!(!server.paths().contains(&"/chain/0".to_owned()));
}

#[tokio::test]
async fn a_redirect_to_an_unlisted_host_is_denied_before_it_is_sent() {
    let target = Server::start("127.0.0.1").await;
    let redirects = HashMap::from([
        (
            "/to-localhost".to_owned(),
            format!("http://localhost:{}/target", target.port()),
        ),
        (
            "/to-name".to_owned(),
            format!("http://evil.example:{}/target", target.port()),
        ),
    ]);
    let origin = Server::with_redirects("127.0.0.1", redirects).await;
    // `localhost` resolves to the target, were it ever asked.
    let tool = tool_with(
        r#"["127.0.0.1"]"#,
        &[("localhost", "127.0.0.1"), ("evil.example", "127.0.0.1")],
    );
    for path in ["/to-localhost", "/to-name"] {
        let url = origin.url(path);
        let message = assert_denied(&get(&tool, &url).await, &url);
        assert!(message.contains("redirect 1 from"), "{message}");
        assert!(
            message.contains("is not in [http] allow_domains"),
            "{message}"
        );
    }
    assert_eq!(origin.n_requests(), 2);
    assert_eq!(target.n_requests(), 0, "the redirect target saw a request");
}

#[tokio::test]
async fn a_redirect_to_an_unlisted_address_is_denied_before_it_is_sent() {
    // 127.0.0.2 is loopback too (Linux routes all of 127/8 to `lo`), but not listed.
    let target = Server::start("127.0.0.2").await;
    let port = target.port();
    let redirects = HashMap::from([
        ("/a".to_owned(), format!("http://127.0.0.2:{port}/target")),
        ("/b".to_owned(), format!("http://2130706434:{port}/target")),
        ("/c".to_owned(), format!("http://0x7f.0.0.2:{port}/target")),
        (
            "/d".to_owned(),
            format!("http://[::ffff:127.0.0.2]:{port}/"),
        ),
    ]);
    let origin = Server::with_redirects("127.0.0.1", redirects).await;
    let tool = tool_with(r#"["127.0.0.1"]"#, &[]);
    for path in ["/a", "/b", "/c", "/d"] {
        let url = origin.url(path);
        let message = assert_denied(&get(&tool, &url).await, &url);
        assert!(message.contains("127.0.0.2 (loopback)"), "{message}");
    }
    assert_eq!(target.n_requests(), 0, "the redirect target saw a request");
}

#[tokio::test]
async fn a_redirect_to_another_scheme_is_denied() {
    let target = Server::start("127.0.0.1").await;
    let port = target.port();
    let redirects = HashMap::from([
        ("/ftp".to_owned(), format!("ftp://127.0.0.1:{port}/")),
        (
            "/gopher".to_owned(),
            format!("gopher://127.0.0.1:{port}/_x"),
        ),
        ("/file".to_owned(), "file:///etc/passwd".to_owned()),
        ("/data".to_owned(), "data:text/plain,hello".to_owned()),
        ("/ws".to_owned(), format!("ws://127.0.0.1:{port}/")),
        (
            "/creds".to_owned(),
            format!("http://user:pass@127.0.0.1:{port}/"),
        ),
    ]);
    let origin = Server::with_redirects("127.0.0.1", redirects).await;
    let tool = tool_with(r#"["127.0.0.1"]"#, &[]);
    for path in ["/ftp", "/gopher", "/file", "/data", "/ws", "/creds"] {
        let url = origin.url(path);
        let message = assert_denied(&get(&tool, &url).await, &url);
        assert!(message.contains("redirect"), "{message}");
    }
    assert_eq!(target.n_requests(), 0, "the redirect target saw a request");
}

#[tokio::test]
async fn an_allowed_name_that_resolves_to_loopback_is_denied_unless_the_address_is_listed() {
    let server = Server::start("127.0.0.1").await;
    let url = format!("http://allowed.example:{}/ok", server.port());
    let names = [("allowed.example", "127.0.0.1")];

    let tool = tool_with(r#"["allowed.example"]"#, &names);
    tool.check(&json!({ "url": url }))
        .expect("the URL alone is allowed");
    let message = assert_denied(&get(&tool, &url).await, &url);
    assert!(
        message.contains("request to `allowed.example` denied"),
        "{message}"
    );
    assert!(message.contains("127.0.0.1 (loopback)"), "{message}");
    assert_eq!(server.n_requests(), 0, "a denied address was connected to");

    let tool = tool_with(r#"["allowed.example", "127.0.0.1"]"#, &names);
    let output = get(&tool, &url).await.expect("listed address");
    assert_eq!(output.data["body"], "hello");
    assert_eq!(server.n_requests(), 1);
}

#[tokio::test]
async fn a_listed_localhost_may_reach_loopback() {
    let server = Server::start("127.0.0.1").await;
    let url = format!("http://localhost:{}/ok", server.port());
    let tool = tool_with(r#"["localhost"]"#, &[("localhost", "127.0.0.1")]);
    let output = get(&tool, &url).await.expect("localhost is listed");
    assert_eq!(output.data["body"], "hello");
    // But not some other name pointing at loopback.
    let tool = tool_with(
        r#"["localhost", "other.example"]"#,
        &[("other.example", "127.0.0.1")],
    );
    let other = format!("http://other.example:{}/ok", server.port());
    assert_denied(&get(&tool, &other).await, &other);
    assert_eq!(server.n_requests(), 1);
}

#[tokio::test]
async fn a_response_over_the_limit_is_denied() {
    let server = Server::start("127.0.0.1").await;
    let tool = tool_with_limit(r#"["127.0.0.1"]"#, &[], 1000);
    let output = get(&tool, &server.url("/big/1000"))
        .await
        .expect("at the limit");
    assert_eq!(output.data["bytes"], 1000);
    let url = server.url("/big/1001");
    let message = assert_denied(&get(&tool, &url).await, &url);
    assert!(message.contains("at least 1001 bytes"), "{message}");
    assert!(message.contains("max_response_bytes"), "{message}");

    // Without Content-Length, reading stops at the limit and the connection is closed.
    let n_chunks = 5000;
    let stream = ChunkedServer::start(n_chunks, 256).await;
    let url = format!("http://{}/stream", stream.addr);
    let message = assert_denied(&get(&tool, &url).await, &url);
    assert!(
        message.contains("exceeds the limit of 1000 bytes"),
        "{message}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !stream.hung_up.load(Ordering::SeqCst) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        stream.hung_up.load(Ordering::SeqCst),
        "the client kept the connection open after the denial"
    );
    assert!(stream.n_written.load(Ordering::SeqCst) < n_chunks);
}

#[tokio::test]
async fn error_statuses_are_failures_naming_the_status() {
    let server = Server::start("127.0.0.1").await;
    let tool = tool_with(r#"["127.0.0.1"]"#, &[]);
    for (code, retriable) in [
        (404, false),
        (403, false),
        (429, true),
        (500, true),
        (503, true),
    ] {
        let error = get(&tool, &server.url(&format!("/status/{code}")))
            .await
            .expect_err("an error status");
        assert!(!error.is_denied(), "{error}");
        assert!(!error.is_uncertain(), "{error}");
        assert_eq!(error.is_retriable(), retriable, "{code}: {error}");
        assert!(error.message().contains(&code.to_string()), "{error}");
    }
}

#[tokio::test]
async fn connection_failures_are_retriable_and_certain() {
    // A port nobody listens on: bind, note it, close.
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        listener.local_addr().expect("address").port()
    };
    let tool = tool_with(r#"["127.0.0.1", "unknown.example"]"#, &[]);
    let error = get(&tool, &format!("http://127.0.0.1:{port}/"))
        .await
        .expect_err("refused");
    assert!(!error.is_denied(), "{error}");
    assert!(!error.is_uncertain(), "{error}");
    assert!(error.is_retriable(), "{error}");
    // A name the resolver does not know fails the same way, without any DNS query.
    let error = get(&tool, &format!("http://unknown.example:{port}/"))
        .await
        .expect_err("unresolvable");
    assert!(!error.is_denied(), "{error}");
    assert!(error.message().contains("does not resolve"), "{error}");
}

#[tokio::test]
async fn without_an_http_section_everything_is_denied() {
    let server = Server::start("127.0.0.1").await;
    let fixture = Fixture::new();
    let tool = fixture.tool("http.get");
    let url = server.url("/ok");
    let error = tool.check(&json!({ "url": url })).expect_err("denied");
    assert!(error.is_denied());
    assert!(
        error.message().contains("no network access is allowed"),
        "{error}"
    );
    assert_denied(&get(&tool, &url).await, &url);
    assert_eq!(server.n_requests(), 0);
}

#[test]
fn arguments_are_checked() {
    let tool = tool_with(r#"["example.com"]"#, &[]);
    let invalid = |args: Value| {
        let error = tool.check(&args).expect_err("invalid");
        assert!(error.is_invalid_args(), "{error}");
        error.message().to_owned()
    };
    assert!(invalid(json!({ "uri": "http://example.com/" })).contains("unknown field `uri`"));
    assert!(invalid(json!({})).contains("missing field `url`"));
    assert!(invalid(json!({ "url": 5 })).contains("invalid type"));
    assert!(invalid(json!({ "url": "example.com" })).contains("invalid URL"));
    assert!(invalid(json!({ "url": "http://256.1.1.1/" })).contains("invalid URL"));
    tool.check(&json!({ "url": "https://example.com/a" }))
        .expect("allowed");
    let schema = tool.args_schema();
    assert_eq!(schema["required"], json!(["url"]));
    assert_eq!(schema["additionalProperties"], false);
}

/// Hostile URL forms aimed at a canary server on 127.0.0.1: every one is denied, through the
/// real tool, and the canary never sees a request.
#[tokio::test]
async fn hostile_urls_never_reach_the_canary() {
    let canary = Server::start("127.0.0.1").await;
    let p = canary.port();
    // Allowed names all point at the canary, so only the address check stands in the way.
    let tool = tool_with(
        r#"["allowed.example", "*.example.com"]"#,
        &[
            ("allowed.example", "127.0.0.1"),
            ("a.example.com", "127.0.0.1"),
            ("deep.a.example.com", "::ffff:127.0.0.1"),
            ("zero.example.com", "0.0.0.0"),
            ("meta.example.com", "169.254.169.254"),
            ("v6.example.com", "::1"),
            ("example.com", "127.0.0.1"),
            ("localhost", "127.0.0.1"),
        ],
    );
    let hostile = [
        // Every IPv4 notation of 127.0.0.1.
        format!("http://127.0.0.1:{p}/"),
        format!("http://2130706433:{p}/"),
        format!("http://0x7f000001:{p}/"),
        format!("http://0x7F.0x0.0x0.0x1:{p}/"),
        format!("http://0177.0.0.1:{p}/"),
        format!("http://0177.0000.0000.0001:{p}/"),
        format!("http://017700000001:{p}/"),
        format!("http://127.1:{p}/"),
        format!("http://127.0.1:{p}/"),
        format!("http://0x7f.1:{p}/"),
        format!("http://127.0.0.1.:{p}/"),
        format!("http://%31%32%37.0.0.1:{p}/"),
        // IPv6 loopback and IPv4-mapped forms.
        format!("http://[::1]:{p}/"),
        format!("http://[0:0:0:0:0:0:0:1]:{p}/"),
        format!("http://[::ffff:127.0.0.1]:{p}/"),
        format!("http://[::ffff:7f00:1]:{p}/"),
        format!("http://[::127.0.0.1]:{p}/"),
        // Credentials that make the allowed name the user, not the host.
        format!("http://allowed.example@127.0.0.1:{p}/"),
        format!("http://allowed.example:80@127.0.0.1:{p}/"),
        format!("http://allowed.example%40@127.0.0.1:{p}/"),
        format!("http://user:pass@allowed.example:{p}/"),
        // Allowed names, in any spelling, resolving to special addresses.
        format!("http://allowed.example:{p}/"),
        format!("http://ALLOWED.Example.:{p}/"),
        format!("http://allowed%2Eexample:{p}/"),
        format!("http://a.example.com:{p}/"),
        format!("http://deep.a.example.com:{p}/"),
        format!("http://zero.example.com:{p}/"),
        format!("http://meta.example.com:{p}/"),
        format!("http://v6.example.com:{p}/"),
        // Suffix confusion and look-alikes.
        format!("http://example.com:{p}/"),
        format!("http://evilexample.com:{p}/"),
        format!("http://example.com.evil:{p}/"),
        format!("http://allowed.example.evil:{p}/"),
        format!("http://evilallowed.example:{p}/"),
        format!("http://allowed.example..:{p}/"),
        format!("http://аllowed.example:{p}/"),
        format!("http://xn--llowed-2nf.example:{p}/"),
        format!("http://a.ехample.com:{p}/"),
        // localhost, however written.
        format!("http://localhost:{p}/"),
        format!("http://LOCALHOST:{p}/"),
        format!("http://localhost.:{p}/"),
        format!("http://foo.localhost:{p}/"),
        // Unspecified, metadata and private addresses.
        format!("http://0.0.0.0:{p}/"),
        format!("http://0:{p}/"),
        format!("http://[::]:{p}/"),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        "http://[fd00::1]/".to_owned(),
        "http://10.0.0.1/".to_owned(),
        // Other schemes.
        format!("https://127.0.0.1:{p}/"),
        "file:///etc/passwd".to_owned(),
        format!("ftp://127.0.0.1:{p}/"),
        format!("gopher://127.0.0.1:{p}/_GET%20/"),
        "data:text/plain,hello".to_owned(),
        "javascript:alert(1)".to_owned(),
        format!("ws://127.0.0.1:{p}/"),
        format!("dict://127.0.0.1:{p}/"),
    ];
    assert!(hostile.len() >= 30);
    for url in &hostile {
        let result = get(&tool, url).await;
        assert_denied(&result, url);
    }
    assert_eq!(
        canary.n_requests(),
        0,
        "the canary saw requests: {:?}",
        canary.paths()
    );
}

/// A loopback HTTPS server with a self-signed certificate for `names`: every request gets
/// 200 and the body `hello over tls`. Returns its port and the certificate (PEM).
async fn tls_server(names: &[&str]) -> (u16, String) {
    use tokio_rustls::rustls::ServerConfig;
    use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

    let rcgen::CertifiedKey { cert, signing_key } = rcgen::generate_simple_self_signed(
        names
            .iter()
            .map(|name| (*name).to_owned())
            .collect::<Vec<_>>(),
    )
    .expect("a certificate");
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(signing_key.serialize_der()));
    let config = ServerConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_no_client_auth()
    .with_single_cert(vec![cert.der().clone()], key)
    .expect("a server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // A client that refuses the certificate ends the handshake: not an error here.
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                let mut request = Vec::new();
                let mut buffer = [0_u8; 1024];
                while !request.windows(4).any(|window| window == b"\r\n\r\n") {
                    match tls.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                }
                let body = "hello over tls";
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(response.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (port, cert.pem())
}

/// `http.get` allowed to reach `localhost` (resolved to 127.0.0.1 without DNS).
fn localhost_tool() -> HttpGet {
    HttpGet::with_resolver_overrides(
        http_sandbox(r#"["localhost"]"#, 1024 * 1024),
        HashMap::from([(
            "localhost".to_owned(),
            vec!["127.0.0.1".parse().expect("ip")],
        )]),
    )
}

#[tokio::test]
async fn https_verifies_the_server_certificate_and_its_name() {
    let (port, pem) = tls_server(&["localhost"]).await;
    let url = format!("https://localhost:{port}/secure");

    // Trusted, and for the right name: fetched.
    let trusted = dyn_tool(
        localhost_tool()
            .trusting_only(pem.as_bytes())
            .expect("a PEM"),
    );
    let output = get(&trusted, &url).await.expect("fetched over TLS");
    assert_eq!(output.data["status"], 200);
    assert_eq!(output.data["body"], "hello over tls");
    assert_eq!(output.data["url"], url.as_str());

    // The platform's trust store does not know a self-signed certificate: refused, and the
    // failure is the certificate's, not a denial.
    let platform = dyn_tool(localhost_tool());
    let error = get(&platform, &url).await.expect_err("untrusted");
    assert!(!error.is_denied(), "{error}");
    assert!(!error.is_uncertain(), "{error}");
    assert!(
        error.message().to_lowercase().contains("certificate"),
        "{error}"
    );

    // Trusted, but issued for another name: refused.
    let (other_port, other_pem) = tls_server(&["other.test"]).await;
    let wrong_name = dyn_tool(
        localhost_tool()
            .trusting_only(other_pem.as_bytes())
            .expect("a PEM"),
    );
    let error = get(&wrong_name, &format!("https://localhost:{other_port}/"))
        .await
        .expect_err("wrong name");
    assert!(!error.is_denied(), "{error}");
    assert!(
        error.message().to_lowercase().contains("certificate"),
        "{error}"
    );

    // What is not a PEM certificate is refused when the tool is built.
    assert!(
        localhost_tool()
            .trusting_only(b"not a certificate")
            .is_err()
    );
}
