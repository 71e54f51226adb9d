"""The official Python MCP client against the real `agent-kernel mcp` (reference §9)."""

import contextlib
import json
import pathlib
import subprocess

import pytest

from conftest import BIN, session

BIN_PATH = str(pathlib.Path(BIN).resolve())

pytestmark = pytest.mark.anyio

#: A policy under which fs.delete waits for an operator's approval.
APPROVE_DELETES = '[fs]\nallow = ["ws"]\n\n[approval]\nrequire = ["fs.delete"]\n'


async def call(client, name, arguments):
    result = await client.call_tool(name, arguments)
    return result.is_error, result.structured_content


async def begin(client):
    is_error, content = await call(client, "saga_begin", {"name": "pytest"})
    assert not is_error, content
    assert content["state"] == "Planning"
    return content["saga_id"]


def kernel_cli(project, *args):
    """An operator's command: the binary on the project's log."""
    return subprocess.run(
        [BIN_PATH, "--db", str(project / "log.db"), *args], cwd=project, capture_output=True, text=True
    )


async def test_initialize_names_the_server_and_lists_its_tools(project):
    async with session(project) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        for name in ["saga_begin", "saga_commit", "saga_abort", "saga_status", "fs_write", "fs_read", "noop"]:
            assert name in tools, sorted(tools)
        assert not any(name.startswith("fault_") for name in tools), "no drills unless asked"
        assert "recover" not in tools and "rollback" not in tools
        write = tools["fs_write"]
        assert write.input_schema["required"] == ["args"]
        assert write.input_schema["properties"]["args"]["required"] == ["path", "content"]
        assert tools["fs_read"].annotations.read_only_hint is True
        assert tools["fs_write"].annotations.read_only_hint is False
        assert tools["fs_write"].annotations.destructive_hint is False
        assert tools["fs_write"].annotations.idempotent_hint is True
        assert tools["http_get"].annotations.open_world_hint is True


async def test_a_saga_of_several_calls_commits(project):
    async with session(project) as client:
        saga = await begin(client)
        for step, path in enumerate(["ws/a.txt", "ws/b.txt", "ws/c.txt"]):
            is_error, content = await call(
                client, "fs_write", {"saga_id": saga, "args": {"path": path, "content": path}}
            )
            assert not is_error, content
            assert content["step"] == step and content["status"] == "COMMIT"
            assert content["output"]["path"] == path
        is_error, content = await call(client, "saga_commit", {"saga_id": saga})
        assert not is_error and content["state"] == "Done", content
        assert [step["status"] for step in content["steps"]] == ["COMMIT"] * 3
    assert (project / "ws/c.txt").read_text() == "ws/c.txt"


async def test_an_aborted_saga_restores_every_file(project):
    (project / "ws/a.txt").write_bytes(b"\x00before\xff")
    async with session(project) as client:
        saga = await begin(client)
        for path in ["ws/a.txt", "ws/new.txt"]:
            is_error, content = await call(
                client, "fs_write", {"saga_id": saga, "args": {"path": path, "content": "after"}}
            )
            assert not is_error, content
        is_error, content = await call(client, "saga_abort", {"saga_id": saga, "reason": "test"})
        assert not is_error and content["state"] == "FailedRolledBack", content
    assert (project / "ws/a.txt").read_bytes() == b"\x00before\xff"
    assert not (project / "ws/new.txt").exists()


async def test_a_call_without_a_saga_commits_on_its_own(project):
    async with session(project) as client:
        is_error, content = await call(
            client, "fs_write", {"args": {"path": "ws/auto.txt", "content": "auto"}}
        )
        assert not is_error and content["state"] == "Done", content
    assert (project / "ws/auto.txt").read_text() == "auto"


async def test_a_refused_call_leaves_the_saga_open(project):
    async with session(project) as client:
        saga = await begin(client)
        is_error, content = await call(
            client, "fs_write", {"saga_id": saga, "args": {"path": "ws/x.txt"}}
        )
        assert is_error and content["error"]["kind"] == "bad_input", content
        is_error, content = await call(
            client, "fs_write", {"saga_id": saga, "args": {"path": "ws/x.txt", "content": "x"}}
        )
        assert not is_error, content
        is_error, content = await call(client, "saga_commit", {"saga_id": saga})
        assert not is_error and content["state"] == "Done", content


async def test_a_denied_read_is_refused_and_the_saga_stays_open(project):
    (project / "secret.txt").write_text("outside the roots")
    async with session(project) as client:
        saga = await begin(client)
        await call(client, "fs_write", {"saga_id": saga, "args": {"path": "ws/y.txt", "content": "y"}})
        is_error, content = await call(
            client, "fs_read", {"saga_id": saga, "args": {"path": "secret.txt"}}
        )
        assert is_error and content["error"]["kind"] == "denied", content
        assert content["state"] == "Acting", "the saga stays open"
        assert (project / "ws/y.txt").read_text() == "y", "the earlier write stays"
        is_error, content = await call(
            client, "fs_write", {"saga_id": saga, "args": {"path": "../outside.txt", "content": "no"}}
        )
        assert is_error and content["error"]["kind"] == "denied", content
        is_error, content = await call(client, "saga_commit", {"saga_id": saga})
        assert not is_error and content["state"] == "Done", content
        assert [step["tool"] for step in content["steps"]] == ["fs.write"], content
    assert (project / "ws/y.txt").read_text() == "y"
    assert not (project.parent / "outside.txt").exists()
    # Both denials are in the audit chain.
    listed = kernel_cli(project, "audit", "list", "--saga", saga, "--json")
    assert listed.returncode == 0, listed.stderr
    records = json.loads(listed.stdout)["records"]
    refused = [record for record in records if record["kind"] == "CallRefused"]
    assert len(refused) == 2, listed.stdout


async def test_on_denied_rollback_rolls_the_saga_back(project):
    (project / "sandbox.toml").write_text('[fs]\nallow = ["ws"]\n\n[mcp]\non_denied = "rollback"\n')
    async with session(project) as client:
        saga = await begin(client)
        await call(client, "fs_write", {"saga_id": saga, "args": {"path": "ws/y.txt", "content": "y"}})
        is_error, content = await call(
            client, "fs_write", {"saga_id": saga, "args": {"path": "../outside.txt", "content": "no"}}
        )
        assert is_error and content["error"]["kind"] == "denied", content
        assert content["state"] == "FailedRolledBack"
    assert not (project / "ws/y.txt").exists()
    assert not (project.parent / "outside.txt").exists()


async def test_an_empty_commit_ends_done(project):
    async with session(project) as client:
        saga = await begin(client)
        is_error, content = await call(client, "saga_commit", {"saga_id": saga})
        assert not is_error and content["state"] == "Done", content
        assert content["steps"] == []


async def test_an_ended_saga_still_answers_its_status(project):
    async with session(project) as client:
        saga = await begin(client)
        await call(client, "fs_write", {"saga_id": saga, "args": {"path": "ws/s.txt", "content": "s"}})
        await call(client, "saga_commit", {"saga_id": saga})
        is_error, content = await call(client, "saga_status", {"saga_id": saga})
        assert not is_error and content["state"] == "Done", content
        assert content["steps"][0]["status"] == "COMMIT"
        assert content["steps"][0]["output"]["path"] == "ws/s.txt"
        assert content["locks"] == [], "a settled saga holds nothing"


async def test_the_instructions_name_the_roots_and_the_working_folder(project):
    async with session(project) as client:
        instructions = client.initialized.instructions
        root = str((project / "ws").resolve())
        assert root in instructions, instructions
        assert str(project.resolve()) in instructions, instructions
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert root in tools["fs_read"].description, tools["fs_read"].description


async def test_a_failed_tool_rolls_the_saga_back(project):
    async with session(project, "--drills") as client:
        saga = await begin(client)
        await call(client, "fs_write", {"saga_id": saga, "args": {"path": "ws/z.txt", "content": "z"}})
        is_error, content = await call(client, "fault_fail", {"saga_id": saga, "args": {"message": "boom"}})
        assert is_error and content["error"]["kind"] == "failed", content
        assert "boom" in content["error"]["message"]
        assert content["steps"][0]["status"] == "COMPENSATED"
    assert not (project / "ws/z.txt").exists()


async def test_two_clients_share_one_log_and_neither_can_use_the_others_saga(project):
    async with session(project) as first, session(project) as second:
        mine = await begin(first)
        theirs = await begin(second)
        for name, arguments in [
            ("saga_commit", {"saga_id": mine}),
            ("fs_write", {"saga_id": mine, "args": {"path": "ws/m.txt", "content": "m"}}),
        ]:
            is_error, content = await call(second, name, arguments)
            assert is_error and content["error"]["kind"] == "bad_input", content
        await call(first, "fs_write", {"saga_id": mine, "args": {"path": "ws/1.txt", "content": "1"}})
        await call(second, "fs_write", {"saga_id": theirs, "args": {"path": "ws/2.txt", "content": "2"}})
        assert (await call(first, "saga_commit", {"saga_id": mine}))[1]["state"] == "Done"
        assert (await call(second, "saga_commit", {"saga_id": theirs}))[1]["state"] == "Done"
    assert (project / "ws/1.txt").exists() and (project / "ws/2.txt").exists()


async def test_a_step_that_needs_approval_waits_and_resumes_once_an_operator_approves(project):
    (project / "sandbox.toml").write_text(APPROVE_DELETES)
    (project / "ws/a.txt").write_text("keep me")
    async with session(project) as client:
        tools = {tool.name for tool in (await client.list_tools()).tools}
        assert "saga_resume" in tools
        assert not any("approve" in name or "reject" in name for name in tools), sorted(tools)
        saga = await begin(client)
        is_error, content = await call(
            client, "fs_delete", {"saga_id": saga, "args": {"path": "ws/a.txt"}}
        )
        assert not is_error, content
        assert content["status"] == "AWAITING_APPROVAL", content
        approval = content["approval"]
        assert len(approval["digest"]) == 64 and approval["expires_at"].endswith("Z")
        assert (project / "ws/a.txt").exists(), "nothing ran"
        # The operator decides outside the agent's reach, with the binary.
        decided = kernel_cli(project, "approve", approval["id"])
        assert decided.returncode == 0, decided.stderr
        is_error, content = await call(client, "saga_resume", {"saga_id": saga})
        assert not is_error and content["status"] == "COMMIT", content
        assert not (project / "ws/a.txt").exists()
        # Aborting puts the file back: the approved step is compensated like any other.
        is_error, content = await call(client, "saga_abort", {"saga_id": saga})
        assert not is_error and content["state"] == "FailedRolledBack", content
    assert (project / "ws/a.txt").read_text() == "keep me"


async def test_a_decision_reaches_the_waiting_client_as_a_notification(project):
    import anyio

    (project / "sandbox.toml").write_text(APPROVE_DELETES)
    (project / "ws/a.txt").write_text("delete me")
    told = []
    decided = anyio.Event()

    async def on_message(params):
        told.append(params)
        decided.set()

    async with session(project, logging_callback=on_message) as client:
        saga = await begin(client)
        is_error, content = await call(client, "fs_delete", {"saga_id": saga, "args": {"path": "ws/a.txt"}})
        assert not is_error and content["state"] == "AwaitingApproval", content
        approval = content["approval"]["id"]
        is_error, content = await call(client, "saga_status", {"saga_id": saga})
        assert content["state"] == "AwaitingApproval", content
        # Another call meanwhile is refused, and says where the saga stands.
        is_error, content = await call(client, "fs_write", {"saga_id": saga, "args": {"path": "ws/b.txt", "content": "b"}})
        assert is_error and content["state"] == "AwaitingApproval", content
        approved = kernel_cli(project, "approve", approval)
        assert approved.returncode == 0, approved.stderr
        assert "saga_resume" in approved.stdout, approved.stdout
        with anyio.fail_after(20):
            await decided.wait()
        assert told[0].data["event"] == "approval_decided", told
        assert told[0].data["saga_id"] == saga and told[0].data["approval_id"] == approval
        assert told[0].data["status"] == "approved"
        is_error, content = await call(client, "saga_resume", {"saga_id": saga})
        assert not is_error and content["status"] == "COMMIT", content
        is_error, content = await call(client, "saga_commit", {"saga_id": saga})
        assert not is_error and content["state"] == "Done", content
    assert not (project / "ws/a.txt").exists()


async def killed_while_waiting(project, *writes):
    """Begins a saga, writes each of `writes` (paths under ws/), asks to delete ws/a.txt,
    which waits for an approval, then SIGKILLs the server; returns the request's id."""
    import os
    import signal

    (project / "sandbox.toml").write_text(APPROVE_DELETES)
    (project / "ws/a.txt").write_text("keep me")
    killed = {}
    # The session cannot end cleanly once its server is killed: what it did is kept.
    with contextlib.suppress(Exception):
        async with session(project) as client:
            saga = await begin(client)
            for path in writes:
                await call(client, "fs_write", {"saga_id": saga, "args": {"path": path, "content": "n"}})
            _, content = await call(client, "fs_delete", {"saga_id": saga, "args": {"path": "ws/a.txt"}})
            shown = json.loads(kernel_cli(project, "--json", "log", "--saga", saga).stdout)
            os.kill(shown["owner"]["pid"], signal.SIGKILL)
            killed.update(approval=content["approval"]["id"])
    assert killed, "the saga waited and its server was killed"
    return killed["approval"]


async def test_a_request_of_a_killed_server_is_refused_until_recover(project):
    approval = await killed_while_waiting(project)
    listed = json.loads(kernel_cli(project, "--json", "approvals").stdout)
    assert [request["holder_gone"] for request in listed["approvals"]] == [True], listed
    refused = kernel_cli(project, "approve", approval)
    assert refused.returncode == 4, refused.stderr
    assert "is gone" in refused.stderr and "recover" in refused.stderr, refused.stderr
    assert json.loads(kernel_cli(project, "--json", "approvals").stdout) == listed, "nothing changed"
    recovered = kernel_cli(project, "recover")
    assert recovered.returncode == 0, recovered.stderr + recovered.stdout
    closed = kernel_cli(project, "approve", approval)
    assert closed.returncode == 4 and "cancelled" in closed.stderr, closed.stderr
    assert json.loads(kernel_cli(project, "--json", "approvals").stdout)["approvals"] == []
    assert (project / "ws/a.txt").read_text() == "keep me"


async def test_a_request_of_a_killed_server_can_still_be_rejected(project):
    approval = await killed_while_waiting(project, "ws/new.txt")
    rejected = kernel_cli(project, "reject", approval, "--reason", "its agent is gone")
    assert rejected.returncode == 0, rejected.stderr
    recovered = kernel_cli(project, "recover")
    assert recovered.returncode == 0, recovered.stderr + recovered.stdout
    assert (project / "ws/a.txt").read_text() == "keep me"
    assert not (project / "ws/new.txt").exists(), "the saga's earlier write is undone"
