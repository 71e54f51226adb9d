//! Who may use the console: the token (a bearer header, or a session cookie after the login
//! form), the CSRF token of a session's forms, and a cross-site request refused.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, header};

/// The session cookie's name.
pub(crate) const SESSION_COOKIE: &str = "ak_session";

/// How long a session lasts after its login.
pub(crate) const SESSION_TTL: Duration = Duration::from_secs(12 * 60 * 60);

/// The most sessions kept at once; a login past it ends the oldest.
pub(crate) const SESSIONS_MAX: usize = 256;

/// The shortest token `--token-file` may hold.
pub(crate) const TOKEN_MIN_CHARS: usize = 16;

/// How a request proved it may act.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Access {
    /// `Authorization: Bearer TOKEN`: a script; its POSTs need no CSRF token.
    Bearer,
    /// The session cookie: a browser; its POSTs carry the session's CSRF token.
    Session { csrf: String },
}

/// One browser's login.
struct Session {
    csrf: String,
    started: Instant,
}

/// The token and the sessions of one console.
pub(crate) struct Gate {
    token: String,
    sessions: Mutex<HashMap<String, Session>>,
}

impl Gate {
    pub(crate) fn new(token: String) -> Self {
        Self {
            token,
            sessions: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `given` is the token (compared in constant time).
    pub(crate) fn is_token(&self, given: &str) -> bool {
        constant_time_eq(given.trim().as_bytes(), self.token.as_bytes())
    }

    /// A new session for a login with the right token: its id, for the cookie.
    pub(crate) fn start_session(&self) -> String {
        let id = random_token();
        let mut sessions = self.sessions.lock().expect("sessions");
        sessions.retain(|_, session| session.started.elapsed() < SESSION_TTL);
        if sessions.len() >= SESSIONS_MAX
            && let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, session)| session.started)
                .map(|(id, _)| id.clone())
        {
            sessions.remove(&oldest);
        }
        sessions.insert(
            id.clone(),
            Session {
                csrf: random_token(),
                started: Instant::now(),
            },
        );
        id
    }

    /// Ends the session of `headers`' cookie, if any.
    pub(crate) fn end_session(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers, SESSION_COOKIE) {
            self.sessions.lock().expect("sessions").remove(&id);
        }
    }

    /// How the request proves it may act, if it does.
    pub(crate) fn access(&self, headers: &HeaderMap) -> Option<Access> {
        if let Some(value) = headers.get(header::AUTHORIZATION) {
            let value = value.to_str().ok()?;
            let token = value.strip_prefix("Bearer ")?;
            return self.is_token(token).then_some(Access::Bearer);
        }
        let id = cookie(headers, SESSION_COOKIE)?;
        let sessions = self.sessions.lock().expect("sessions");
        let session = sessions.get(&id)?;
        (session.started.elapsed() < SESSION_TTL).then(|| Access::Session {
            csrf: session.csrf.clone(),
        })
    }
}

/// Whether a state-changing request comes from another site: its `Origin` (or, without
/// one, `Sec-Fetch-Site`) names another origin than the `Host` it was sent to.
pub(crate) fn is_cross_site(headers: &HeaderMap) -> bool {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(origin) = text(header::ORIGIN) {
        let host = text(header::HOST).unwrap_or_default();
        let origin_host = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .unwrap_or("");
        return origin_host.is_empty() || !origin_host.eq_ignore_ascii_case(host);
    }
    headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|site| site == "cross-site")
}

/// The value of cookie `name` in `headers`.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .find_map(|pair| {
            let (key, value) = pair.trim().split_once('=')?;
            (key == name).then(|| value.to_owned())
        })
}

/// 256 random bits, hex.
pub(crate) fn random_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Whether `a` and `b` are equal, in a time that depends on their lengths only.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0_u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_found_by_name_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            "a=1; ak_session=xyz; b=2".parse().expect("a header value"),
        );
        assert_eq!(cookie(&headers, SESSION_COOKIE).as_deref(), Some("xyz"));
        assert_eq!(cookie(&headers, "c"), None);
    }

    #[test]
    fn a_post_from_another_origin_is_cross_site() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::HOST,
            "127.0.0.1:7700".parse().expect("a header value"),
        );
        assert!(!is_cross_site(&headers));
        headers.insert(
            header::ORIGIN,
            "http://127.0.0.1:7700".parse().expect("a header value"),
        );
        assert!(!is_cross_site(&headers));
        headers.insert(
            header::ORIGIN,
            "http://evil.example".parse().expect("a header value"),
        );
        assert!(is_cross_site(&headers));
        headers.insert(header::ORIGIN, "null".parse().expect("a header value"));
        assert!(is_cross_site(&headers));
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        let gate = Gate::new("0123456789abcdef".into());
        assert!(gate.is_token(" 0123456789abcdef\n"));
        assert!(!gate.is_token("0123456789abcde"));
    }
}
