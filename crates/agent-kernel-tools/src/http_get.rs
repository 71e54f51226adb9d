//! `http.get`: fetches a URL the `[http]` policy allows, ruling again on every redirect hop and
//! on every address a name resolves to.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use agent_kernel_api::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec};
use agent_kernel_sandbox::{HttpSandbox, MAX_URL_BYTES};
use base64::Engine as _;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::header::{CONTENT_TYPE, LOCATION};
use reqwest::{StatusCode, redirect};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::common::{TOOL_VERSION, byte_count, object_schema, parse_args, sandbox_error};

/// The most redirects `http.get` follows for one request; one more is a denial.
pub const HTTP_GET_REDIRECTS_MAX: usize = 5;

/// How long `http.get` waits for a connection (DNS and TCP and TLS), in milliseconds.
pub const HTTP_GET_CONNECT_TIMEOUT_MS: u64 = 10_000;

/// How long one `http.get` may take in all, redirects and body included, in milliseconds.
pub const HTTP_GET_TIMEOUT_MS: u64 = 30_000;

/// The most addresses of one name that `http.get` considers; the rest are ignored.
pub const HTTP_GET_RESOLVED_ADDRS_MAX: usize = 16;

/// `http.get`: read-only; fetches `url` and returns
/// `{"url": <final url>, "status": n, "bytes": n, "content_type": <header or null>, "body": "<text>"}`,
/// with `body_base64` instead of `body` when the body is not UTF-8.
///
/// The [`HttpSandbox`] rules on the URL, on every redirect hop before it is followed (at most
/// [`HTTP_GET_REDIRECTS_MAX`]), and on every address a name resolves to before connecting, so
/// an allowed name that points at a loopback or private address gets nowhere unless the policy
/// lists that address.
/// The body is read in chunks and the request stops as soon as it exceeds
/// `max_response_bytes`.
///
/// Errors: a denial anywhere is [`ToolError::denied`]; a connection failure or a timeout is a
/// retriable definite failure (a GET changes nothing); a status other than 2xx is a definite
/// failure naming the status, retriable for 429 and 5xx.
/// No system proxy is used, no cookies are kept, no `Referer` is sent, and bodies are not
/// decompressed.
#[derive(Debug)]
pub struct HttpGet {
    sandbox: Arc<HttpSandbox>,
    resolver: Arc<GuardedResolver>,
    /// The only roots HTTPS servers are verified against, when set; the platform's
    /// otherwise.
    roots: Option<Vec<reqwest::Certificate>>,
    /// Built on first use, then shared by every call (it holds the connection pool).
    client: OnceLock<Result<reqwest::Client, String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UrlArgs {
    url: String,
}

impl HttpGet {
    /// The tool id.
    pub const ID: &'static str = "http.get";

    /// A tool confined by `sandbox`, resolving names with the system resolver.
    pub fn new(sandbox: Arc<HttpSandbox>) -> HttpGet {
        HttpGet::with_resolution(sandbox, Resolution::System)
    }

    /// A tool confined by `sandbox` that resolves names from `overrides` only (keys are
    /// compared lowercase, without a trailing dot); any other name does not resolve, and no
    /// DNS query is ever sent.
    ///
    /// For tests: it lets an allowed name resolve to a loopback test server. The addresses
    /// still go through [`HttpSandbox::check_resolved`].
    pub fn with_resolver_overrides(
        sandbox: Arc<HttpSandbox>,
        overrides: HashMap<String, Vec<IpAddr>>,
    ) -> HttpGet {
        let overrides = overrides
            .into_iter()
            .map(|(name, addrs)| (normalize_name(&name), addrs))
            .collect();
        HttpGet::with_resolution(sandbox, Resolution::Fixed(overrides))
    }

    fn with_resolution(sandbox: Arc<HttpSandbox>, resolution: Resolution) -> HttpGet {
        let resolver = Arc::new(GuardedResolver {
            sandbox: Arc::clone(&sandbox),
            resolution,
        });
        HttpGet {
            sandbox,
            resolver,
            roots: None,
            client: OnceLock::new(),
        }
    }

    /// The same tool, verifying HTTPS servers against the certificates of `pem_bundle`
    /// only (one or more PEM `CERTIFICATE` blocks), instead of the platform's trust store:
    /// for a private certificate authority, or a test server's own certificate.
    /// Host names are checked as always.
    ///
    /// # Errors
    ///
    /// [`ToolError::invalid_args`] when the bundle holds no certificate or one that does not
    /// parse.
    pub fn trusting_only(mut self, pem_bundle: &[u8]) -> Result<HttpGet, ToolError> {
        let roots = reqwest::Certificate::from_pem_bundle(pem_bundle).map_err(|error| {
            ToolError::invalid_args(format!("the trusted certificates cannot be read: {error}"))
        })?;
        if roots.is_empty() {
            return Err(ToolError::invalid_args(
                "the trusted certificates hold no PEM certificate",
            ));
        }
        self.roots = Some(roots);
        self.client = OnceLock::new();
        Ok(self)
    }

    fn client(&self) -> Result<&reqwest::Client, ToolError> {
        self.client
            .get_or_init(|| self.build_client())
            .as_ref()
            .map_err(|message| ToolError::failed(message.clone()))
    }

    fn build_client(&self) -> Result<reqwest::Client, String> {
        let sandbox = Arc::clone(&self.sandbox);
        let redirects = redirect::Policy::custom(move |attempt| {
            let previous = attempt.previous();
            // `previous` holds every URL requested so far, the first one included.
            let hop_idx = previous.len();
            let from = previous.last().map_or("", |url| url.as_str()).to_owned();
            if hop_idx > HTTP_GET_REDIRECTS_MAX {
                let denial = Denial(format!(
                    "request to `{}` denied: it redirects more than {HTTP_GET_REDIRECTS_MAX} \
                     times (the limit of http.get)",
                    previous.first().map_or("", |url| url.as_str())
                ));
                return attempt.error(denial);
            }
            match sandbox.check_url(attempt.url().as_str()) {
                Ok(_) => attempt.follow(),
                Err(error) => attempt.error(Denial(format!(
                    "redirect {hop_idx} from `{from}` refused: {error}"
                ))),
            }
        });
        let mut builder = reqwest::Client::builder();
        if let Some(roots) = &self.roots {
            builder = builder.tls_certs_only(roots.iter().cloned());
        }
        builder
            .redirect(redirects)
            .dns_resolver(Arc::clone(&self.resolver))
            // A proxy would resolve names itself, out of reach of the address checks.
            .no_proxy()
            .referer(false)
            .connect_timeout(Duration::from_millis(HTTP_GET_CONNECT_TIMEOUT_MS))
            .timeout(Duration::from_millis(HTTP_GET_TIMEOUT_MS))
            .user_agent(concat!("agent-kernel/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| format!("cannot build the HTTP client: {}", error_chain(&error)))
    }

    async fn fetch(&self, url: &str) -> Result<ToolOutput, ToolError> {
        let checked = self.sandbox.check_url(url).map_err(sandbox_error)?;
        let client = self.client()?;
        let mut response = client
            .get(checked)
            .send()
            .await
            .map_err(|error| request_error(url, &error))?;
        let final_url = response.url().clone();
        let status = response.status();
        if status.is_redirection() {
            return Err(self.unfollowed_redirect(&final_url, status, response.headers()));
        }
        if !status.is_success() {
            let error = ToolError::failed(format!("GET `{final_url}` answered {status}"));
            return Err(
                if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
                    error.retriable()
                } else {
                    error
                },
            );
        }
        let max_bytes = self.sandbox.max_response_bytes();
        if let Some(len) = response.content_length() {
            self.sandbox
                .check_response_bytes(final_url.as_str(), len)
                .map_err(sandbox_error)?;
        }
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let capacity = response.content_length().unwrap_or(0).min(max_bytes);
        let mut body: Vec<u8> = Vec::with_capacity(usize::try_from(capacity).unwrap_or(0));
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|error| request_error(url, &error))?
        {
            let len = body.len() as u64 + chunk.len() as u64;
            // Dropping the response on a denial closes the connection: nothing more is read.
            self.sandbox
                .check_response_bytes(final_url.as_str(), len)
                .map_err(sandbox_error)?;
            body.extend_from_slice(&chunk);
        }
        debug_assert!(body.len() as u64 <= max_bytes);
        let n_bytes = body.len() as u64;
        let mut data = json!({
            "url": final_url.as_str(),
            "status": status.as_u16(),
            "bytes": n_bytes,
            "content_type": content_type,
        });
        match String::from_utf8(body) {
            Ok(text) => data["body"] = Value::String(text),
            Err(error) => {
                data["body_base64"] = Value::String(
                    base64::engine::general_purpose::STANDARD.encode(error.into_bytes()),
                );
            }
        }
        Ok(ToolOutput::new(data)
            .with_effect(format!("fetched {} from {final_url}", byte_count(n_bytes))))
    }

    /// A 3xx response that came back unfollowed: its `Location` could not be turned into a
    /// request (a scheme the client does not speak, say). Ruled on like any hop, so a
    /// redirect to `file:` is a denial rather than a plain failure.
    fn unfollowed_redirect(
        &self,
        from: &reqwest::Url,
        status: StatusCode,
        headers: &reqwest::header::HeaderMap,
    ) -> ToolError {
        let location = headers
            .get(LOCATION)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("");
        if let Ok(target) = from.join(location)
            && let Err(error) = self.sandbox.check_url(target.as_str())
        {
            return if error.is_denied() {
                ToolError::denied(format!("redirect from `{from}` refused: {error}"))
            } else {
                sandbox_error(error)
            };
        }
        ToolError::failed(format!(
            "GET `{from}` answered {status} with a redirect that was not followed (Location: \
             `{}`)",
            location.escape_debug()
        ))
    }
}

impl Tool for HttpGet {
    fn spec(&self) -> ToolSpec {
        ToolSpec::read_only(Self::ID)
            .with_version(TOOL_VERSION)
            .with_description("GET a URL on an allowed host; reads only.")
            .with_schema(object_schema(
                "http.get arguments",
                json!({
                    "url": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": MAX_URL_BYTES,
                        "description": "an http or https URL whose host the [http] policy allows",
                    },
                }),
                &["url"],
            ))
    }

    fn check(&self, args: &Value) -> Result<(), ToolError> {
        let UrlArgs { url } = parse_args(args)?;
        self.sandbox
            .check_url(&url)
            .map(|_| ())
            .map_err(sandbox_error)
    }

    async fn execute(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let UrlArgs { url } = parse_args(args)?;
        self.fetch(&url).await
    }
}

/// A policy denial raised inside the HTTP client (a redirect hop, a resolved address), found
/// again in the client's error chain.
#[derive(Debug)]
struct Denial(String);

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for Denial {}

/// Where names get their addresses.
#[derive(Debug)]
enum Resolution {
    /// The system resolver, through tokio.
    System,
    /// A fixed map, and nothing else.
    Fixed(HashMap<String, Vec<IpAddr>>),
}

/// Resolves a name, then keeps only the addresses the sandbox allows; if none is left, the
/// resolution fails with a [`Denial`], before any connection.
#[derive(Debug)]
struct GuardedResolver {
    sandbox: Arc<HttpSandbox>,
    resolution: Resolution,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        let sandbox = Arc::clone(&self.sandbox);
        let fixed = match &self.resolution {
            Resolution::System => None,
            Resolution::Fixed(map) => Some(map.get(&normalize_name(&host)).cloned()),
        };
        Box::pin(async move {
            // Rule on the name before asking any resolver about it.
            sandbox
                .check_name(&host)
                .map_err(|error| Denial(error.to_string()))?;
            let addrs: Vec<IpAddr> = match fixed {
                Some(Some(addrs)) => addrs,
                Some(None) => {
                    return Err(format!(
                        "`{host}` does not resolve: the resolver overrides do not list it"
                    )
                    .into());
                }
                None => tokio::net::lookup_host((host.as_str(), 0))
                    .await?
                    .map(|addr| addr.ip())
                    .collect(),
            };
            let mut allowed: Vec<SocketAddr> = Vec::new();
            let mut first_denial = None;
            for addr in addrs.into_iter().take(HTTP_GET_RESOLVED_ADDRS_MAX) {
                match sandbox.check_resolved(&host, addr) {
                    Ok(()) => allowed.push(SocketAddr::new(addr, 0)),
                    Err(error) => {
                        first_denial.get_or_insert(error);
                    }
                }
            }
            if allowed.is_empty() {
                return Err(match first_denial {
                    Some(error) => Denial(error.to_string()).into(),
                    None => format!("`{host}` resolved to no address").into(),
                });
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// A host name as the overrides are keyed: lowercase, without one trailing dot.
fn normalize_name(name: &str) -> String {
    let lower = name.to_ascii_lowercase();
    match lower.strip_suffix('.') {
        Some(stripped) => stripped.to_owned(),
        None => lower,
    }
}

/// Maps a client error: a denial found in its chain is a denial; a connection failure or a
/// timeout is retriable (nothing happened on the server for a GET); anything else fails.
fn request_error(url: &str, error: &reqwest::Error) -> ToolError {
    if let Some(denial) = find_denial(error) {
        return ToolError::denied(denial.0.clone());
    }
    let message = format!("GET `{url}` failed: {}", error_chain(error));
    if error.is_timeout() || error.is_connect() || error.is_request() || error.is_body() {
        ToolError::failed(message).retriable()
    } else {
        ToolError::failed(message)
    }
}

fn find_denial<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a Denial> {
    let mut current: Option<&'a (dyn StdError + 'static)> = Some(error);
    while let Some(error) = current {
        if let Some(denial) = error.downcast_ref::<Denial>() {
            return Some(denial);
        }
        current = error.source();
    }
    None
}

/// An error and its sources, joined with `: `, without repeating a source already shown.
fn error_chain(error: &(dyn StdError + 'static)) -> String {
    /// Error chains are short; the bound guards against a cycle.
    const CHAIN_LINKS_MAX: usize = 8;
    let mut message = error.to_string();
    let mut current = error.source();
    let mut n_links = 0;
    while let Some(source) = current {
        n_links += 1;
        if n_links > CHAIN_LINKS_MAX {
            break;
        }
        let text = source.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        current = source.source();
    }
    message
}
