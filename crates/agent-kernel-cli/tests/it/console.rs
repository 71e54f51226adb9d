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
            .or_else(|| url.strip_prefix("https://"))
            .and_then(|rest| rest.strip_suffix('/'))
            .expect("http://ADDR/ or https://ADDR/")
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

    /// Signs in with the token, as a browser's form does; the session cookie (`NAME=VALUE`).
    fn sign_in(&self) -> String {
        let login = self.send(
            "POST",
            "/login",
            &[("Content-Type", "application/x-www-form-urlencoded")],
            &format!("token={}", self.token),
        );
        assert_eq!(login.status, 303, "{}", login.body);
        login
            .header("set-cookie")
            .split(';')
            .next()
            .expect("a cookie")
            .to_owned()
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
    pub(crate) fn post_json(&self, path: &str, body: &Value) -> (u16, Value) {
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

    // The inbox shows the saga's steps before the one that waits.
    let inbox = console.send(
        "GET",
        "/approvals",
        &[("Authorization", &console.bearer())],
        "",
    );
    assert!(
        inbox.body.contains("The saga&#39;s steps before it")
            || inbox.body.contains("The saga's steps before it"),
        "{}",
        inbox.body
    );
    assert!(inbox.body.contains("ws/a.txt"), "{}", inbox.body);

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
        assert!(!page.body.contains("<script>"), "{}", page.body);
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

/// A project whose one saga added `item` to the notes and then failed, its compensation
/// blocked (`ws/block`): one dead letter open, the saga `FailedRollbackPartial`.
fn dead_letter_project(item: &str) -> Project {
    let project = Project::new();
    fs::write(project.path("note.py"), crate::dlq::NOTE_PY).expect("writes");
    fs::write(project.path("tools.toml"), crate::dlq::TOOLS_TOML).expect("writes");
    fs::write(project.path("ws/block"), "").expect("writes");
    let plan = project.plan(
        "plan.json",
        &json!({"steps": [
            {"tool": "note.add", "args": {"item": item}},
            {"tool": "fault.fail", "args": {}},
        ]}),
    );
    let output = project.run(&["run", "--plan", plan.to_str().expect("utf-8")]);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    project
}

#[test]
fn dead_letters_are_listed_as_the_command_line_lists_them_and_resolved_once_with_a_note() {
    let project = dead_letter_project("<b>a</b>");
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
    // The command line's preview says the same of each step.
    let (code, cli) = project.run_json(&["undo", "--saga", &saga_id, "--preview"]);
    assert_eq!(code, 0, "{cli}");
    assert_eq!(preview["undoable"], cli["undoable"]);
    let steps = cli["steps"].as_array().expect("steps");
    assert_eq!(
        steps.len(),
        preview["steps"].as_array().expect("steps").len()
    );
    for (ours, theirs) in preview["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .zip(steps)
    {
        assert_eq!(ours["seq"], theirs["step_seq"], "{cli}");
        assert_eq!(ours["tool"], theirs["tool_id"], "{cli}");
        assert_eq!(ours["restores"], theirs["restores"], "{cli}");
        // A verdict with no detail prints as its name, others as `{"verdict", …}`.
        let verdict = theirs["verdict"]
            .as_str()
            .or_else(|| theirs["verdict"]["verdict"].as_str());
        assert_eq!(ours["undoable"], verdict == Some("undoable"), "{cli}");
    }
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
    assert!(
        page.body.contains("Nothing is undone until you confirm"),
        "{}",
        page.body
    );
    // The confirm form asks for `force` only now that the file changed.
    assert!(page.body.contains("name=\"force\""), "{}", page.body);
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        "a person's edit"
    );
    assert_eq!(project.latest_saga().expect("a saga").1, "Done");
    let (status, _) = console.get_json("/sagas/no-such-saga/undo");
    assert_eq!(status, 404);
}

/// A project whose one saga wrote `ws/a.txt` (`before` → `after`) and is `Done`; its id.
fn done_project() -> (Project, String) {
    let project = Project::new();
    fs::write(project.path("sandbox.toml"), "[fs]\nallow = [\"ws\"]\n").expect("writes");
    fs::write(project.path("ws/a.txt"), "before").expect("writes");
    let plan = project.plan(
        "plan.json",
        &json!({"name": "rewrite a", "steps": [{"tool": "fs.write", "args": {"path": "ws/a.txt", "content": "after"}}]}),
    );
    let ran = project.run(&["--json", "run", "--plan", plan.to_str().expect("utf-8")]);
    let (code, report) = json_output(&ran);
    assert_eq!(code, 0, "{}", describe(&ran));
    (project, report["saga_id"].as_str().expect("id").to_owned())
}

#[test]
fn an_undo_needs_a_reason_runs_as_the_command_line_s_and_records_who_asked() {
    let (project, saga_id) = done_project();
    let console = Console::start(&project, &["--operator", "erin"]);
    // The list's filters by name and by a window of creation (UTC).
    for (query, expected) in [
        ("name=rewrite+a", 1),
        ("name=rewrite", 0),
        ("from=2000-01-01&until=2999-12-31T23:59", 1),
        ("until=2000-01-01", 0),
        ("from=2999-01-01T00:00:00Z", 0),
    ] {
        let (status, page) = console.get_json(&format!("/sagas?{query}"));
        assert_eq!(status, 200, "{query}: {page}");
        assert_eq!(
            page["sagas"].as_array().expect("a list").len(),
            expected,
            "{query}"
        );
    }
    for bad in ["from=yesterday", "until=2026-02-30"] {
        let (status, answer) = console.get_json(&format!("/sagas?{bad}"));
        assert_eq!(status, 422, "{bad}: {answer}");
    }
    let path = format!("/sagas/{saga_id}/undo");
    let (status, answer) = console.post_json(&path, &json!({}));
    assert_eq!(status, 422, "{answer}");
    // What it left changed: refused without `force`, nothing undone.
    fs::write(project.path("ws/a.txt"), "a person's edit").expect("writes");
    let (status, answer) = console.post_json(&path, &json!({"reason": "wrong file"}));
    assert_eq!(status, 409, "{answer}");
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        "a person's edit"
    );
    assert_eq!(project.latest_saga().expect("a saga").1, "Done");
    fs::write(project.path("ws/a.txt"), "after").expect("writes");

    // A browser's undo: the session's CSRF token, then the timeline.
    let cookie = console.sign_in();
    let preview = console.send("GET", &path, &[("Cookie", &cookie)], "");
    assert!(
        preview.body.contains(&format!("action=\"{path}\"")),
        "{}",
        preview.body
    );
    let csrf = form_csrf(&preview.body);
    let refused = console.send(
        "POST",
        &path,
        &[
            ("Cookie", &cookie),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        "reason=no+csrf",
    );
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert_eq!(project.latest_saga().expect("a saga").1, "Done");
    let undone = console.send(
        "POST",
        &path,
        &[
            ("Cookie", &cookie),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        &format!("csrf={csrf}&reason=the+agent+misread+the+ticket"),
    );
    assert_eq!(undone.status, 303, "{}", undone.body);
    assert_eq!(undone.header("location"), format!("/sagas/{saga_id}"));
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        "before"
    );
    assert_eq!(project.latest_saga().expect("a saga").1, "Undone");
    let (status, record) = console.get_json(&format!("/sagas/{saga_id}"));
    assert_eq!(status, 200);
    let (_, logged) = project.run_json(&["log", "--saga", &saga_id]);
    assert_eq!(record, logged);
    // Its audit records, as the command line lists them, the undo among them.
    let (status, audit) = console.get_json(&format!("/sagas/{saga_id}/audit"));
    assert_eq!(status, 200, "{audit}");
    let (_, listed) = project.run_json(&["audit", "list", "--saga", &saga_id, "--limit", "200"]);
    assert_eq!(audit, listed);
    assert!(
        audit.to_string().contains("the agent misread the ticket"),
        "{audit}"
    );
    let page = console.send(
        "GET",
        &format!("/sagas/{saga_id}/audit"),
        &[("Cookie", &cookie)],
        "",
    );
    assert!(page.body.contains("Audit records of saga"), "{}", page.body);
    let (status, _) = console.get_json("/sagas/no-such-saga/audit");
    assert_eq!(status, 404);
    let (_, audit) = project.run_json(&["audit", "list", "--kind", "Operator", "--limit", "1"]);
    let text = audit.to_string();
    assert!(text.contains("undo") && text.contains("erin"), "{audit}");
    let (status, _) = console.post_json("/sagas/no-such-saga/undo", &json!({"reason": "x"}));
    assert_eq!(status, 404);
}

#[test]
fn a_dead_letter_is_retried_from_the_console_and_a_tampered_log_undoes_nothing() {
    let project = dead_letter_project("a");
    let console = Console::start(&project, &["--operator", "dave"]);
    let (_, listed) = console.get_json("/dead-letters");
    let id = listed["dead_letters"][0]["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    let retry = format!("/dead-letters/{id}/retry");
    // Still blocked: it fails again, and stays open with one more attempt.
    let (status, answer) = console.post_json(&retry, &json!({}));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["status"], "open", "{answer}");
    let (_, listed) = console.get_json("/dead-letters");
    assert_eq!(listed["dead_letters"][0]["attempts"], 2, "{listed}");
    fs::remove_file(project.path("ws/block")).expect("unblocks");
    let (status, answer) = console.post_json(&retry, &json!({"force": false}));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["id"], id.as_str());
    assert_eq!(answer["status"], "retried", "{answer}");
    assert_eq!(answer["saga_state"], "FailedRolledBack", "{answer}");
    assert_eq!(
        fs::read_to_string(project.path("ws/notes.txt")).expect("reads"),
        ""
    );
    let (status, answer) = console.post_json(&retry, &json!({}));
    assert_eq!(status, 409, "{answer}");
    let (_, audit) = project.run_json(&[
        "audit",
        "list",
        "--kind",
        "DeadLetterSettled",
        "--limit",
        "1",
    ]);
    assert!(audit.to_string().contains("dave"), "{audit}");

    // The chain verifies as the command line says; then a record is edited behind the
    // console's back: the check names it, and nothing is retried or undone.
    let (status, verified) = console.post_json("/audit/verify", &json!({}));
    assert_eq!(status, 200, "{verified}");
    let (code, cli) = project.run_json(&["audit", "verify"]);
    assert_eq!(code, 0, "{cli}");
    assert_eq!(verified, cli);
    assert_eq!(verified["ok"], true);
    let db = rusqlite::Connection::open(project.db()).expect("opens");
    db.execute("UPDATE audit_log SET at_ms = at_ms + 1 WHERE seq = 3", [])
        .expect("edits");
    drop(db);
    let (status, verified) = console.post_json("/audit/verify", &json!({}));
    assert_eq!(status, 200, "{verified}");
    assert_eq!(verified["ok"], false, "{verified}");
    assert_eq!(verified["first_bad"]["seq"], 3, "{verified}");
    let bearer = console.bearer();
    let overview = console.send("GET", "/", &[("Authorization", &bearer)], "");
    assert!(
        overview.body.contains("Record 3 is bad"),
        "{}",
        overview.body
    );
    let (status, answer) = console.post_json(&retry, &json!({}));
    assert_eq!(status, 409, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("record 3")),
        "{answer}"
    );
}

#[test]
fn a_console_without_a_policy_reads_and_decides_but_compensates_nothing() {
    let (project, saga_id) = done_project();
    fs::remove_file(project.path("sandbox.toml")).expect("removes");
    let console = Console::start(&project, &[]);
    let (status, _) = console.get_json(&format!("/sagas/{saga_id}"));
    assert_eq!(status, 200);
    let (status, answer) =
        console.post_json(&format!("/sagas/{saga_id}/undo"), &json!({"reason": "x"}));
    assert_eq!(status, 409, "{answer}");
    assert!(answer.to_string().contains("--sandbox"), "{answer}");
    assert_eq!(project.latest_saga().expect("a saga").1, "Done");
}

/// `GET /events`, its answer's head read: from here on every change is sent to it.
struct EventStream(BufReader<TcpStream>);

impl EventStream {
    fn open(console: &Console) -> Self {
        let mut stream = TcpStream::connect(&console.address).expect("connects");
        let request = format!(
            "GET /events HTTP/1.1\r\nHost: {}\r\nAuthorization: {}\r\nAccept: text/event-stream\r\n\r\n",
            console.address,
            console.bearer()
        );
        stream.write_all(request.as_bytes()).expect("sends");
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).expect("reads the status");
        assert!(line.starts_with("HTTP/1.1 200"), "{line}");
        while line.trim_end() != "" {
            line.clear();
            reader.read_line(&mut line).expect("reads a header");
        }
        reader
            .get_ref()
            .set_read_timeout(Some(std::time::Duration::from_millis(200)))
            .expect("a timeout");
        Self(reader)
    }

    /// The `data:` of each event, until `done` holds for those read or `max` passes.
    fn until(
        mut self,
        max: std::time::Duration,
        mut done: impl FnMut(&[Value]) -> bool,
    ) -> Vec<Value> {
        let deadline = std::time::Instant::now() + max;
        let mut events = Vec::new();
        let mut line = String::new();
        while std::time::Instant::now() < deadline && !done(&events) {
            match self.0.read_line(&mut line) {
                Ok(0) => break,
                Ok(_) if line.ends_with('\n') => {
                    if let Some(data) = line.trim_end().strip_prefix("data: ") {
                        events.push(serde_json::from_str(data).expect("JSON data"));
                    }
                    line.clear();
                }
                Ok(_) => {}
                Err(error)
                    if matches!(
                        error.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(error) => panic!("{error}"),
            }
        }
        events
    }
}

#[test]
fn live_events_tell_of_a_new_request_its_decision_and_the_saga_s_end() {
    let (project, saga_id, approval_id) = waiting_project("");
    let console = Console::start(&project, &[]);
    let stream = EventStream::open(&console);
    let watcher = std::thread::spawn(move || {
        stream.until(std::time::Duration::from_secs(60), |events| {
            events
                .iter()
                .any(|event| event["type"] == "saga" && event["state"] == "Done")
                && events.iter().any(|event| event["type"] == "approval")
        })
    });
    // Whatever process makes the change: the command line decides, then resumes.
    let (code, decided) = project.run_json(&["approve", &approval_id]);
    assert_eq!(code, 0, "{decided}");
    let (code, resumed) = project.run_json(&["resume", "--saga", &saga_id]);
    assert_eq!(code, 0, "{resumed}");
    let events = watcher.join().expect("the watcher");
    assert!(
        events.iter().any(|event| event["type"] == "approval"
            && event["id"] == approval_id.as_str()
            // Resumed within one look of the watcher, it may be seen used already.
            && (event["status"] == "approved" || event["status"] == "consumed")),
        "{events:?}"
    );
    assert!(
        events.iter().any(|event| event["type"] == "saga"
            && event["saga_id"] == saga_id.as_str()
            && event["state"] == "Done"),
        "{events:?}"
    );
    let refused = console.send("GET", "/events", &[], "");
    assert_eq!(refused.status, 401);
    // A browser's page loads the script; a bearer's answer has no use for it.
    let cookie = console.sign_in();
    let page = console.send("GET", "/", &[("Cookie", &cookie)], "");
    assert!(
        page.body.contains("src=\"/assets/console.js\""),
        "{}",
        page.body
    );
    let script = console.send("GET", "/assets/console.js", &[], "");
    assert_eq!(script.status, 200);
    assert!(script.body.contains("EventSource(\"/events\")"));

    // A browser listening does not keep SIGTERM from stopping the console.
    let _listening = EventStream::open(&console);
    let mut console = console;
    let pid = rustix::process::Pid::from_child(&console.child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("signals");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = console.child.try_wait().expect("waits") {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the console still runs 20 s after SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
}

/// A self-signed certificate for `localhost` and 127.0.0.1, written to `cert.pem` and
/// `key.pem` in the project; a TLS client configuration that trusts it.
fn certificate(project: &Project) -> std::sync::Arc<tokio_rustls::rustls::ClientConfig> {
    use tokio_rustls::rustls;
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .expect("a certificate");
    fs::write(project.path("cert.pem"), cert.pem()).expect("writes");
    fs::write(project.path("key.pem"), signing_key.serialize_pem()).expect("writes");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).expect("a root");
    std::sync::Arc::new(
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
}

/// One request over TLS to `address`, naming `host`, its `head` (request line and
/// headers) and `body`; the raw answer.
fn https(
    config: &std::sync::Arc<tokio_rustls::rustls::ClientConfig>,
    address: &str,
    host: &str,
    head: &str,
    body: &str,
) -> String {
    use tokio_rustls::rustls;
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("a name");
    let connection = rustls::ClientConnection::new(config.clone(), name).expect("a connection");
    let socket = TcpStream::connect(address).expect("connects");
    let mut stream = rustls::StreamOwned::new(connection, socket);
    let request = format!(
        "{head}\r\nHost: {host}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).expect("sends");
    let mut answer = Vec::new();
    // A peer that closes without `close_notify` is still an answer read whole.
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8(answer).expect("utf-8")
}

#[test]
fn over_tls_the_console_answers_https_only_and_may_listen_beyond_loopback() {
    let (project, _) = done_project();
    let client = certificate(&project);
    fs::write(
        project.path("console.token"),
        "a-token-of-32-characters-or-so-x\n",
    )
    .expect("writes");
    let tls = ["--tls-cert", "cert.pem", "--tls-key", "key.pem"];
    let console = Console::start(&project, &tls);
    let bearer = console.bearer();
    let answer = https(
        &client,
        &console.address,
        &console.address,
        &format!("GET / HTTP/1.1\r\nAccept: application/json\r\nAuthorization: {bearer}"),
        "",
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"counts\""), "{answer}");
    let login = https(
        &client,
        &console.address,
        &console.address,
        "POST /login HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded",
        &format!("token={}", console.token),
    );
    assert!(login.contains("; Secure"), "{login}");
    // Plain HTTP on the TLS port gets no HTTP answer.
    let mut plain = TcpStream::connect(&console.address).expect("connects");
    plain
        .write_all(format!("GET /healthz HTTP/1.1\r\nHost: {}\r\n\r\n", console.address).as_bytes())
        .expect("sends");
    let mut raw = Vec::new();
    let _ = plain.read_to_end(&mut raw);
    assert!(
        !raw.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&raw)
    );
    drop(console);

    // Beyond loopback: only with a token file and TLS.
    for args in [
        vec!["--listen", "0.0.0.0:0"],
        vec!["--listen", "0.0.0.0:0", "--token-file", "console.token"],
        vec!["--listen", "0.0.0.0:0"]
            .into_iter()
            .chain(tls)
            .collect(),
        vec!["--tls-cert", "cert.pem", "--tls-key", "plan.json"],
    ] {
        let mut all = vec!["serve"];
        all.extend(args.iter().copied());
        let output = project.run(&all);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            describe(&output)
        );
    }
    let mut all = vec![
        "--json",
        "serve",
        "--listen",
        "0.0.0.0:0",
        "--token-file",
        "console.token",
    ];
    all.extend(tls);
    let wide = Console::spawn(&project, project.command(&all));
    let port = wide.address.rsplit_once(':').expect("a port").1.to_owned();
    // Reached by another name than loopback's: the certificate, not the name, is the check.
    let answer = https(
        &client,
        &format!("127.0.0.1:{port}"),
        &format!("console.example:{port}"),
        &format!(
            "GET / HTTP/1.1\r\nAccept: application/json\r\nAuthorization: {}",
            wide.bearer()
        ),
        "",
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[test]
fn an_undo_whose_browser_goes_away_still_finishes_and_releases_what_it_claimed() {
    let project = Project::new();
    // `note.add`, whose compensation takes a while: long enough for the client to leave.
    let slow = crate::dlq::NOTE_PY.replace(
        "elif request[\"phase\"] == \"compensate\":",
        "elif request[\"phase\"] == \"compensate\":\n    import time; time.sleep(1.5)",
    );
    assert_ne!(slow, crate::dlq::NOTE_PY);
    fs::write(project.path("note.py"), slow).expect("writes");
    fs::write(project.path("tools.toml"), crate::dlq::TOOLS_TOML).expect("writes");
    let plan = project.plan(
        "plan.json",
        &json!({"steps": [{"tool": "note.add", "args": {"item": "a"}}]}),
    );
    let ran = project.run(&["--json", "run", "--plan", plan.to_str().expect("utf-8")]);
    let (code, report) = json_output(&ran);
    assert_eq!(code, 0, "{}", describe(&ran));
    let saga_id = report["saga_id"].as_str().expect("id").to_owned();
    let console = Console::start(&project, &[]);
    // Ask for the undo, then hang up before the answer.
    {
        let body = json!({"reason": "wrong note"}).to_string();
        let mut stream = TcpStream::connect(&console.address).expect("connects");
        let request = format!(
            "POST /sagas/{saga_id}/undo HTTP/1.1\r\nHost: {}\r\nAuthorization: {}\r\nAccept: application/json\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            console.address,
            console.bearer(),
            body.len()
        );
        stream.write_all(request.as_bytes()).expect("sends");
        // The request reached the console once the saga holds its locks again.
        crate::wait_until("the undo to begin", || {
            let (_, record) = project.run_json(&["log", "--saga", &saga_id]);
            record["locks"]
                .as_array()
                .is_some_and(|locks| !locks.is_empty())
        });
    }
    crate::wait_until("the undo to finish without its client", || {
        let (_, record) = project.run_json(&["log", "--saga", &saga_id]);
        record["state"] == "Undone" && record["locks"] == json!([])
    });
    assert_eq!(
        fs::read_to_string(project.path("ws/notes.txt")).expect("reads"),
        ""
    );
    // And the console still answers.
    let (status, _) = console.get_json("/");
    assert_eq!(status, 200);
    // A path with an empty saga id names none: 404, no panic.
    for (method, path) in [
        ("GET", "/sagas//undo"),
        ("GET", "/sagas//audit"),
        ("POST", "/sagas//undo"),
    ] {
        let answer = console.send(
            method,
            path,
            &[
                ("Authorization", &console.bearer()),
                ("Accept", "application/json"),
                ("Content-Type", "application/json"),
            ],
            "{\"reason\": \"x\"}",
        );
        assert_eq!(answer.status, 404, "{method} {path}: {}", answer.body);
    }
}
