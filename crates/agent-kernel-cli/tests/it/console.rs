//! The operator console (`agent-kernel serve`) over real HTTP on loopback: the token, the
//! login and its CSRF token, a cross-site POST, decisions recorded once and as the
//! console's operator, the JSON answers against the command line's, and agent-controlled
//! text shown as text.

use std::collections::HashMap;
use std::fs;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt as _;
use std::process::{Child, Stdio};

use serde_json::{Value, json};

use crate::{Project, describe, json_output};

/// A project whose policy makes `fs.append` wait for an approval (`extra` added to the
/// `[approval]` section), with a saga waiting: `fs.write`, then an `fs.append` whose
/// content is hostile markup. Its saga id and request id.
fn waiting_project(extra: &str) -> (Project, String, String) {
    let project = Project::new();
    fs::write(
        project.path("sandbox.toml"),
        format!("[fs]\nallow = [\"ws\"]\n\n[approval]\nrequire = [\"fs.append\"]\n{extra}"),
    )
    .expect("writes policy");
    fs::write(project.path("operator.key"), "0123456789abcdef\n").expect("writes key");
    let plan = project.plan(
        "plan.json",
        &json!({"steps": [
            {"tool": "fs.write", "args": {"path": "ws/a.txt", "content": "a"}},
            {"tool": "fs.append", "args": {"path": "ws/log.txt", "content": "<script>alert(1)</script>"}},
        ]}),
    );
    let output = project.run(&[
        "--json",
        "run",
        "--no-wait",
        "--plan",
        plan.to_str().expect("utf-8"),
    ]);
    let (code, report) = json_output(&output);
    assert_eq!(code, 5, "{}", describe(&output));
    let saga_id = report["saga_id"].as_str().expect("saga").to_owned();
    let approval_id = report["approval"]["id"].as_str().expect("id").to_owned();
    (project, saga_id, approval_id)
}

/// A running console and what it printed at start.
pub(crate) struct Console {
    child: Child,
    /// `127.0.0.1:PORT`.
    address: String,
    token: String,
    token_file: String,
}

impl Console {
    /// `serve --json --listen 127.0.0.1:0 ARGS` on the project's log.
    fn start(project: &Project, args: &[&str]) -> Self {
        let mut all = vec!["--json", "serve", "--listen", "127.0.0.1:0"];
        all.extend_from_slice(args);
        Self::spawn(project, project.command(&all))
    }

    /// `command`, a `serve --json` of the project, started; its first line read.
    pub(crate) fn spawn(project: &Project, mut command: std::process::Command) -> Self {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawns");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .expect("reads its first line");
        let started: Value = match serde_json::from_str(&line) {
            Ok(started) => started,
            Err(error) => {
                let _ = child.kill();
                let output = child.wait_with_output().expect("waits");
                panic!("{error}: {line:?}; {}", describe(&output))
            }
        };
        let url = started["url"].as_str().expect("a url");
        let address = url
            .strip_prefix("http://")
            .and_then(|rest| rest.strip_suffix('/'))
            .expect("http://ADDR/")
            .to_owned();
        let token_file = started["token_file"].as_str().expect("a path").to_owned();
        let token = fs::read_to_string(project.path(&token_file))
            .expect("reads the token")
            .trim()
            .to_owned();
        Self {
            child,
            address,
            token,
            token_file,
        }
    }

    fn bearer(&self) -> String {
        format!("Bearer {}", self.token)
    }

    /// One request; the status, the headers (names lowercased) and the body.
    fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
        let mut stream = TcpStream::connect(&self.address).expect("connects");
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.address,
            body.len()
        );
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        request.push_str(body);
        stream.write_all(request.as_bytes()).expect("sends");
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).expect("reads");
        let text = String::from_utf8(raw).expect("utf-8");
        let (head, body) = text.split_once("\r\n\r\n").expect("a head");
        let mut lines = head.lines();
        let status: u16 = lines
            .next()
            .and_then(|line| line.split(' ').nth(1))
            .and_then(|code| code.parse().ok())
            .expect("a status line");
        let mut headers: HashMap<String, Vec<String>> = HashMap::new();
        for line in lines {
            let (name, value) = line.split_once(':').expect("a header");
            headers
                .entry(name.trim().to_ascii_lowercase())
                .or_default()
                .push(value.trim().to_owned());
        }
        Answer {
            status,
            headers,
            body: body.to_owned(),
        }
    }

    /// `GET path` as JSON with the token.
    pub(crate) fn get_json(&self, path: &str) -> (u16, Value) {
        let bearer = self.bearer();
        let answer = self.send(
            "GET",
            path,
            &[("Authorization", &bearer), ("Accept", "application/json")],
            "",
        );
        (answer.status, answer.json())
    }

    /// `POST path` with a JSON body and the token, asking for JSON.
    fn post_json(&self, path: &str, body: &Value) -> (u16, Value) {
        let bearer = self.bearer();
        let answer = self.send(
            "POST",
            path,
            &[
                ("Authorization", &bearer),
                ("Accept", "application/json"),
                ("Content-Type", "application/json"),
            ],
            &body.to_string(),
        );
        (answer.status, answer.json())
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Answer {
    status: u16,
    headers: HashMap<String, Vec<String>>,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|error| panic!("{error}: {}", self.body))
    }

    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|values| values.first())
            .map_or("", String::as_str)
    }
}

/// The CSRF token a page's first form carries.
fn form_csrf(page: &str) -> String {
    page.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a form's CSRF token")
        .to_owned()
}

/// The pending requests, as the command line lists them.
fn pending(project: &Project) -> Value {
    let (code, document) = project.run_json(&["approvals"]);
    assert_eq!(code, 0, "{document}");
    document
}

#[test]
fn every_route_but_the_health_check_needs_the_token_and_answers_as_the_command_line_does() {
    let (project, saga_id, _) = waiting_project("");
    let console = Console::start(&project, &[]);
    let mode = fs::metadata(project.path(&console.token_file))
        .expect("the token file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    assert!(console.token_file.ends_with(".console-token"));

    let health = console.send("GET", "/healthz", &[], "");
    assert_eq!(health.status, 200);
    for headers in [
        vec![("Accept", "application/json")],
        vec![
            ("Accept", "application/json"),
            ("Authorization", "Bearer not-the-token-at-all"),
        ],
    ] {
        for path in ["/", "/approvals", &format!("/sagas/{saga_id}")] {
            let refused = console.send("GET", path, &headers, "");
            assert_eq!(refused.status, 401, "{path}: {}", refused.body);
        }
    }
    // A browser without a session gets the login form.
    let form = console.send("GET", "/approvals", &[], "");
    assert_eq!(form.status, 401);
    assert!(form.body.contains("action=\"/login\""), "{}", form.body);

    let (status, overview) = console.get_json("/");
    assert_eq!(status, 200, "{overview}");
    assert_eq!(
        overview,
        json!({"counts": {"AwaitingApproval": 1}, "approvals_pending": 1, "dead_letters_open": 0})
    );
    let (status, approvals) = console.get_json("/approvals");
    assert_eq!(status, 200);
    assert_eq!(approvals, pending(&project));
    let (status, saga) = console.get_json(&format!("/sagas/{saga_id}"));
    assert_eq!(status, 200);
    let (code, logged) = project.run_json(&["log", "--saga", &saga_id]);
    assert_eq!(code, 0);
    assert_eq!(saga, logged);
    let (status, missing) = console.get_json("/sagas/no-such-saga");
    assert_eq!(status, 404, "{missing}");

    // Pages: the agent's markup is text, and every answer carries the policy.
    let bearer = console.bearer();
    for path in ["/approvals".to_owned(), format!("/sagas/{saga_id}")] {
        let page = console.send("GET", &path, &[("Authorization", &bearer)], "");
        assert_eq!(page.status, 200, "{}", page.body);
        assert!(
            page.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{}",
            page.body
        );
        assert!(!page.body.contains("<script"), "{}", page.body);
        let policy = page.header("content-security-policy");
        assert!(policy.contains("default-src 'none'"), "{policy}");
        assert_eq!(page.header("x-frame-options"), "DENY");
    }
}

#[test]
fn a_browser_signs_in_and_decides_once_with_its_csrf_token_and_never_from_another_site() {
    let (project, saga_id, approval_id) = waiting_project("");
    let console = Console::start(&project, &["--operator", "carol"]);
    let form_headers = [("Content-Type", "application/x-www-form-urlencoded")];
    let wrong = console.send("POST", "/login", &form_headers, "token=not-it");
    assert_eq!(wrong.status, 401);
    assert!(wrong.header("set-cookie").is_empty());
    // A wrong token pauses sign-ins for a moment.
    let mut signed_in = None;
    crate::wait_until("a sign-in once the pause ends", || {
        let answer = console.send(
            "POST",
            "/login",
            &form_headers,
            &format!("token={}", console.token),
        );
        if answer.status != 429 {
            signed_in = Some(answer);
        }
        signed_in.is_some()
    });
    let signed_in = signed_in.expect("answered");
    assert_eq!(signed_in.status, 303, "{}", signed_in.body);
    let set_cookie = signed_in.header("set-cookie");
    assert!(set_cookie.contains("HttpOnly"), "{set_cookie}");
    assert!(set_cookie.contains("SameSite=Strict"), "{set_cookie}");
    let cookie = set_cookie.split(';').next().expect("name=value").to_owned();

    let inbox = console.send("GET", "/approvals", &[("Cookie", &cookie)], "");
    assert_eq!(inbox.status, 200);
    assert!(inbox.body.contains(&approval_id), "{}", inbox.body);
    let csrf = form_csrf(&inbox.body);
    assert_eq!(csrf.len(), 64);

    let approve = format!("/approvals/{approval_id}/approve");
    let with_cookie = [
        ("Cookie", cookie.as_str()),
        ("Content-Type", "application/x-www-form-urlencoded"),
    ];
    for (body, origin) in [
        ("note=ok".to_owned(), None),
        (format!("note=ok&csrf={}", "0".repeat(64)), None),
        (format!("note=ok&csrf={csrf}"), Some("http://evil.example")),
    ] {
        let mut headers = with_cookie.to_vec();
        if let Some(origin) = origin {
            headers.push(("Origin", origin));
        }
        let refused = console.send("POST", &approve, &headers, &body);
        assert_eq!(refused.status, 403, "{body}: {}", refused.body);
        assert_eq!(
            pending(&project)["approvals"]
                .as_array()
                .expect("list")
                .len(),
            1,
            "nothing changed"
        );
    }
    let mut same_site = with_cookie.to_vec();
    let origin = format!("http://{}", console.address);
    same_site.push(("Origin", &origin));
    let approved = console.send(
        "POST",
        &approve,
        &same_site,
        &format!("note=looks+right&csrf={csrf}"),
    );
    assert_eq!(approved.status, 303, "{}", approved.body);
    let (code, shown) = project.run_json(&["approvals", "--show", &approval_id]);
    assert_eq!(code, 0);
    assert_eq!(shown["status"], "approved");
    assert_eq!(shown["decided_by"], "carol");
    assert_eq!(shown["note"], "looks right");
    // Decided once: again, by a script, is a conflict.
    let (status, again) = console.post_json(&approve, &json!({"note": "again"}));
    assert_eq!(status, 409, "{again}");
    // The decision is the command line's: `resume` finishes the plan.
    let resumed = project.run(&["resume", "--saga", &saga_id]);
    assert_eq!(resumed.status.code(), Some(0), "{}", describe(&resumed));
    assert_eq!(
        fs::read_to_string(project.path("ws/log.txt")).expect("appended"),
        "<script>alert(1)</script>"
    );
    let (_, saga) = console.get_json(&format!("/sagas/{saga_id}"));
    assert_eq!(saga["state"], "Done");
    // Signed out, the cookie opens nothing.
    let out = console.send("POST", "/logout", &with_cookie, &format!("csrf={csrf}"));
    assert_eq!(out.status, 303);
    let closed = console.send("GET", "/", &[("Cookie", &cookie)], "");
    assert_eq!(closed.status, 401);
}

#[test]
fn a_rejection_needs_a_reason_and_a_decision_needs_the_operator_key_the_policy_names() {
    let (project, _, approval_id) = waiting_project("operator_key_file = \"operator.key\"\n");
    let without_key = Console::start(&project, &[]);
    let reject = format!("/approvals/{approval_id}/reject");
    let (status, answer) = without_key.post_json(&reject, &json!({}));
    assert_eq!(status, 422, "{answer}");
    let (status, answer) = without_key.post_json(&reject, &json!({"reason": "not today"}));
    assert_eq!(status, 403, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("operator key")),
        "{answer}"
    );
    assert_eq!(
        pending(&project)["approvals"]
            .as_array()
            .expect("list")
            .len(),
        1
    );
    drop(without_key);
    let with_key = Console::start(&project, &["--operator-key-file", "operator.key"]);
    let (status, answer) = with_key.post_json(&reject, &json!({"reason": "not today"}));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer, json!({"id": approval_id, "status": "rejected"}));
    let (status, _) = with_key.get_json(&format!("/approvals/{approval_id}/nothing"));
    assert_eq!(status, 404);
}

#[test]
fn a_console_beyond_loopback_or_with_a_weak_token_is_refused_before_it_starts() {
    let project = Project::new();
    fs::write(project.path("sandbox.toml"), "[fs]\nallow = [\"ws\"]\n").expect("writes");
    let plan = project.plan(
        "plan.json",
        &json!({"steps": [{"tool": "fs.write", "args": {"path": "ws/a.txt", "content": "a"}}]}),
    );
    let ran = project.run(&["run", "--plan", plan.to_str().expect("utf-8")]);
    assert_eq!(ran.status.code(), Some(0), "{}", describe(&ran));
    fs::write(project.path("weak.token"), "short\n").expect("writes");
    for args in [
        vec!["serve", "--listen", "0.0.0.0:0"],
        vec!["serve", "--listen", "not an address"],
        vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            "weak.token",
        ],
        vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            "missing.token",
        ],
        vec!["serve", "--listen", "127.0.0.1:0", "--tls-cert", "cert.pem"],
    ] {
        let output = project.run(&args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            describe(&output)
        );
    }
    assert!(!project.path("agent-kernel.db.console-token").exists());
}

#[test]
fn dead_letters_are_listed_as_the_command_line_lists_them_and_resolved_once_with_a_note() {
    let project = Project::new();
    fs::write(project.path("note.py"), crate::dlq::NOTE_PY).expect("writes");
    fs::write(project.path("tools.toml"), crate::dlq::TOOLS_TOML).expect("writes");
    fs::write(project.path("ws/block"), "").expect("writes");
    let plan = project.plan(
        "plan.json",
        &json!({"steps": [
            {"tool": "note.add", "args": {"item": "<b>a</b>"}},
            {"tool": "fault.fail", "args": {}},
        ]}),
    );
    let output = project.run(&["run", "--plan", plan.to_str().expect("utf-8")]);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    let console = Console::start(&project, &["--operator", "dave"]);
    let (status, listed) = console.get_json("/dead-letters");
    assert_eq!(status, 200, "{listed}");
    let (code, cli) = project.run_json(&["dlq", "list"]);
    assert_eq!(code, 0);
    assert_eq!(listed, cli);
    let letters = listed["dead_letters"].as_array().expect("a list");
    assert_eq!(letters.len(), 1, "{listed}");
    let id = letters[0]["id"].as_str().expect("an id").to_owned();
    let (_, overview) = console.get_json("/");
    assert_eq!(overview["dead_letters_open"], 1);
    assert_eq!(overview["counts"], json!({"FailedRollbackPartial": 1}));

    let bearer = console.bearer();
    let page = console.send("GET", "/dead-letters", &[("Authorization", &bearer)], "");
    assert_eq!(page.status, 200);
    assert!(page.body.contains(&id), "{}", page.body);
    let resolve = format!("/dead-letters/{id}/resolve");
    let (status, answer) = console.post_json(&resolve, &json!({"note": "  "}));
    assert_eq!(status, 422, "{answer}");
    let (status, answer) =
        console.post_json(&resolve, &json!({"note": "removed the line by hand"}));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer, json!({"id": id, "status": "resolved"}));
    let (status, answer) = console.post_json(&resolve, &json!({"note": "again"}));
    assert_eq!(status, 409, "{answer}");
    let (status, _) = console.post_json(
        "/dead-letters/no-such-letter/resolve",
        &json!({"note": "x"}),
    );
    assert_eq!(status, 404);
    assert_eq!(project.latest_saga().expect("a saga").1, "FailedRolledBack");
    let (_, audit) = project.run_json(&[
        "audit",
        "list",
        "--kind",
        "DeadLetterSettled",
        "--limit",
        "1",
    ]);
    assert!(audit.to_string().contains("dave"), "{audit}");
}

#[test]
fn hostile_requests_are_refused_and_change_nothing() {
    let (project, _, approval_id) = waiting_project("");
    let console = Console::start(&project, &[]);
    let approve = format!("/approvals/{approval_id}/approve");
    let bearer = console.bearer();
    let unchanged = || {
        assert_eq!(
            pending(&project)["approvals"]
                .as_array()
                .expect("list")
                .len(),
            1,
            "nothing changed"
        );
    };
    // Every answer carries the policy, the open routes' too.
    for path in ["/healthz", "/login", "/assets/console.css", "/no-such-page"] {
        let answer = console.send("GET", path, &[], "");
        let policy = answer.header("content-security-policy");
        assert!(policy.contains("default-src 'none'"), "{path}: {policy}");
    }
    assert_eq!(console.send("GET", "/no-such-page", &[], "").status, 401);
    // Another name for 127.0.0.1 (DNS rebinding): refused, even with the token.
    let mut stream = TcpStream::connect(&console.address).expect("connects");
    stream
        .write_all(
            format!(
                "POST {approve} HTTP/1.1\r\nHost: evil.example:{}\r\nAuthorization: {bearer}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                console.address.rsplit(':').next().expect("a port")
            )
            .as_bytes(),
        )
        .expect("sends");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).expect("reads");
    assert!(raw.starts_with("HTTP/1.1 421"), "{raw}");
    unchanged();
    // The token from another site, or a body past the bound.
    let refused = console.send(
        "POST",
        &approve,
        &[
            ("Authorization", &bearer),
            ("Origin", "http://evil.example"),
        ],
        "",
    );
    assert_eq!(refused.status, 403, "{}", refused.body);
    let big = format!("note={}", "x".repeat(70 * 1024));
    let refused = console.send("POST", &approve, &[("Authorization", &bearer)], &big);
    assert_eq!(refused.status, 413, "{}", refused.body);
    let refused = console.send("POST", "/login", &[], &big);
    assert_eq!(refused.status, 413, "{}", refused.body);
    unchanged();

    // A sign-in from another site; a wrong token pauses the next sign-in.
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    let token = format!("token={}", console.token);
    let mut cross = form.to_vec();
    cross.push(("Origin", "http://evil.example"));
    assert_eq!(console.send("POST", "/login", &cross, &token).status, 403);
    assert_eq!(
        console.send("POST", "/login", &form, "token=wrong").status,
        401
    );
    assert_eq!(console.send("POST", "/login", &form, &token).status, 429);
    let mut signed_in = None;
    crate::wait_until("the pause after a wrong token ends", || {
        let answer = console.send("POST", "/login", &form, &token);
        if answer.status == 303 {
            signed_in = Some(answer);
        }
        signed_in.is_some()
    });
    let cookie = signed_in
        .expect("signed in")
        .header("set-cookie")
        .split(';')
        .next()
        .expect("name=value")
        .to_owned();
    let page = console.send("GET", "/", &[("Cookie", &cookie)], "");
    assert!(page.body.contains("action=\"/logout\""), "{}", page.body);
    let csrf = form_csrf(&page.body);
    // A fetch from another site without an Origin still says so.
    let with_cookie = [
        ("Cookie", cookie.as_str()),
        ("Content-Type", "application/x-www-form-urlencoded"),
        ("Sec-Fetch-Site", "cross-site"),
    ];
    let refused = console.send("POST", &approve, &with_cookie, &format!("csrf={csrf}"));
    assert_eq!(refused.status, 403, "{}", refused.body);
    unchanged();
    // Signing out needs the CSRF token too; without it the session lasts.
    let refused = console.send("POST", "/logout", &with_cookie[..2], "");
    assert_eq!(refused.status, 403);
    assert_eq!(
        console.send("GET", "/", &[("Cookie", &cookie)], "").status,
        200
    );
}

#[test]
fn the_saga_list_filters_and_pages_by_key() {
    let project = Project::new();
    fs::write(project.path("sandbox.toml"), "[fs]\nallow = [\"ws\"]\n").expect("writes");
    // Four sagas: three of alice writing a file each, one of bob appending.
    for (n, (actor, tool)) in [
        ("alice", "fs.write"),
        ("alice", "fs.write"),
        ("bob", "fs.append"),
        ("alice", "fs.write"),
    ]
    .into_iter()
    .enumerate()
    {
        let plan = project.plan(
            "plan.json",
            &json!({"name": format!("<i>job {n}</i>"), "actor": actor, "steps": [
                {"tool": tool, "args": {"path": format!("ws/file-{n}.txt"), "content": "x"}},
            ]}),
        );
        let ran = project.run(&["run", "--plan", plan.to_str().expect("utf-8")]);
        assert_eq!(ran.status.code(), Some(0), "{}", describe(&ran));
    }
    let console = Console::start(&project, &[]);
    let (status, all) = console.get_json("/sagas");
    assert_eq!(status, 200, "{all}");
    let listed = all["sagas"].as_array().expect("a list");
    assert_eq!(listed.len(), 4);
    assert_eq!(all["next"], Value::Null);
    // Newest first, as `log` lists them.
    let (_, log) = project.run_json(&["log"]);
    let ids = |list: &[Value]| -> Vec<String> {
        list.iter()
            .map(|saga| saga["saga_id"].as_str().expect("id").to_owned())
            .collect()
    };
    assert_eq!(ids(listed), ids(log["sagas"].as_array().expect("a list")));
    assert_eq!(listed[0]["steps"], 1);
    assert_eq!(listed[0]["state"], "Done");
    assert_eq!(listed[0]["actor"], "alice");

    // Pages of one, each after the last.
    let mut seen = Vec::new();
    let mut path = "/sagas?limit=1".to_owned();
    loop {
        let (status, page) = console.get_json(&path);
        assert_eq!(status, 200, "{page}");
        seen.extend(ids(page["sagas"].as_array().expect("a list")));
        let Some(next) = page["next"].as_str() else {
            break;
        };
        path = format!("/sagas?limit=1&after={next}");
    }
    assert_eq!(seen, ids(listed));

    for (query, expected) in [
        ("actor=bob", 1),
        ("actor=alice&tool=fs.write", 3),
        ("tool=fs.append", 1),
        ("q=FILE-2", 1),
        ("q=file-", 4),
        ("state=Done", 4),
        ("state=Acting", 0),
    ] {
        let (status, page) = console.get_json(&format!("/sagas?{query}"));
        assert_eq!(status, 200, "{query}: {page}");
        assert_eq!(
            page["sagas"].as_array().expect("a list").len(),
            expected,
            "{query}"
        );
    }
    for query in [
        "state=Nowhere",
        "limit=0",
        "limit=100000",
        "after=yesterday",
    ] {
        let (status, answer) = console.get_json(&format!("/sagas?{query}"));
        assert_eq!(status, 422, "{query}: {answer}");
    }
    // The page: names are text, and the filters are kept in the next link.
    let bearer = console.bearer();
    let page = console.send(
        "GET",
        "/sagas?actor=alice&limit=2",
        &[("Authorization", &bearer)],
        "",
    );
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("&lt;i&gt;job 3&lt;/i&gt;"),
        "{}",
        page.body
    );
    assert!(!page.body.contains("<i>"), "{}", page.body);
    assert!(
        page.body
            .contains("href=\"/sagas?actor=alice&amp;limit=2&amp;after="),
        "{}",
        page.body
    );
}

#[test]
fn the_undo_preview_says_what_an_undo_would_do_and_undoes_nothing() {
    let project = Project::new();
    fs::write(project.path("sandbox.toml"), "[fs]\nallow = [\"ws\"]\n").expect("writes");
    fs::write(project.path("ws/a.txt"), "before").expect("writes");
    let plan = project.plan(
        "plan.json",
        &json!({"steps": [{"tool": "fs.write", "args": {"path": "ws/a.txt", "content": "after"}}]}),
    );
    let ran = project.run(&["--json", "run", "--plan", plan.to_str().expect("utf-8")]);
    let (code, report) = json_output(&ran);
    assert_eq!(code, 0, "{}", describe(&ran));
    let saga_id = report["saga_id"].as_str().expect("id").to_owned();
    let console = Console::start(&project, &[]);
    let path = format!("/sagas/{saga_id}/undo");
    let (status, preview) = console.get_json(&path);
    assert_eq!(status, 200, "{preview}");
    assert_eq!(preview["undoable"], true, "{preview}");
    assert_eq!(preview["steps"][0]["tool"], "fs.write");
    assert_eq!(preview["steps"][0]["undoable"], true);
    assert_eq!(preview["steps"][0]["reason"], Value::Null);
    // Someone else changes the file: the preview says so, and nothing is undone.
    fs::write(project.path("ws/a.txt"), "a person's edit").expect("writes");
    let (status, preview) = console.get_json(&path);
    assert_eq!(status, 200, "{preview}");
    assert_eq!(preview["undoable"], false, "{preview}");
    assert_eq!(preview["steps"][0]["undoable"], false);
    assert!(
        preview["steps"][0]["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("--force")),
        "{preview}"
    );
    let bearer = console.bearer();
    let page = console.send("GET", &path, &[("Authorization", &bearer)], "");
    assert_eq!(page.status, 200);
    assert!(page.body.contains("Nothing was undone"), "{}", page.body);
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        "a person's edit"
    );
    assert_eq!(project.latest_saga().expect("a saga").1, "Done");
    let (status, _) = console.get_json("/sagas/no-such-saga/undo");
    assert_eq!(status, 404);
}
