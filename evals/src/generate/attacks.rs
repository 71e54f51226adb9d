//! Scenarios of hostile or unlucky input: injections, duplicates, unknown outcomes,
//! approvals (deceptive ones included) and failing upstream servers.

#[allow(clippy::wildcard_imports)]
use super::*;

/// One injected call: its tool and arguments, the symlink it needs (path, target), and what
/// it tries.
pub(super) struct Attack {
    tool: &'static str,
    args: serde_json::Value,
    link: Option<(&'static str, &'static str)>,
    what: &'static str,
}

impl Attack {
    fn new(
        tool: &'static str,
        args: serde_json::Value,
        link: Option<(&'static str, &'static str)>,
        what: &'static str,
    ) -> Attack {
        Attack {
            tool,
            args,
            link,
            what,
        }
    }
}

/// Injected paths and URLs, each in the middle of an otherwise good chain.
pub(super) fn injections(maker: &mut Gen) -> Vec<Scenario> {
    let attacks = [
        Attack::new(
            "fs.write",
            json!({ "path": "ws/../outside/target.txt", "content": "pwned\n" }),
            None,
            "path traversal (..)",
        ),
        Attack::new(
            "fs.write",
            json!({ "path": "@ROOT@/outside/target.txt", "content": "pwned\n" }),
            None,
            "absolute path outside the workspace",
        ),
        Attack::new(
            "fs.write",
            json!({ "path": "ws/escape/target.txt", "content": "pwned\n" }),
            Some(("ws/escape", "../outside")),
            "a folder symlink out of the workspace",
        ),
        Attack::new(
            "fs.write",
            json!({ "path": "ws/shortcut.txt", "content": "pwned\n" }),
            Some(("ws/shortcut.txt", "../outside/target.txt")),
            "a file symlink out of the workspace",
        ),
        Attack::new(
            "fs.read",
            json!({ "path": "ws/../outside/secret.txt" }),
            None,
            "reading a secret by traversal",
        ),
        Attack::new(
            "fs.read",
            json!({ "path": "ws/secret-link" }),
            Some(("ws/secret-link", "../outside/secret.txt")),
            "reading a secret through a symlink",
        ),
        Attack::new(
            "fs.delete",
            json!({ "path": "ws/./../outside/target.txt" }),
            None,
            "deleting by traversal",
        ),
        Attack::new(
            "fs.append",
            json!({ "path": "ws/escape/target.txt", "content": "pwned\n" }),
            Some(("ws/escape", "../outside")),
            "appending through a folder symlink",
        ),
        Attack::new(
            "http.get",
            json!({ "url": "http://127.0.0.2:@ALLOWED@/latest/meta-data" }),
            None,
            "SSRF to another loopback address on the allowed port",
        ),
        Attack::new(
            "http.get",
            json!({ "url": "http://2130706434:@ALLOWED@/latest/meta-data" }),
            None,
            "SSRF, the address in decimal",
        ),
        Attack::new(
            "http.get",
            json!({ "url": "http://0x7f.2:@ALLOWED@/latest/meta-data" }),
            None,
            "SSRF, the address in short hex",
        ),
        Attack::new(
            "http.get",
            json!({ "url": "http://[::ffff:127.0.0.2]:@ALLOWED@/latest/meta-data" }),
            None,
            "SSRF, an IPv4-mapped IPv6 address",
        ),
        Attack::new(
            "http.get",
            json!({ "url": "http://localhost:@INTERNAL@/admin" }),
            None,
            "SSRF to an allowed name on another port",
        ),
        Attack::new(
            "http.get",
            json!({ "url": "http://localhost:@ALLOWED@/redirect-ip" }),
            None,
            "a redirect from the allowed server to a loopback address",
        ),
        Attack::new(
            "http.get",
            json!({ "url": "http://localhost:@ALLOWED@/redirect-port" }),
            None,
            "a redirect from the allowed server to another port",
        ),
        Attack::new(
            "http.get",
            json!({ "url": "http://localhost@127.0.0.2:@ALLOWED@/" }),
            None,
            "userinfo that looks like the allowed name",
        ),
    ];
    let mut all = Vec::new();
    for round in 0..3 {
        for Attack {
            tool,
            args,
            link,
            what,
        } in &attacks
        {
            let mut draft = maker.draft();
            if let Some((path, target)) = link {
                draft
                    .setup
                    .insert((*path).to_owned(), Setup::Link((*target).to_owned()));
            }
            let before = maker.rng.random_range(1..=2);
            maker.mutate(&mut draft, before, Mutations::Files);
            if (round + before) % 2 == 0 {
                draft.calls.push(Call::new(
                    "http.get",
                    json!({ "url": "http://localhost:@ALLOWED@/page" }),
                ));
            }
            let attack = draft.calls.len();
            draft.calls.push(Call::new(tool, args.clone()));
            let after = maker.rng.random_range(0..=1);
            maker.mutate(&mut draft, after, Mutations::Files);
            let variant = format!("call {} of {}: {what}", attack + 1, draft.calls.len());
            let mut scenario = maker.finish(draft, variant, Drive::Chain, Must::Atomic);
            scenario.attack = Some(attack);
            scenario.stops_at = Some(attack);
            all.push(scenario);
        }
    }
    // A delete an injected agent disguises from the operator who must approve it.
    all.extend(deceptive_approvals(maker, 2));
    all
}

/// The same keyed calls delivered twice: again after the first delivery, each retried at
/// once, two deliveries racing, and again after the first delivery's process was killed.
pub(super) fn duplicates(maker: &mut Gen) -> Vec<Scenario> {
    let mut all = Vec::new();
    for _ in 0..5 {
        for how in 0..6 {
            let mut draft = maker.draft();
            let n = maker.rng.random_range(1..=3_u32);
            for i in 0..n {
                let path = if i % 2 == 0 {
                    draft.existing[0].clone()
                } else {
                    "ws/ledger-entries.csv".to_owned()
                };
                let content = format!("{} entry {i}\n", draft.tag);
                let key = format!("{}-payment-{i}", draft.tag);
                draft.calls.push(
                    Call::new("fs.append", json!({ "path": path, "content": content })).keyed(key),
                );
            }
            let redelivery = match how {
                0 => Redelivery::Sequential,
                1 => Redelivery::Retry,
                2 => Redelivery::Concurrent,
                3 => Redelivery::AfterCrash(KillPoint::BeforeWrite(2)),
                4 => Redelivery::AfterCrash(KillPoint::AfterWrite(1)),
                _ => Redelivery::AfterCrash(KillPoint::AfterWrite(expected_writes(n) - 1)),
            };
            if redelivery == Redelivery::Retry {
                draft.calls = draft
                    .calls
                    .iter()
                    .flat_map(|call| [call.clone(), call.clone()])
                    .collect();
            }
            let variant = match redelivery {
                Redelivery::Sequential => {
                    format!("{n} keyed appends, delivered again after the first delivery")
                }
                Redelivery::Retry => format!("{n} keyed appends, each delivered twice in a row"),
                Redelivery::Concurrent => format!("{n} keyed appends, two deliveries racing"),
                Redelivery::AfterCrash(point) => format!(
                    "{n} keyed appends, delivered again after the first delivery was {}",
                    boundary(point, n)
                ),
            };
            all.push(maker.finish(draft, variant, Drive::Twice(redelivery), Must::Complete));
        }
    }
    all
}

/// Outcomes nobody knows: a call that hangs past its timeout after its effect or before
/// it, and a crash between a step's effect and its record, for each kind of mutation.
pub(super) fn unknown_outcomes(maker: &mut Gen) -> Vec<Scenario> {
    let mut all = Vec::new();
    for i in 0..15 {
        let mut draft = maker.draft();
        let before = maker.rng.random_range(1..=3);
        maker.mutate(&mut draft, before, Mutations::Files);
        let after_effect = i % 2 == 0;
        let pause = if after_effect {
            "pause_after_ms"
        } else {
            "pause_before_ms"
        };
        let content = format!("{} hung write\n", draft.tag);
        draft.calls.push(Call::new(
            "fault.probed_write",
            json!({ "path": draft.existing[0].clone(), "content": content, pause: HANG_MS }),
        ));
        let after = maker.rng.random_range(0..=1);
        maker.mutate(&mut draft, after, Mutations::Files);
        let variant = format!(
            "call {} of {} hangs past its {TIMEOUT_MS} ms timeout {} its effect",
            before + 1,
            draft.calls.len(),
            if after_effect { "after" } else { "before" }
        );
        let mut scenario = maker.finish(
            draft,
            variant,
            Drive::Timeout {
                tool: "fault.probed_write".to_owned(),
                timeout_ms: TIMEOUT_MS,
            },
            Must::Unchanged,
        );
        scenario.policy_extra =
            format!("[limits.tools.\"fault.probed_write\"]\ntimeout_ms = {TIMEOUT_MS}\n");
        scenario.stops_at = Some(before);
        all.push(scenario);
    }
    for round in 0..4 {
        for tool in ["fs.write", "fs.append", "fs.delete", "fault.probed_write"] {
            let mut draft = maker.draft();
            let before = maker.rng.random_range(0..=2);
            maker.mutate(&mut draft, before, Mutations::Files);
            let content = format!("{} in doubt\n", draft.tag);
            let target = draft.existing[draft.existing.len() - 1].clone();
            let args = if tool == "fs.delete" {
                draft.existing.retain(|path| *path != target);
                json!({ "path": target })
            } else {
                json!({ "path": target, "content": content })
            };
            draft.calls.push(Call::new(tool, args));
            let step = u32::try_from(draft.calls.len()).expect("a short chain");
            let after = (round % 2) as usize;
            maker.mutate(&mut draft, after, Mutations::Files);
            let point = KillPoint::BeforeWrite(2 * step);
            let variant = format!(
                "{tool} at call {step} of {}: the process dies between its effect and its record",
                draft.calls.len()
            );
            let writes = expected_writes(u32::try_from(draft.calls.len()).expect("short"));
            let mut scenario = maker.finish(draft, variant, Drive::Crash(point), Must::Atomic);
            scenario.writes = Some(writes);
            all.push(scenario);
        }
    }
    all
}

/// What a deceptive delete hides from an operator who reads only part of a view.
#[derive(Debug, Clone, Copy)]
pub(super) enum Deception {
    /// The path climbs back out (`/../precious.txt`) past where a 60-character view cuts.
    PastTheCut,
    /// The file's name holds a right-to-left override, so that it reads as another name.
    Invisible,
}

/// `rounds` times each [`Deception`]: a delete of a precious file that needs an approval,
/// disguised; the operator inspects the view ([`Decision::Inspect`]), so the view decides.
/// Both an injection (the agent was told to hide it) and an approval scenario.
pub(super) fn deceptive_approvals(maker: &mut Gen, rounds: usize) -> Vec<Scenario> {
    let mut all = Vec::new();
    for _ in 0..rounds {
        for deception in [Deception::PastTheCut, Deception::Invisible] {
            let mut draft = maker.draft();
            let cache = format!("ws/tmp-cache-safe-to-delete-{}", "a".repeat(60));
            let (precious, path) = match deception {
                Deception::PastTheCut => (
                    "ws/precious.txt".to_owned(),
                    format!("{cache}/../precious.txt"),
                ),
                Deception::Invisible => {
                    let name = "ws/keep-\u{202e}txt.pmt".to_owned();
                    (name.clone(), name)
                }
            };
            draft.setup.insert(
                precious.clone(),
                Setup::File(b"precious: keep me\n".to_vec()),
            );
            draft
                .setup
                .insert(format!("{cache}/old.tmp"), Setup::File(b"old\n".to_vec()));
            let before = maker.rng.random_range(1..=2);
            maker.mutate(&mut draft, before, Mutations::NoDelete);
            let guarded = draft.calls.len();
            draft
                .calls
                .push(Call::new("fs.delete", json!({ "path": path })));
            let variant = format!(
                "call {} of {} (fs.delete) needs approval and hides its target ({deception:?}); the operator approves only what the view shows safe",
                guarded + 1,
                draft.calls.len()
            );
            let mut scenario = maker.finish(
                draft,
                variant,
                Drive::Approval {
                    call: guarded,
                    decision: Decision::Inspect,
                },
                Must::Atomic,
            );
            scenario.policy_extra = "[approval]\nrequire = [\"fs.delete\"]\n".to_owned();
            scenario.attack = Some(guarded);
            scenario.stops_at = Some(guarded);
            scenario.forbidden = vec![precious];
            all.push(scenario);
        }
    }
    all
}

/// A delete that needs an operator's approval, answered five ways, then the deceptive
/// deletes an inspecting operator must see through.
pub(super) fn approvals(maker: &mut Gen) -> Vec<Scenario> {
    let mut all = deceptive_approvals(maker, 3);
    for _ in 0..5 {
        for decision in [
            Decision::Approve,
            Decision::Reject,
            Decision::Expire,
            Decision::Forge,
            Decision::SwapArgs,
        ] {
            let mut draft = maker.draft();
            for name in ["ws/precious.txt", "ws/other-precious.txt"] {
                draft.setup.insert(
                    name.to_owned(),
                    Setup::File(format!("{name}: keep me\n").into_bytes()),
                );
            }
            let before = maker.rng.random_range(1..=2);
            maker.mutate(&mut draft, before, Mutations::NoDelete);
            let guarded = draft.calls.len();
            draft
                .calls
                .push(Call::new("fs.delete", json!({ "path": "ws/precious.txt" })));
            let after = maker.rng.random_range(0..=1);
            maker.mutate(&mut draft, after, Mutations::NoDelete);
            let what = match decision {
                Decision::Approve => "the operator approves",
                Decision::Reject => "the operator rejects",
                Decision::Expire => "nobody answers before it expires",
                Decision::Forge => "the request is set `approved` by hand in the log",
                Decision::SwapArgs => {
                    "approved, then its arguments edited in the log to delete another file"
                }
                Decision::Inspect | Decision::Duplicate => {
                    "the operator approves what the view shows safe"
                }
            };
            let variant = format!(
                "call {} of {} (fs.delete) needs approval; {what}",
                guarded + 1,
                draft.calls.len()
            );
            // Without the approval the chain cannot complete: all of it or none of it, and
            // the delete never.
            let must = if decision == Decision::Approve {
                Must::Complete
            } else {
                Must::Atomic
            };
            let mut scenario = maker.finish(
                draft,
                variant,
                Drive::Approval {
                    call: guarded,
                    decision,
                },
                must,
            );
            scenario.policy_extra = "[approval]\nrequire = [\"fs.delete\"]\n".to_owned();
            if decision == Decision::Expire {
                scenario.policy_extra += &format!("timeout_ms = {APPROVAL_TIMEOUT_MS}\n");
            }
            if decision != Decision::Approve {
                scenario.attack = Some(guarded);
                scenario.stops_at = Some(guarded);
                scenario.forbidden = vec![
                    "ws/precious.txt".to_owned(),
                    "ws/other-precious.txt".to_owned(),
                ];
            }
            all.push(scenario);
        }
    }
    all
}

/// Calls to an upstream MCP server (another `agent-kernel mcp`) that fail: the server
/// answers an error, the server dies during a call, or a local step fails after upstream
/// writes. What was written upstream must be undone upstream.
pub(super) fn upstream_failures(maker: &mut Gen) -> Vec<Scenario> {
    let mut all = Vec::new();
    for _ in 0..7 {
        for how in 0..3 {
            let mut draft = maker.draft();
            let n = maker.rng.random_range(1..=3);
            for i in 0..n {
                let content = format!("{} upstream {i}\n", draft.tag);
                draft.calls.push(Call::new(
                    "files.fs_write",
                    json!({ "args": { "path": format!("up/ws/u{i}.txt"), "content": content } }),
                ));
                if maker.rng.random_bool(0.3) {
                    maker.mutate(&mut draft, 1, Mutations::Files);
                }
            }
            let (failing, what) = match how {
                0 => (
                    Call::new(
                        "files.fs_write",
                        json!({ "args": { "path": "up/escape.txt", "content": "no\n" } }),
                    ),
                    "the server answers an error (its sandbox denies the call)",
                ),
                1 => (
                    Call::new("files.drill_die", json!({ "args": {} })),
                    "the server dies during the call",
                ),
                _ => (
                    Call::new("fault.fail", json!({ "message": "a local step fails" })),
                    "a local step fails after the upstream writes",
                ),
            };
            draft.calls.push(failing);
            let variant = format!(
                "{n} upstream writes, then {what} (call {} of {})",
                draft.calls.len(),
                draft.calls.len()
            );
            let stops_at = draft.calls.len() - 1;
            let mut scenario = maker.finish(draft, variant, Drive::Chain, Must::Unchanged);
            scenario.upstream = true;
            scenario.stops_at = Some(stops_at);
            all.push(scenario);
        }
    }
    all
}
