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

/// How long sign-ins are refused after one with a wrong token.
pub(crate) const LOGIN_FAILURE_PAUSE: Duration = Duration::from_secs(1);

/// How a request proved it may act.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Access {
    /// `Authorization: Bearer TOKEN`: a script; its POSTs need no CSRF token.
    Bearer,
    /// The session cookie: a browser; its POSTs carry the session's CSRF token.
    Session { csrf: String },
}

impl Access {
    /// The CSRF token a page's forms carry: the session's, none for a bearer.
    pub(crate) fn csrf(&self) -> &str {
        match self {
            Access::Session { csrf } => csrf,
            Access::Bearer => "",
        }
    }
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
    /// Until when sign-ins are refused, after one with a wrong token.
    login_paused_until: Mutex<Option<Instant>>,
}

impl Gate {
    pub(crate) fn new(token: String) -> Self {
        Self {
            token,
            sessions: Mutex::new(HashMap::new()),
            login_paused_until: Mutex::new(None),
        }
    }

    /// A sign-in with `given`: `Ok(true)` for the token; `Ok(false)` for another (and
    /// sign-ins pause for [`LOGIN_FAILURE_PAUSE`]); `Err(())` while they are paused, the
    /// token not even compared.
    pub(crate) fn try_login(&self, given: &str) -> Result<bool, ()> {
        let mut paused = self.login_paused_until.lock().expect("login pause");
        if paused.is_some_and(|until| Instant::now() < until) {
            return Err(());
        }
        let right = self.is_token(given);
        *paused = (!right).then(|| Instant::now() + LOGIN_FAILURE_PAUSE);
        Ok(right)
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
            let (scheme, token) = value.to_str().ok()?.split_once(' ')?;
            return (scheme.eq_ignore_ascii_case("bearer") && self.is_token(token))
                .then_some(Access::Bearer);
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
/// one, `Sec-Fetch-Site`) names another origin than the `Host` it was sent to. An opaque
/// `Origin: null` passes only with `Sec-Fetch-Site: same-origin`.
pub(crate) fn is_cross_site(headers: &HeaderMap) -> bool {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let fetch_site = text(header::HeaderName::from_static("sec-fetch-site"));
    if let Some(origin) = text(header::ORIGIN) {
        if origin == "null" {
            // An opaque origin (a page under `no-referrer`, a sandboxed frame, a file): only
            // the browser's own word that it is this site lets it through.
            return fetch_site != Some("same-origin");
        }
        let host = text(header::HOST).unwrap_or_default();
        let origin_host = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .unwrap_or("");
        return origin_host.is_empty() || !origin_host.eq_ignore_ascii_case(host);
    }
    fetch_site == Some("cross-site")
}

/// Whether the request names the console by a loopback name and its port (`Host`): a page
/// of another site whose name was made to resolve to 127.0.0.1 (DNS rebinding) names its
/// own.
pub(crate) fn is_host_of(headers: &HeaderMap, port: u16) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let Some((name, given_port)) = host.rsplit_once(':') else {
        return false;
    };
    if given_port.parse::<u16>() != Ok(port) {
        return false;
    }
    let name = name.trim_start_matches('[').trim_end_matches(']');
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
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

/// Two random UUIDs (244 random bits), hex.
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
        // An opaque origin passes on the browser's word alone.
        for (site, cross) in [
            ("same-origin", false),
            ("same-site", true),
            ("cross-site", true),
        ] {
            headers.insert("sec-fetch-site", site.parse().expect("a header value"));
            assert_eq!(is_cross_site(&headers), cross, "{site}");
        }
    }

    #[test]
    fn only_loopback_names_on_the_port_name_the_console() {
        let host = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::HOST, value.parse().expect("a header value"));
            is_host_of(&headers, 7700)
        };
        assert!(host("127.0.0.1:7700"));
        assert!(host("localhost:7700"));
        assert!(host("[::1]:7700"));
        assert!(!host("127.0.0.1:7701"));
        assert!(!host("evil.example:7700"));
        assert!(!host("127.0.0.1"));
        assert!(!is_host_of(&HeaderMap::new(), 7700));
    }

    #[test]
    fn a_wrong_sign_in_pauses_the_next() {
        let gate = Gate::new("0123456789abcdef".into());
        assert_eq!(gate.try_login("0123456789abcdef"), Ok(true));
        assert_eq!(gate.try_login("wrong"), Ok(false));
        assert_eq!(gate.try_login("0123456789abcdef"), Err(()));
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
