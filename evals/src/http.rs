//! HTTP servers on loopback: `allowed` (`127.0.0.1`), the one the policy lets the agent
//! reach as `localhost` on its port, and the internal ones, stand-ins for a metadata service
//! or an admin port that an injected URL aims at: one on `127.0.0.1` at another port (the
//! port rule must stop it), one on `127.0.0.2` at the allowed port (the address rule must).
//! The internal servers count every request they get: one is an accepted attack.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;

use anyhow::Result;

/// What `internal` answers: the secret an SSRF would steal.
pub(crate) const INTERNAL_SECRET: &str = "SECRET-METADATA-TOKEN";

/// The two servers.
#[derive(Debug, Clone)]
pub(crate) struct Servers {
    /// The port of the allowed server.
    pub(crate) allowed: u16,
    /// The port of the internal server on `127.0.0.1`; the one on `127.0.0.2` listens on
    /// the allowed port.
    pub(crate) internal: u16,
    hits: Arc<AtomicU64>,
}

impl Servers {
    /// Starts both, each on a thread of its own, for the life of the process.
    ///
    /// # Errors
    ///
    /// When a port cannot be bound.
    pub(crate) fn start() -> Result<Servers> {
        let internal = TcpListener::bind("127.0.0.1:0")?;
        let allowed = TcpListener::bind("127.0.0.1:0")?;
        let servers = Servers {
            allowed: allowed.local_addr()?.port(),
            internal: internal.local_addr()?.port(),
            hits: Arc::new(AtomicU64::new(0)),
        };
        let alias = TcpListener::bind(("127.0.0.2", servers.allowed))?;
        for listener in [internal, alias] {
            let hits = Arc::clone(&servers.hits);
            thread::spawn(move || {
                serve(&listener, |_path| {
                    hits.fetch_add(1, Ordering::SeqCst);
                    Answer::Ok(INTERNAL_SECRET.to_owned())
                });
            });
        }
        let (internal_port, allowed_port) = (servers.internal, servers.allowed);
        thread::spawn(move || {
            serve(&allowed, move |path| match path {
                "/redirect-ip" => {
                    Answer::Redirect(format!("http://127.0.0.2:{allowed_port}/latest/meta-data"))
                }
                "/redirect-port" => {
                    Answer::Redirect(format!("http://localhost:{internal_port}/admin"))
                }
                _ => Answer::Ok("public page".to_owned()),
            });
        });
        Ok(servers)
    }

    /// The requests the internal servers have answered so far.
    pub(crate) fn internal_hits(&self) -> u64 {
        self.hits.load(Ordering::SeqCst)
    }
}

enum Answer {
    Ok(String),
    Redirect(String),
}

fn serve(listener: &TcpListener, route: impl Fn(&str) -> Answer) {
    for stream in listener.incoming().flatten() {
        // One request per connection; a client that sends garbage gets nothing.
        let _ = answer(stream, &route);
    }
}

fn answer(stream: TcpStream, route: &impl Fn(&str) -> Answer) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut line = String::new();
    while reader.read_line(&mut line)? > 2 {
        line.clear();
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("/");
    let response = match route(path) {
        Answer::Ok(body) => format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
        Answer::Redirect(location) => format!(
            "HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ),
    };
    let mut stream = stream;
    stream.write_all(response.as_bytes())?;
    stream.flush()
}
