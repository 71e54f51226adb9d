"""Live sagas from Python, over the Rust engine: committed, rolled back, Python tools and
their compensations, failures of every kind, idempotency keys, asyncio, the GIL."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest

import subprocess

from agent_kernel import (
    AwaitingApproval,
    BadInput,
    Conflict,
    Denied,
    NotApplied,
    OperatorAttention,
    SagaClosed,
    StepFailed,
    tool,
)


def test_a_committed_saga_leaves_its_effects_and_a_failing_one_restores_every_byte(project: Path, make_kernel):
    kernel = make_kernel()
    (project / "ws" / "a.txt").write_bytes(b"old \x00 bytes\n")
    with kernel.saga(name="commit") as saga:
        saga.call("fs.write", {"path": "ws/a.txt", "content": "new"})
        saga.call("fs.append", {"path": "ws/a.txt", "content": " and more"})
    assert (project / "ws" / "a.txt").read_text() == "new and more"
    assert kernel.saga_record(saga.id)["state"] == "Done"

    before = (project / "ws" / "a.txt").read_bytes()
    with pytest.raises(RuntimeError, match="the agent changed its mind"):
        with kernel.saga(name="rollback") as saga:
            saga.call("fs.write", {"path": "ws/a.txt", "content": "overwritten"})
            saga.call("fs.write", {"path": "ws/b.txt", "content": "created"})
            raise RuntimeError("the agent changed its mind")
    assert (project / "ws" / "a.txt").read_bytes() == before
    assert not (project / "ws" / "b.txt").exists()
    record = kernel.saga_record(saga.id)
    assert record["state"] == "FailedRolledBack"
    assert [step["status"] for step in record["steps"]] == ["COMPENSATED", "COMPENSATED"]


def test_python_tools_are_compensated_last_first(make_kernel):
    ledger: list[str] = []
    undone: list[str] = []

    @tool(id="ledger.add")
    def add(entry: str) -> dict:
        """Adds an entry to the ledger."""
        ledger.append(entry)
        return {"position": len(ledger) - 1}

    @add.compensation
    def remove(args: dict, output: dict | None) -> None:
        ledger.remove(args["entry"])
        undone.append(args["entry"])

    @tool(id="payment.charge")
    def charge(amount: int) -> dict:
        raise RuntimeError("the card was declined")

    charge.compensation(lambda args, output: None)
    kernel = make_kernel(add, charge)
    assert {"ledger.add", "payment.charge"} <= set(kernel.tool_ids)
    saga = kernel.begin(name="ledger")
    assert saga.call("ledger.add", {"entry": "first"}) == {"position": 0}
    assert saga.call("ledger.add", {"entry": "second"}) == {"position": 1}
    with pytest.raises(StepFailed, match="the card was declined") as raised:
        saga.call("payment.charge", {"amount": 12})
    assert ledger == []
    assert undone == ["second", "first"]
    assert raised.value.saga_id == saga.id
    assert raised.value.state == "FailedRolledBack"
    # The charge raised, so its outcome was unknown: it was compensated too (a no-op).
    assert raised.value.compensated == [0, 1, 2]


def test_a_python_tool_that_raises_not_applied_is_not_compensated(make_kernel):
    calls: list[str] = []

    @tool(id="shop.order")
    def order(item: str) -> dict:
        raise NotApplied("out of stock")

    @order.compensation
    def cancel(args, output):
        calls.append("cancel")

    kernel = make_kernel(order)
    with pytest.raises(StepFailed, match="out of stock"):
        with kernel.saga() as saga:
            saga.call("shop.order", {"item": "book"})
    assert calls == []


def test_a_python_tool_that_hangs_past_its_timeout_is_compensated_once_it_has_returned(project: Path, make_kernel):
    target = project / "ws" / "late.txt"
    order: list[str] = []

    @tool(id="slow.write", timeout_ms=200)
    def slow(text: str) -> None:
        time.sleep(0.3)
        target.write_text(text)
        order.append("effect")

    @slow.compensation
    def undo(args, output):
        order.append("compensation")
        target.unlink(missing_ok=True)

    kernel = make_kernel(slow)
    with pytest.raises(StepFailed, match="no result after 200 ms"):
        with kernel.saga() as saga:
            saga.call("slow.write", {"text": "t"})
    # The call was given up on at 200 ms, but its function went on and wrote at 300 ms: the
    # compensation waited for it, so the effect did not land after its undoing.
    assert order == ["effect", "compensation"]
    assert not target.exists()


def test_a_python_tool_still_running_long_after_its_timeout_is_left_for_an_operator(make_kernel):
    release, returned = threading.Event(), threading.Event()
    undone: list[str] = []

    @tool(id="stuck.write", timeout_ms=200)
    def stuck(text: str) -> None:
        release.wait(10)
        returned.set()

    @stuck.compensation
    def undo(args, output):
        undone.append(args["text"])

    kernel = make_kernel(stuck)
    with pytest.raises(OperatorAttention, match="no result after 200 ms") as raised:
        with kernel.saga() as saga:
            saga.call("stuck.write", {"text": "t"})
    assert raised.value.state == "FailedRollbackPartial"
    step = kernel.saga_record(saga.id)["steps"][0]
    assert step["status"] == "COMPENSATION_FAILED"
    assert "still runs" in json.dumps(step)
    # Never compensated blind while its function may still act: a dead letter instead.
    assert undone == []
    release.set()
    assert returned.wait(5)


def test_a_python_tool_that_returns_something_not_json_fails_with_a_clear_message(make_kernel):
    @tool(id="odd.answer")
    def odd() -> object:
        return object()

    odd.compensation(lambda args, output: None)
    kernel = make_kernel(odd)
    with pytest.raises(StepFailed, match="not JSON"):
        with kernel.saga() as saga:
            saga.call("odd.answer", {})


def test_arguments_are_checked_against_the_schema_from_the_type_hints(make_kernel):
    @tool(id="typed.add", effect="read-only")
    def add(a: int, b: int = 0) -> int:
        return a + b

    kernel = make_kernel(add)
    with kernel.saga() as saga:
        assert saga.call("typed.add", {"a": 2, "b": 3}) == 5
        with pytest.raises(BadInput):
            saga.call("typed.add", {"a": "two"})
        with pytest.raises(BadInput):
            saga.call("no.such.tool", {})
        assert saga.call("typed.add", {"a": 1}) == 1


def test_a_denied_path_rolls_the_saga_back(project: Path, make_kernel):
    kernel = make_kernel()
    with pytest.raises(Denied) as raised:
        with kernel.saga() as saga:
            saga.call("fs.write", {"path": "ws/ok.txt", "content": "fine"})
            saga.call("fs.write", {"path": "ws/../outside.txt", "content": "no"})
    assert not (project / "ws" / "ok.txt").exists()
    assert not (project / "outside.txt").exists()
    assert raised.value.state == "FailedRolledBack"


def test_an_idempotency_key_runs_its_step_once_across_sagas(project: Path, make_kernel):
    kernel = make_kernel()
    for _ in range(3):
        with kernel.saga() as saga:
            saga.call("fs.append", {"path": "ws/ledger.csv", "content": "paid 10\n"}, key="payment-1")
    assert (project / "ws" / "ledger.csv").read_text() == "paid 10\n"
    with pytest.raises(BadInput, match="payment-1"):
        with kernel.saga() as saga:
            saga.call("fs.append", {"path": "ws/ledger.csv", "content": "paid 99\n"}, key="payment-1")


def test_sagas_from_several_asyncio_tasks_run_at_once(project: Path, make_kernel):
    kernel = make_kernel()

    async def one(i: int) -> str:
        async with kernel.saga(name=f"task {i}") as saga:
            await saga.acall("fs.write", {"path": f"ws/task-{i}.txt", "content": str(i)})
            await saga.acall("noop", {"sleep_ms": 300})
            return saga.id

    async def main() -> list[str]:
        return await asyncio.gather(*(one(i) for i in range(8)))

    started = time.monotonic()
    ids = asyncio.run(main())
    # Eight sagas with a 300 ms step each, at once: one after another would take 2.4 s.
    assert time.monotonic() - started < 1.5
    assert len(set(ids)) == 8
    for i in range(8):
        assert (project / "ws" / f"task-{i}.txt").read_text() == str(i)
    assert all(kernel.saga_record(saga_id)["state"] == "Done" for saga_id in ids)


def test_a_failing_async_saga_rolls_back(project: Path, make_kernel):
    kernel = make_kernel(drills=True)

    async def main() -> None:
        async with kernel.saga() as saga:
            await saga.acall("fs.write", {"path": "ws/a.txt", "content": "a"})
            await saga.acall("fault.fail", {"message": "boom"})

    with pytest.raises(StepFailed, match="boom"):
        asyncio.run(main())
    assert not (project / "ws" / "a.txt").exists()


def test_the_gil_is_released_while_the_engine_waits(make_kernel):
    kernel = make_kernel()
    counter = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal counter
        while not stop.is_set():
            counter += 1

    thread = threading.Thread(target=count)
    thread.start()
    try:
        with kernel.saga() as saga:
            before = counter
            saga.call("noop", {"sleep_ms": 300})
            during = counter - before
    finally:
        stop.set()
        thread.join()
    # A thread that never got the GIL back would count nothing during the 300 ms call.
    assert during > 1000, during


def test_plans_recovery_the_log_and_approvals_are_reachable(project: Path, make_kernel):
    kernel = make_kernel()
    report = kernel.run({"steps": [{"tool": "fs.write", "args": {"path": "ws/p.txt", "content": "plan"}}]})
    assert report["state"] == "Done"
    assert (project / "ws" / "p.txt").read_text() == "plan"
    assert kernel.log(limit=5)[0]["saga_id"] == report["saga_id"]
    assert kernel.recover() == {"sagas": []}
    assert kernel.approvals() == []


def test_abort_and_status(project: Path, make_kernel):
    kernel = make_kernel()
    saga = kernel.begin(name="to abort")
    saga.call("fs.write", {"path": "ws/a.txt", "content": "a"})
    status = saga.status()
    assert status["saga_id"] == saga.id
    assert len(status["steps"]) == 1
    report = saga.abort("the user cancelled")
    assert report["state"] == "FailedRolledBack"
    assert not (project / "ws" / "a.txt").exists()
    assert saga.status() is None
    with pytest.raises(SagaClosed) as raised:
        saga.call("fs.write", {"path": "ws/b.txt", "content": "b"})
    assert raised.value.saga_id == saga.id
    assert raised.value.state == "FailedRolledBack"


def test_an_empty_saga_commits_done(make_kernel):
    kernel = make_kernel()
    with kernel.saga() as saga:
        pass
    assert kernel.saga_record(saga.id)["state"] == "Done"


def test_a_step_that_needs_approval_waits_and_runs_once_approved(project: Path, make_kernel, binary: Path):
    (project / "sandbox.toml").write_text('[fs]\nallow = ["ws"]\n\n[approval]\nrequire = ["fs.delete"]\n')
    (project / "ws" / "precious.txt").write_text("keep")
    kernel = make_kernel()
    with kernel.saga() as saga:
        saga.call("fs.write", {"path": "ws/a.txt", "content": "a"})
        with pytest.raises(AwaitingApproval) as waiting:
            saga.call("fs.delete", {"path": "ws/precious.txt"})
        approval = waiting.value.approval
        assert approval["tool"] == "fs.delete"
        assert [pending["id"] for pending in kernel.approvals()] == [approval["id"]]
        with pytest.raises(AwaitingApproval):
            saga.resume()
        decided = subprocess.run(
            [str(binary), "--db", "agent-kernel.db", "approve", approval["id"], "--note", "ok"],
            cwd=project,
            capture_output=True,
            text=True,
        )
        assert decided.returncode == 0, decided.stderr
        saga.resume()
    assert not (project / "ws" / "precious.txt").exists()
    assert kernel.saga_record(saga.id)["state"] == "Done"


def test_a_probe_settles_a_step_of_unknown_outcome(project: Path, make_kernel):
    target = project / "ws" / "probed.txt"
    undone: list[str] = []

    finished = threading.Event()

    @tool(id="probed.write", settlement="probe", timeout_ms=200)
    def write(text: str) -> None:
        target.write_text(text)
        time.sleep(0.3)
        finished.set()

    @write.compensation
    def undo(args, output):
        undone.append("compensated")
        target.unlink(missing_ok=True)

    @write.probing
    def happened(args, undo_data) -> bool | None:
        return target.exists() and target.read_text() == args["text"]

    kernel = make_kernel(write)
    with pytest.raises(StepFailed, match="no result after 200 ms"):
        with kernel.saga() as saga:
            saga.call("probed.write", {"text": "t"})
    # The write happened before the timeout: the probe said so, and it was compensated.
    assert undone == ["compensated"]
    assert not target.exists()
    record = kernel.saga_record(saga.id)
    assert record["steps"][0]["status"] == "COMPENSATED"
    assert finished.wait(5)


def test_a_file_another_open_saga_touched_is_a_conflict_and_the_saga_stays_open(project: Path, make_kernel):
    kernel = make_kernel()
    first = kernel.begin(name="first")
    first.call("fs.write", {"path": "ws/a.txt", "content": "first"})
    second = kernel.begin(name="second")
    with pytest.raises(Conflict, match="is held by saga") as raised:
        second.call("fs.write", {"path": "ws/./a.txt", "content": "second"})
    assert raised.value.holder["saga_id"] == first.id
    assert raised.value.holder["alive"] is True
    assert raised.value.saga_id == second.id
    assert (project / "ws" / "a.txt").read_text() == "first"
    # Still open: another file is free, and the first file once the first saga is settled.
    second.call("fs.write", {"path": "ws/b.txt", "content": "b"})
    first.commit()
    second.call("fs.write", {"path": "ws/a.txt", "content": "second"})
    second.commit()
    assert (project / "ws" / "a.txt").read_text() == "second"
    assert kernel.saga_record(second.id)["locks"] == []


def test_a_python_tool_declares_what_it_touches(make_kernel):
    balances: dict[str, int] = {}

    @tool(id="acct.pay", resources=["acct:$.args.account"])
    def pay(account: str, amount: int) -> dict:
        balances[account] = balances.get(account, 0) + amount
        return {"balance": balances[account]}

    @pay.compensation
    def unpay(args: dict, output: dict | None) -> None:
        balances[args["account"]] -= args["amount"]

    kernel = make_kernel(pay)
    one = kernel.begin(name="alice")
    one.call("acct.pay", {"account": "alice", "amount": 5})
    two = kernel.begin(name="bob")
    two.call("acct.pay", {"account": "bob", "amount": 7})
    with pytest.raises(Conflict, match="acct:alice"):
        two.call("acct.pay", {"account": "alice", "amount": 1})
    one.commit()
    two.commit()
    assert balances == {"alice": 5, "bob": 7}



def test_an_upstream_servers_call_is_undone_through_it_when_the_saga_rolls_back(project: Path, make_kernel, binary: Path):
    """An upstream MCP server (the binary's own `mcp`, allowed `up/ws`) behind a Python
    kernel, whose connection the package's runtime serves: a committed call stays, a rolled
    back one is compensated through the server."""
    up = project / "up"
    (up / "ws").mkdir(parents=True)
    (up / "sandbox.toml").write_text('[fs]\nallow = ["ws"]\n')
    # Its own tools file, so that it does not find this one and start itself again.
    (up / "tools.toml").write_text("")
    (project / "tools.toml").write_text(
        f"""
[mcp_servers.files]
command = ["{binary.resolve()}", "--db", "up/up.db", "--sandbox", "up/sandbox.toml", "--tools", "up/tools.toml", "-q", "mcp"]

[mcp_servers.files.tool.fs_write]
effect = "mutating"
reversibility = "full"
compensate = {{ tool = "fs_delete", args = {{ args = {{ path = "$.args.args.path", missing_ok = true }} }} }}
"""
    )
    kernel = make_kernel(tools=project / "tools.toml")
    with kernel.saga(name="kept") as saga:
        saga.call("files.fs_write", {"args": {"path": "up/ws/kept.txt", "content": "kept"}})
    assert (up / "ws" / "kept.txt").read_text() == "kept"
    with pytest.raises(RuntimeError, match="changed its mind"):
        with kernel.saga(name="undone") as saga:
            saga.call("files.fs_write", {"args": {"path": "up/ws/undone.txt", "content": "undone"}})
            assert (up / "ws" / "undone.txt").read_text() == "undone"
            raise RuntimeError("the agent changed its mind")
    assert not (up / "ws" / "undone.txt").exists()
    assert (up / "ws" / "kept.txt").read_text() == "kept"
    assert kernel.saga_record(saga.id)["state"] == "FailedRolledBack"
