//! `http.get` through the binary: allowed fetches, and a redirect to an unlisted host found
//! mid-saga, which rolls back what ran and exits 4 without the target ever being asked.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::thread;

use serde_json::{Value, json};

use crate::{Project, describe};

/// A loopback HTTP/1.1 server: `/ok` answers 200 "hello", `/hop` redirects to
/// `http://localhost:<port>/target`; every request path is recorded.
fn serve() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binds");
    let port = listener.local_addr().expect("address").port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request_line = String::new();
            let mut reader = BufReader::new(stream.try_clone().expect("clones"));
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            // Skip the headers.
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let path = request_line
                .split_whitespace()
                .nth(1)
                .unwrap_or("")
                .to_owned();
            record.lock().expect("not poisoned").push(path.clone());
            let response = match path.as_str() {
                "/ok" => "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello".to_owned(),
                "/hop" => format!(
                    "HTTP/1.1 302 Found\r\nLocation: http://localhost:{port}/target\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                ),
                _ => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned(),
            };
            let _ = stream.write_all(response.as_bytes());
        }
    });
    (port, seen)
}

fn project_allowing_loopback() -> Project {
    let project = Project::new();
    fs::write(
        project.path("sandbox.toml"),
        "[fs]\nallow = [\"ws\"]\n\n[http]\nallow_domains = [\"127.0.0.1\"]\nmax_response_bytes = 1024\n",
    )
    .expect("writes policy");
    project
}

#[test]
fn an_allowed_fetch_succeeds() {
    let (port, seen) = serve();
    let project = project_allowing_loopback();
    let plan = project.plan(
        "plan.json",
        &json!({ "steps": [ { "tool": "http.get", "args": { "url": format!("http://127.0.0.1:{port}/ok") } } ] }),
    );
    let (code, document) = project.run_json(&["run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(code, 0, "{document}");
    let saga_id = document["saga_id"].as_str().expect("id");
    let (_, shown) = project.run_json(&["log", "--saga", saga_id]);
    assert_eq!(shown["steps"][0]["output"]["data"]["body"], "hello");
    assert_eq!(*seen.lock().expect("not poisoned"), ["/ok"]);
}

#[test]
fn a_redirect_to_an_unlisted_host_mid_saga_rolls_back_and_exits_4() {
    let (port, seen) = serve();
    let project = project_allowing_loopback();
    fs::write(project.path("ws/a.txt"), b"before").expect("writes");
    let before = project.snapshot();
    let plan = project.plan(
        "plan.json",
        &json!({ "steps": [
            { "tool": "fs.write", "args": { "path": "ws/a.txt", "content": "after" } },
            { "tool": "http.get", "args": { "url": format!("http://127.0.0.1:{port}/hop") } },
            { "tool": "fs.write", "args": { "path": "ws/b.txt", "content": "never" } },
        ]}),
    );
    let (code, document): (i32, Value) =
        project.run_json(&["run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(code, 4, "{document}");
    assert_eq!(document["state"], "FailedRolledBack");
    assert_eq!(
        project.snapshot(),
        before,
        "the write before the denial was undone"
    );
    assert_eq!(
        *seen.lock().expect("not poisoned"),
        ["/hop"],
        "the redirect target was never asked"
    );
}

#[test]
fn an_unlisted_host_is_denied_before_anything_runs() {
    let (port, seen) = serve();
    let project = project_allowing_loopback();
    let plan = project.plan(
        "plan.json",
        &json!({ "steps": [
            { "tool": "fs.write", "args": { "path": "ws/a.txt", "content": "x" } },
            { "tool": "http.get", "args": { "url": format!("http://localhost:{port}/ok") } },
        ]}),
    );
    let output = project.run(&["run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
    assert!(project.snapshot().is_empty());
    assert!(seen.lock().expect("not poisoned").is_empty());
}

#[test]
fn allow_ports_lets_listed_ports_through_both_lines_and_denies_the_rest() {
    let (port, seen) = serve();
    let project = Project::new();
    fs::write(
        project.path("sandbox.toml"),
        format!(
            "[fs]\nallow = [\"ws\"]\n\n[http]\nallow_domains = [\"127.0.0.1\"]\nallow_ports = [{port}]\n"
        ),
    )
    .expect("writes policy");
    // The listed port: allowed by the first line, and by the kernel's TCP rules in `run`.
    let plan = project.plan(
        "ok.json",
        &json!({ "steps": [ { "tool": "http.get", "args": { "url": format!("http://127.0.0.1:{port}/ok") } } ] }),
    );
    let (code, document) = project.run_json(&["run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(code, 0, "{document}");
    assert_eq!(*seen.lock().expect("not poisoned"), ["/ok"]);

    // Another port on the same allowed host: denied before anything ran.
    let other = if port == 1 { 2 } else { port - 1 };
    let plan = project.plan(
        "other.json",
        &json!({ "steps": [ { "tool": "http.get", "args": { "url": format!("http://127.0.0.1:{other}/ok") } } ] }),
    );
    let output = project.run(&["run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("is not in [http] allow_ports"),
        "{}",
        describe(&output)
    );
}
