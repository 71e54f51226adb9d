"""The kernel and its live sagas, over the native engine."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from . import _native
from ._tools import Tool
from .errors import (
    AgentKernelError,
    AwaitingApproval,
    BadInput,
    Conflict,
    Denied,
    OperatorAttention,
    SagaClosed,
    StepFailed,
    approval_of,
    from_native,
)

PathLike = str | os.PathLike[str]


def _native_call(function: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return function(*args, **kwargs)
    except _native.NativeError as error:
        raise from_native(error) from None


def _compensated(report: dict[str, Any]) -> list[int]:
    return [
        step["seq"]
        for step in report.get("steps", [])
        if step.get("status") == "COMPENSATED" and step.get("compensation") is not None
    ]


def _rolled_back(report: dict[str, Any], default: type[AgentKernelError]) -> AgentKernelError:
    failure = report.get("failure") or {}
    error = failure.get("error") or {}
    message = error.get("message") or f"saga {report.get('saga_id')} was rolled back"
    kind = error.get("kind")
    cls: type[AgentKernelError] = default
    if report.get("state") == "FailedRollbackPartial":
        cls = OperatorAttention
    elif kind == "denied":
        cls = Denied
    elif kind == "conflict":
        cls = Conflict
    return cls(
        message,
        saga_id=report.get("saga_id"),
        state=report.get("state"),
        compensated=_compensated(report),
        report=report,
    )


class Saga:
    """A live saga: each :meth:`call` runs one step, durably, and :meth:`commit` or
    :meth:`abort` ends it. As a context manager it commits when the block ends and rolls
    back when the block raises (an :class:`AwaitingApproval` excepted: the saga is left
    waiting for the operator, to :meth:`resume`). Calls of one saga run one at a time;
    different sagas run at once, from any number of threads or asyncio tasks."""

    def __init__(self, native: Any, kernel: Kernel) -> None:
        self._native = native
        self._kernel = kernel
        self._lock = threading.Lock()
        self.id: str = native.id
        self.closed = False
        self.report: dict[str, Any] | None = None

    def _native_call(self, function: Any, *args: Any) -> Any:
        """Calls the engine; an error it raises names this saga, and says whether the saga
        is still open."""
        try:
            return function(*args)
        except _native.NativeError as native:
            error = from_native(native)
        error.saga_id = self.id
        if self._native.status() is None:
            self.closed = True
            record = self._kernel.saga_record(self.id)
            error.state = record["state"] if record else None
        raise error

    def call(self, tool: str, args: dict[str, Any] | None = None, *, key: str | None = None) -> Any:
        """Runs one step and returns the tool's output (its ``data``).

        Raises :class:`BadInput` when nothing ran (the saga stays open),
        :class:`Denied` or :class:`StepFailed` when the saga was rolled back,
        :class:`OperatorAttention` when it could not be fully, :class:`AwaitingApproval`
        when the step waits for an operator, :class:`SagaClosed` when the saga has ended.
        """
        text = self._native_call(self._native.call, tool, json.dumps(args or {}), key)
        return self._answer(json.loads(text))

    def resume(self) -> Any:
        """Runs the step that waited for an approval once it is decided; as :meth:`call`
        (still pending: :class:`AwaitingApproval` again)."""
        return self._answer(json.loads(self._native_call(self._native.resume)))

    def _answer(self, answer: dict[str, Any]) -> Any:
        outcome = answer["outcome"]
        if outcome == "committed":
            output = answer.get("output") or {}
            return output.get("data")
        if outcome == "refused":
            error = BadInput(
                f"step {answer.get('step_idx')} (`{answer.get('tool')}`): {answer.get('message', 'refused')}",
                saga_id=self.id,
                state="open",
            )
            error.kind = answer.get("kind")
            raise error
        if outcome == "conflict":
            holder = answer.get("holder") or {}
            raise Conflict(
                answer.get("message", "conflict"),
                holder={
                    "saga_id": holder.get("saga_id"),
                    "state": holder.get("state"),
                    "alive": answer.get("alive"),
                    "resource": holder.get("resource"),
                },
                saga_id=self.id,
                state="open",
            )
        if outcome == "awaiting_approval":
            raise AwaitingApproval(
                f"step {answer.get('step_seq')} (`{answer.get('tool_id')}`) waits for an approval: "
                f"agent-kernel approve {answer.get('approval_id')}",
                approval=approval_of(answer),
                saga_id=self.id,
                state="AwaitingApproval",
            )
        with self._lock:
            self.closed = True
            self.report = answer
        raise _rolled_back(answer, Denied if outcome == "denied" else StepFailed)

    def commit(self) -> dict[str, Any]:
        """Ends the saga ``Done``; returns its report. Raises when it could not commit
        (then it was rolled back)."""
        with self._lock:
            report = json.loads(self._native_call(self._native.commit))
            return self._ended(report)

    def abort(self, reason: str = "aborted") -> dict[str, Any]:
        """Rolls the saga back, its committed steps compensated last first; returns the
        report."""
        with self._lock:
            report = json.loads(self._native_call(self._native.abort, reason))
            self.closed = True
            self.report = report
        if report.get("state") == "FailedRollbackPartial":
            raise _rolled_back(report, OperatorAttention)
        return report

    def _ended(self, report: dict[str, Any]) -> dict[str, Any]:
        self.closed = True
        self.report = report
        if report.get("state") != "Done":
            raise _rolled_back(report, StepFailed)
        return report

    def status(self) -> dict[str, Any] | None:
        """Where the saga stands (its state and committed steps), or ``None`` once ended."""
        text = _native_call(self._native.status)
        return None if text is None else json.loads(text)

    async def acall(self, tool: str, args: dict[str, Any] | None = None, *, key: str | None = None) -> Any:
        """:meth:`call` for asyncio: the step runs on a worker thread (the engine releases
        the GIL while it waits), so other tasks go on."""
        return await asyncio.to_thread(self.call, tool, args, key=key)

    async def aresume(self) -> Any:
        """:meth:`resume` for asyncio."""
        return await asyncio.to_thread(self.resume)

    async def acommit(self) -> dict[str, Any]:
        """:meth:`commit` for asyncio."""
        return await asyncio.to_thread(self.commit)

    async def aabort(self, reason: str = "aborted") -> dict[str, Any]:
        """:meth:`abort` for asyncio."""
        return await asyncio.to_thread(self.abort, reason)

    def _finish(self, error: BaseException | None) -> None:
        """What the end of a ``with`` block does: commit, or roll back after an exception
        (leaving a saga that waits for an approval as it is)."""
        if self.closed or isinstance(error, AwaitingApproval):
            return
        if error is None:
            self.commit()
            return
        try:
            self.abort(f"the block raised {type(error).__name__}: {error}"[:1000])
        except SagaClosed:
            # The engine ended it already (an idle timeout, a failed log): the block's own
            # exception is the one to see.
            pass

    def __enter__(self) -> Saga:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._finish(error)

    async def __aenter__(self) -> Saga:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self._finish, error)


class _SagaScope:
    """What :meth:`Kernel.saga` returns: a context manager, sync or async, that begins the
    saga on entry."""

    def __init__(self, kernel: Kernel, name: str | None, actor: str | None) -> None:
        self._kernel = kernel
        self._name = name
        self._actor = actor
        self._saga: Saga | None = None

    def _entered(self) -> None:
        if self._saga is not None:
            raise RuntimeError("kernel.saga(...) begins one saga: enter it once, call it again for another")

    def __enter__(self) -> Saga:
        self._entered()
        self._saga = self._kernel.begin(name=self._name, actor=self._actor)
        return self._saga

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        assert self._saga is not None
        self._saga.__exit__(kind, error, traceback)

    async def __aenter__(self) -> Saga:
        self._entered()
        self._saga = await asyncio.to_thread(self._kernel.begin, name=self._name, actor=self._actor)
        return self._saga

    async def __aexit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        assert self._saga is not None
        await self._saga.__aexit__(kind, error, traceback)


class Kernel:
    """A kernel: the log, the sandbox policy, the FSM table and the tools, with the command
    line's defaults (``$AGENT_KERNEL_DB`` or ``./agent-kernel.db``, ``./sandbox.toml`` or
    nothing allowed, ``./fsm.toml`` or the built-in table, ``./tools.toml`` if present).

    ``python_tools`` are functions declared with :func:`agent_kernel.tool`; ``durability``
    is ``"full"`` (every step synced before its effect) or ``"normal"``.
    """

    def __init__(
        self,
        db: PathLike | None = None,
        sandbox: PathLike | None = None,
        fsm: PathLike | None = None,
        tools: PathLike | None = None,
        durability: str = "full",
        *,
        python_tools: Sequence[Tool] = (),
        cwd: PathLike | None = None,
        drills: bool = False,
    ) -> None:
        self._native = _native_call(
            _native.NativeKernel,
            db=_path(db),
            sandbox=_path(sandbox),
            fsm=_path(fsm),
            tools=_path(tools),
            durability=durability,
            cwd=_path(cwd),
            python_tools=[tool._native() for tool in python_tools],
            drills=drills,
        )

    def begin(self, name: str | None = None, actor: str | None = None) -> Saga:
        """Begins a live saga (durably, before this returns)."""
        return Saga(_native_call(self._native.begin, name=name, actor=actor), self)

    def saga(self, name: str | None = None, *, actor: str | None = None) -> _SagaScope:
        """``with kernel.saga(name="…") as saga:`` (or ``async with``): begins a saga that
        commits when the block ends and rolls back when it raises."""
        return _SagaScope(self, name, actor)

    def run(self, plan: dict[str, Any] | str) -> dict[str, Any]:
        """Runs a plan (reference §2) to its end; returns the report, raising as a call would
        when the saga was rolled back."""
        text = plan if isinstance(plan, str) else json.dumps(plan)
        report = json.loads(_native_call(self._native.run_plan, text))
        if report.get("state") == "AwaitingApproval":
            approval = report.get("approval") or {}
            raise AwaitingApproval(
                f"the plan waits for an approval: agent-kernel approve {approval.get('id')}, "
                f"then agent-kernel resume --saga {report.get('saga_id')}",
                approval=approval,
                saga_id=report.get("saga_id"),
                state="AwaitingApproval",
                report=report,
            )
        if report.get("state") != "Done":
            raise _rolled_back(report, StepFailed)
        return report

    def recover(self) -> dict[str, Any]:
        """Rolls back the unfinished sagas of processes that died; returns what it did
        (``{"sagas": [...]}``, one entry per saga it looked at)."""
        return json.loads(_native_call(self._native.recover))

    def log(self, limit: int = 20) -> list[dict[str, Any]]:
        """The most recent sagas, newest first."""
        return json.loads(_native_call(self._native.sagas, limit))

    def saga_record(self, saga_id: str) -> dict[str, Any] | None:
        """One saga as the log holds it (``saga_id``, ``name``, ``state``, ``owner``…) with
        its ``steps`` (``step_seq``, ``tool_id``, ``status``, ``args``, ``output``…), the
        ``locks`` it holds (none once settled) and the ``conflicts`` its calls met, or
        ``None``."""
        text = _native_call(self._native.saga, saga_id)
        if text is None:
            return None
        record = json.loads(text)
        return {
            **record["saga"],
            "steps": record["steps"],
            "locks": record.get("locks", []),
            "conflicts": record.get("conflicts", []),
        }

    def approvals(self) -> list[dict[str, Any]]:
        """The approval requests waiting for a decision."""
        return json.loads(_native_call(self._native.approvals))

    @property
    def tool_ids(self) -> list[str]:
        """The ids of the tools this kernel runs."""
        return list(self._native.tool_ids())


def _path(path: PathLike | None) -> str | None:
    return None if path is None else os.fspath(path)
