//! `fsm.toml`: the built-in table written out, and every problem reported with its line.

use agent_kernel_fsm::Guardrail;

/// The root `fsm.toml` must be the built-in table, written out.
#[test]
fn the_root_fsm_toml_is_the_builtin_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fsm.toml");
    let text = std::fs::read_to_string(path).expect("the repository has fsm.toml");
    assert_eq!(
        text,
        Guardrail::builtin().to_toml(),
        "fsm.toml differs from the built-in table: regenerate it with `agent-kernel fsm --show --format toml > fsm.toml`"
    );
    assert_eq!(Guardrail::from_toml_str(&text), Ok(Guardrail::builtin()));
}

/// Parses `text` and checks the problems reported: `(line, fragment)` each, in order.
fn check(text: &str, expected: &[(Option<usize>, &str)]) {
    let problems = match Guardrail::from_toml_str(text) {
        Ok(_) => Vec::new(),
        Err(error) => error.problems,
    };
    let actual: Vec<_> = problems
        .iter()
        .map(|p| (p.line, p.message.clone()))
        .collect();
    assert_eq!(actual.len(), expected.len(), "{actual:#?}");
    for ((line, message), (want_line, fragment)) in actual.iter().zip(expected) {
        assert_eq!(line, want_line, "{message}");
        assert!(message.contains(fragment), "`{message}` lacks `{fragment}`");
    }
}

/// The built-in table with `edit` applied to its text.
fn builtin_with(edit: impl Fn(String) -> String) -> String {
    edit(Guardrail::builtin().to_toml())
}

fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|line| line.contains(needle))
        .expect("needle present")
        + 1
}

#[test]
fn unknown_states_events_guards_and_keys() {
    let text = builtin_with(|t| {
        t.replacen("to = \"Planning\"", "to = \"Planing\"", 1)
            .replacen("event = \"PlanReady\"", "event = \"PlanIsReady\"", 1)
            .replacen("guard = \"more_steps\"", "guard = \"more_stepz\"", 1)
    });
    // With those rows unusable the rest of the table falls apart too (unreachable states);
    // the three named problems must be there, each on its own line.
    let problems = Guardrail::from_toml_str(&text)
        .expect_err("refused")
        .problems;
    for (line, fragment) in [
        (
            line_of(&text, "Planing"),
            "unknown saga state `Planing` in `to`",
        ),
        (
            line_of(&text, "PlanIsReady"),
            "unknown event `PlanIsReady` in `event`",
        ),
        (
            line_of(&text, "more_stepz"),
            "unknown guard `more_stepz` in `guard`",
        ),
    ] {
        assert!(
            problems
                .iter()
                .any(|p| p.line == Some(line) && p.message.contains(fragment)),
            "no `{fragment}` on line {line}: {problems:#?}"
        );
    }
    let text = builtin_with(|t| t.replacen("guard = \"actor_idle\"", "gaurd = \"actor_idle\"", 1));
    check(
        &text,
        &[(Some(line_of(&text, "gaurd")), "unknown field `gaurd`")],
    );
}

#[test]
fn syntax_errors_have_a_line() {
    let text = "[[transition]]\nfrom = \"Idle\"\nevent = StartSaga\n";
    check(text, &[(Some(3), "")]);
}

#[test]
fn duplicate_and_shadowed_rows() {
    let extra =
        "\n[[transition]]\nfrom = \"Acting\"\nevent = \"ToolFailed\"\nto = \"Compensating\"\n";
    let text = builtin_with(|t| t + extra);
    let line = text.lines().count() - 3;
    check(&text, &[(Some(line), "duplicate transition")]);

    let extra = "\n[[transition]]\nfrom = \"Acting\"\nevent = \"ToolSucceeded\"\nto = \"Validating\"\nguard = \"more_steps\"\n";
    let text = builtin_with(|t| t + extra);
    let line = text.lines().count() - 4;
    check(&text, &[(Some(line), "can never be taken")]);
}

#[test]
fn a_transition_out_of_a_terminal_state() {
    let extra =
        "\n[[transition]]\nfrom = \"Done\"\nevent = \"ToolFailed\"\nto = \"Compensating\"\n";
    let text = builtin_with(|t| t + extra);
    let line = text.lines().count() - 3;
    check(&text, &[(Some(line), "out of the terminal state Done")]);
}

#[test]
fn unreachable_states_and_states_with_no_way_out() {
    // Only Idle -> Planning: Planning has no way out, everything else is unreachable.
    let text = "[[transition]]\nfrom = \"Idle\"\nevent = \"StartSaga\"\nto = \"Planning\"\n";
    let problems = Guardrail::from_toml_str(text)
        .expect_err("refused")
        .problems;
    let messages: Vec<_> = problems.iter().map(|p| p.message.as_str()).collect();
    assert!(
        messages.contains(&"non-terminal state Planning has no way out"),
        "{messages:#?}"
    );
    for state in [
        "Acting",
        "Validating",
        "Compensating",
        "Done",
        "FailedRolledBack",
        "FailedRollbackPartial",
    ] {
        assert!(
            messages.contains(&format!("state {state} is unreachable from Idle").as_str()),
            "{state}: {messages:#?}"
        );
    }
    assert_eq!(
        problems[0].line,
        Some(1),
        "Planning's problem points at its row"
    );
}

#[test]
fn a_table_that_could_not_roll_back_is_refused() {
    let text = builtin_with(|t| {
        t.replacen(
            "[[transition]]\nfrom = \"Acting\"\nevent = \"ToolFailed\"\nto = \"Compensating\"\n",
            "",
            1,
        )
    });
    let problems = Guardrail::from_toml_str(&text)
        .expect_err("refused")
        .problems;
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(
        problems[0]
            .message
            .contains("rollback would be impossible: Acting needs `ToolFailed`")
    );
}

#[test]
fn a_smaller_valid_table_loads() {
    // No `Acting -> Acting` self-loop: plans with two mutating steps in a row are denied.
    let text = builtin_with(|t| {
        t.replacen(
            "[[transition]]\nfrom = \"Acting\"\nevent = \"ToolSucceeded\"\nto = \"Acting\"\n",
            "",
            1,
        )
    });
    let fsm = Guardrail::from_toml_str(&text).expect("valid");
    assert_eq!(
        fsm.transitions().len(),
        Guardrail::builtin().transitions().len() - 1
    );
}

#[test]
fn renderings_show_every_row() {
    let fsm = Guardrail::builtin();
    let mermaid = fsm.to_mermaid();
    assert!(mermaid.starts_with("stateDiagram-v2\n    [*] --> Idle\n"));
    assert!(mermaid.contains("    Idle --> Planning: StartSaga [actor_idle]\n"));
    assert!(mermaid.contains("    Acting --> Acting: ToolSucceeded\n"));
    assert!(mermaid.contains("    Done --> [*]\n"));
    let dot = fsm.to_dot();
    assert!(dot.contains("Validating -> Done [label=\"ValidationPassed [saga_complete]\"];"));
    let table = fsm.to_text_table();
    assert_eq!(table.lines().count(), 1 + fsm.transitions().len());
}

#[test]
fn a_table_that_could_never_start_a_saga_is_refused() {
    // `PlanReady` leading to Validating: the engine's first step would not run in Acting.
    let text = builtin_with(|t| {
        t.replacen(
            "event = \"PlanReady\"\nto = \"Acting\"",
            "event = \"PlanReady\"\nto = \"Validating\"",
            1,
        )
    });
    let problems = Guardrail::from_toml_str(&text)
        .expect_err("refused")
        .problems;
    assert!(
        problems
            .iter()
            .any(|p| p.message.contains("a saga could never start")),
        "{problems:#?}"
    );
}

#[test]
fn a_table_written_before_approvals_still_loads_and_denies_every_approval() {
    let text = include_str!("data/fsm-without-approvals.toml");
    let fsm = Guardrail::from_toml_str(text).expect("a table without approval rows loads");
    let denial = fsm
        .apply(
            agent_kernel_api::SagaState::Acting,
            agent_kernel_fsm::Event::ApprovalRequested,
            &agent_kernel_fsm::Facts::default(),
        )
        .expect_err("no row asks for approvals, so a step that needs one is denied");
    assert!(denial.to_string().contains("ApprovalRequested"), "{denial}");
}

#[test]
fn a_table_where_a_waiting_saga_could_not_roll_back_is_refused() {
    let text = builtin_with(|t| {
        t.replacen(
            "from = \"AwaitingApproval\"\nevent = \"ApprovalDenied\"\nto = \"Compensating\"",
            "from = \"AwaitingApproval\"\nevent = \"ApprovalDenied\"\nto = \"Acting\"",
            1,
        )
    });
    // The first row naming the state: its `[[transition]]` header, three lines above.
    let line = line_of(&text, "to = \"AwaitingApproval\"") - 3;
    check(
        &text,
        &[(
            Some(line),
            "AwaitingApproval needs `ApprovalDenied` to lead to Compensating",
        )],
    );
}

#[test]
fn only_done_may_lead_to_undone_and_only_by_undo() {
    let from_failed = builtin_with(|t| {
        t.replacen(
            "from = \"Done\"\nevent = \"UndoRequested\"",
            "from = \"FailedRolledBack\"\nevent = \"UndoRequested\"",
            1,
        )
    });
    let problems = Guardrail::from_toml_str(&from_failed)
        .expect_err("refused")
        .problems;
    assert!(
        problems.iter().any(|problem| problem
            .message
            .contains("transition out of the terminal state FailedRolledBack")),
        "{problems:?}"
    );
    let into_acting = builtin_with(|t| {
        t.replacen(
            "from = \"Done\"\nevent = \"UndoRequested\"\nto = \"Undone\"",
            "from = \"Acting\"\nevent = \"UndoRequested\"\nto = \"Undone\"",
            1,
        )
    });
    let problems = Guardrail::from_toml_str(&into_acting)
        .expect_err("refused")
        .problems;
    assert!(
        problems
            .iter()
            .any(|problem| problem.message.contains("leads only from Done to Undone")),
        "{problems:?}"
    );
    // Without the row, `undo` is denied, and Done absorbs it like every event.
    let without = builtin_with(|t| {
        t.replacen(
            "\n[[transition]]\nfrom = \"Done\"\nevent = \"UndoRequested\"\nto = \"Undone\"\n",
            "",
            1,
        )
    });
    let fsm = Guardrail::from_toml_str(&without).expect("a table without undo loads");
    assert!(
        fsm.apply(
            agent_kernel_api::SagaState::Done,
            agent_kernel_fsm::Event::UndoRequested,
            &agent_kernel_fsm::Facts::default()
        )
        .is_err()
    );
}
