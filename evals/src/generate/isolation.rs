//! Scenarios of sagas side by side: agents that read and then write the same file or
//! account, their calls interleaved, one of them failing or killed; and an agent that,
//! restarted, makes a payment again in other words.

#[allow(clippy::wildcard_imports)]
use super::*;

/// What an account holds before a scenario, in the accounts' files.
pub(crate) const OPENING_BALANCE: u64 = 1_000;

/// The interleavings of each pair of chains that a scenario kind samples.
const SCHEDULES_PER_PAIR: usize = 6;

/// What two agents share.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shared {
    /// A file, read with `fs.read` and written whole with `fs.write`.
    File,
    /// An account, read with `acct.get` and set with `acct.set` (a command tool that
    /// claims `acct:NAME`).
    Account,
}

/// The resource a call reads or writes (a path, an account), if it touches one.
pub(crate) fn resource_of(call: &Call) -> Option<&str> {
    call.args
        .get("path")
        .or_else(|| call.args.get("account"))
        .and_then(serde_json::Value::as_str)
}

/// Whether a call writes (rather than reads) its resource.
pub(crate) fn writes(call: &Call) -> bool {
    matches!(call.tool.as_str(), "fs.write" | "acct.set")
}

/// Whether an agent's calls end with a failing call (then it has no commit turn).
pub(crate) fn fails(calls: &[Call]) -> bool {
    calls.last().is_some_and(|call| call.tool == "fault.fail")
}

/// How many turns an agent takes: its calls, and its commit unless its last call fails.
pub(crate) fn turns(calls: &[Call]) -> usize {
    calls.len() + usize::from(!fails(calls))
}

/// Agents that interleave: pairs of read-then-write chains on one file or one account
/// (the other agent failing after its write in some), sampled interleavings of their
/// turns; pairs on two different resources, which never meet; and an agent SIGKILLed with
/// the resource in hand (before its write's record, after it, after `Done`) while the
/// other reads and writes it.
pub(super) fn isolations(maker: &mut Gen) -> Vec<Scenario> {
    let mut all = Vec::new();
    for shared in [Shared::File, Shared::Account] {
        for second_fails in [false, true] {
            let draft = maker.shared_draft(shared);
            let a = agent(&draft, shared, 0, 0, false);
            let b = agent(&draft, shared, 1, 0, second_fails);
            let agents = vec![a, b];
            let mut schedules = interleavings(&agents);
            schedules.shuffle(&mut maker.rng);
            for schedule in schedules.into_iter().take(SCHEDULES_PER_PAIR) {
                let variant = format!(
                    "two agents read and write one {} ({}), turns {}",
                    shared.noun(),
                    if second_fails {
                        "the second fails after its write"
                    } else {
                        "both commit"
                    },
                    spelled(&agents, &schedule)
                );
                all.push(maker.agents_scenario(&draft, agents.clone(), schedule, None, variant));
            }
        }
        // Two different resources: never a conflict, whatever the order.
        let draft = maker.shared_draft(shared);
        let agents = vec![
            agent(&draft, shared, 0, 0, false),
            agent(&draft, shared, 1, 1, false),
        ];
        let mut schedules = interleavings(&agents);
        schedules.shuffle(&mut maker.rng);
        for schedule in schedules.into_iter().take(2) {
            let variant = format!(
                "two agents on two different {}s, turns {}",
                shared.noun(),
                spelled(&agents, &schedule)
            );
            all.push(maker.agents_scenario(&draft, agents.clone(), schedule, None, variant));
        }
        // The first agent's process killed with the resource in hand.
        let points = [
            KillPoint::AfterWrite(1),
            KillPoint::BeforeWrite(2),
            KillPoint::AfterWrite(2),
            KillPoint::AfterWrite(3),
        ];
        for point in points {
            let draft = maker.shared_draft(shared);
            let victim = victim(&draft, shared);
            let other = agent(&draft, shared, 1, 0, false);
            let schedule = vec![1; turns(&other)];
            let variant = format!(
                "an agent writing the {} {}, then another reads and writes it",
                shared.noun(),
                boundary(point, 1)
            );
            let mut scenario =
                maker.agents_scenario(&draft, vec![victim, other], schedule, Some(point), variant);
            scenario.calls = scenario.agents[0].clone();
            scenario.writes = Some(expected_writes(1));
            all.push(scenario);
        }
    }
    all
}

/// An agent pays an invoice (`shop.charge`: reversibility `partial`, a refund as its
/// compensation; `shop.pay`: `none`, every call approved by an operator), its process
/// killed at a point or not at all; then, restarted, it asks to pay the same invoice, or
/// another, in other words (another memo, no key).
pub(super) fn regenerations(maker: &mut Gen) -> Vec<Scenario> {
    let mut all = Vec::new();
    let points = [
        None,
        Some(KillPoint::AfterWrite(1)),
        Some(KillPoint::BeforeWrite(2)),
        Some(KillPoint::AfterWrite(2)),
        Some(KillPoint::AfterWrite(3)),
    ];
    for round in 0..2 {
        for (tool, reversibility) in [("shop.charge", "partial"), ("shop.pay", "none")] {
            for first in points {
                // An irreversible call waits for an operator, whom the killed child has not.
                if tool == "shop.pay" && first.is_some() {
                    continue;
                }
                for same in [true, false] {
                    let mut draft = maker.draft_of(1);
                    let invoice = 100 + maker.rng.random_range(0..900_u32) + 1_000 * round;
                    let amount = maker.rng.random_range(10..500_u32);
                    let again = if same { invoice } else { invoice + 1 };
                    draft.calls.push(Call::new(
                        tool,
                        json!({ "invoice": invoice.to_string(), "amount": amount, "memo": format!("invoice {invoice} ({})", draft.tag) }),
                    ));
                    let regenerated = vec![Call::new(
                        tool,
                        json!({ "invoice": again.to_string(), "amount": amount, "memo": format!("pay Bob for invoice {again} ({})", draft.tag) }),
                    )];
                    let before = first
                        .map_or_else(|| "its saga Done".to_owned(), |point| boundary(point, 1));
                    let variant = format!(
                        "{tool} (reversibility {reversibility}) {before}; restarted, it asks to pay {} invoice in other words",
                        if same { "the same" } else { "the next" }
                    );
                    let mut scenario =
                        maker.finish(draft, variant, Drive::Regenerate { first }, Must::Complete);
                    scenario.commands = true;
                    scenario.agents = vec![regenerated];
                    scenario.writes = first.map(|_| expected_writes(1));
                    all.push(scenario);
                }
            }
        }
    }
    all
}

impl Shared {
    fn noun(self) -> &'static str {
        match self {
            Shared::File => "file",
            Shared::Account => "account",
        }
    }
}

impl Gen {
    /// A draft with two files (`ws/shared-0.txt`, `ws/shared-1.txt`) or two accounts
    /// (`ws/accounts/acct-0`, `ws/accounts/acct-1`) the agents share.
    fn shared_draft(&mut self, shared: Shared) -> Draft {
        let mut draft = self.draft_of(1);
        for n in 0..2 {
            let (path, content) = opening(shared, n, &draft.tag);
            draft.setup.insert(path, Setup::File(content.into_bytes()));
        }
        draft
    }
}

/// Resource `n`'s path and what it holds before the agents start.
fn opening(shared: Shared, n: usize, tag: &str) -> (String, String) {
    match shared {
        Shared::File => (
            format!("ws/shared-{n}.txt"),
            format!("shared {n} ({tag})\n"),
        ),
        Shared::Account => (
            format!("ws/accounts/acct-{n}"),
            format!("{OPENING_BALANCE}\n"),
        ),
    }
}

/// Agent `who`'s calls: read resource `n`, write it back with its own change (a line of its
/// own; a debit of its own decimal digit), then fail if `failing`.
fn agent(draft: &Draft, shared: Shared, who: usize, n: usize, failing: bool) -> Vec<Call> {
    let mut calls = match shared {
        Shared::File => {
            let path = format!("ws/shared-{n}.txt");
            vec![
                Call::new("fs.read", json!({ "path": path })),
                Call::new(
                    "fs.write",
                    json!({ "path": path, "content": format!("{READ}{}", agent_line(&draft.tag, who)) }),
                ),
            ]
        }
        Shared::Account => {
            let account = format!("acct-{n}");
            vec![
                Call::new("acct.get", json!({ "account": account })),
                Call::new(
                    "acct.set",
                    json!({ "account": account, "balance": format!("{READ}-{}", debit_of(who)) }),
                ),
            ]
        }
    };
    if failing {
        calls.push(Call::new(
            "fault.fail",
            json!({ "message": "the agent's next call fails" }),
        ));
    }
    calls
}

/// Agent 0's calls when it runs alone first (and is killed): its write of resource 0, as its
/// read would have made it.
fn victim(draft: &Draft, shared: Shared) -> Vec<Call> {
    vec![match shared {
        Shared::File => {
            let (path, content) = opening(shared, 0, &draft.tag);
            let content = format!("{content}{}", agent_line(&draft.tag, 0));
            Call::new("fs.write", json!({ "path": path, "content": content }))
        }
        Shared::Account => Call::new(
            "acct.set",
            json!({ "account": "acct-0", "balance": OPENING_BALANCE - debit_of(0) }),
        ),
    }]
}

impl Gen {
    fn agents_scenario(
        &mut self,
        draft: &Draft,
        agents: Vec<Vec<Call>>,
        schedule: Vec<usize>,
        victim: Option<KillPoint>,
        variant: String,
    ) -> Scenario {
        let mut scenario = self.finish(
            draft.copy_for(self),
            variant,
            Drive::Agents { schedule, victim },
            Must::Complete,
        );
        scenario.commands = true;
        scenario.agents = agents;
        scenario
    }
}

/// Stands, in a write's arguments, for what the agent's last read returned: the file's
/// content (`fs.write`'s `content` begins with it), or the balance (`acct.set`'s
/// `balance` is `READ-N`: the balance read, less `N`).
pub(crate) const READ: &str = "@READ@";

/// The line agent `who` adds to a shared file.
pub(crate) fn agent_line(tag: &str, who: usize) -> String {
    format!("agent {who} was here ({tag})\n")
}

/// The amount agent `who` debits: a decimal digit of its own (1, 10, …), so that a balance
/// tells how many times each agent's debit is in it (up to 9).
pub(crate) fn debit_of(who: usize) -> u64 {
    10_u64.pow(u32::try_from(who).unwrap_or(u32::MAX))
}

/// The turns of `agents`, as letters (`A` for agent 0's turn, `B` for agent 1's).
fn spelled(agents: &[Vec<Call>], schedule: &[usize]) -> String {
    let mut next = vec![0; agents.len()];
    schedule
        .iter()
        .map(|&who| {
            let at = next[who];
            next[who] += 1;
            let what = agents[who]
                .get(at)
                .map_or("commit", |call| match call.tool.as_str() {
                    "fs.read" | "acct.get" => "read",
                    "fs.write" | "acct.set" => "write",
                    _ => "fail",
                });
            format!(
                "{}.{what}",
                char::from(b'A' + u8::try_from(who).unwrap_or(25))
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every interleaving of two agents' turns that the kernel's locks are meant to keep
/// apart: left out are those where, between an agent's read of a resource and its write of
/// it, the other agent settles a write of it that the read did not see committed (a
/// commit after the read, or a rollback): reads do not lock, so what was read is stale and
/// the write would be made from it.
pub(crate) fn interleavings(agents: &[Vec<Call>]) -> Vec<Vec<usize>> {
    let (a, b) = (turns(&agents[0]), turns(&agents[1]));
    let mut all = Vec::new();
    for mask in 0_u32..(1 << (a + b)) {
        if mask.count_ones() as usize != b {
            continue;
        }
        let schedule: Vec<usize> = (0..a + b)
            .map(|i| usize::from(mask >> i & 1 == 1))
            .collect();
        if protected(agents, &schedule) {
            all.push(schedule);
        }
    }
    all
}

/// Where each agent's turns fall in `schedule`: `positions[who][turn]`.
fn positions(agents: &[Vec<Call>], schedule: &[usize]) -> Vec<Vec<usize>> {
    let mut positions = vec![Vec::new(); agents.len()];
    for (at, &who) in schedule.iter().enumerate() {
        positions[who].push(at);
    }
    positions
}

fn protected(agents: &[Vec<Call>], schedule: &[usize]) -> bool {
    let at = positions(agents, schedule);
    for (x, calls) in agents.iter().enumerate() {
        for (read, call) in calls.iter().enumerate() {
            if writes(call) || resource_of(call).is_none() {
                continue;
            }
            let resource = resource_of(call);
            let Some(write) = (read + 1..calls.len())
                .find(|&i| writes(&calls[i]) && resource_of(&calls[i]) == resource)
            else {
                continue;
            };
            for (y, others) in agents.iter().enumerate() {
                if y == x {
                    continue;
                }
                let Some(their_write) = others
                    .iter()
                    .position(|c| writes(c) && resource_of(c) == resource)
                else {
                    continue;
                };
                // The other agent settles at its last turn: its commit, or its failing call.
                let settles = at[y][turns(others) - 1];
                let seen_committed = at[y][their_write] < at[x][read] && !fails(others);
                if at[x][read] < settles && settles < at[x][write] && !seen_committed {
                    return false;
                }
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(failing: bool) -> Vec<Vec<Call>> {
        let draft = Gen::new(1, Kind::Isolation).shared_draft(Shared::File);
        vec![
            agent(&draft, Shared::File, 0, 0, false),
            agent(&draft, Shared::File, 1, 0, failing),
        ]
    }

    #[test]
    fn interleavings_leave_out_writes_made_from_a_read_gone_stale() {
        let agents = pair(false);
        let all = interleavings(&agents);
        // A.read B.read A.write B.write A.commit B.commit: B's write meets A's lock.
        assert!(all.contains(&vec![0, 1, 0, 1, 0, 1]));
        // Serial orders are kept.
        assert!(all.contains(&vec![0, 0, 0, 1, 1, 1]));
        // A.read A.write B.read A.commit B.write B.commit: B read what A committed.
        assert!(all.contains(&vec![0, 0, 1, 0, 1, 1]));
        // A.read B.read A.write A.commit B.write B.commit: B writes from what it read
        // before A committed, and no lock is held any more: left out.
        assert!(!all.contains(&vec![0, 1, 0, 0, 1, 1]));
        assert_eq!(all.len(), 16, "{all:?}");
        // A.read A.write B.read A.fail B.write: B read what A then rolled back.
        let failing = interleavings(&pair(true));
        assert!(!failing.contains(&vec![1, 1, 0, 1, 0, 0]));
        assert!(failing.contains(&vec![1, 1, 0, 0, 1, 0]));
    }
}
