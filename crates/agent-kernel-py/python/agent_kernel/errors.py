"""The exceptions of agent-kernel: one base class, one subclass per way a call can end badly.

Each carries what the engine reported: ``saga_id``, ``state`` (the saga's state after the
error, e.g. ``"FailedRolledBack"``), ``compensated`` (the steps undone, as their positions)
and ``report`` (the whole report as a dict, or ``None``).
"""

from __future__ import annotations

from typing import Any


class AgentKernelError(Exception):
    """Something the kernel refused or could not do."""

    def __init__(
        self,
        message: str,
        *,
        saga_id: str | None = None,
        state: str | None = None,
        compensated: list[int] | None = None,
        report: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.saga_id = saga_id
        self.state = state
        self.compensated = compensated or []
        self.report = report
        #: For a refused call, what was wrong: ``unknown_tool``, ``invalid_args``,
        #: ``key_conflict``…; otherwise ``None``.
        self.kind: str | None = None


class BadInput(AgentKernelError):
    """Bad input: an unknown tool, arguments that fail its schema, an idempotency key bound to
    other arguments, an invalid policy, table or tools file. Nothing ran; an open saga stays
    open."""


class Denied(AgentKernelError):
    """The sandbox or the FSM guardrail denied a call; the saga was rolled back."""


class StepFailed(AgentKernelError):
    """A tool failed (an error, a timeout, an exception); the saga was rolled back."""


class OperatorAttention(AgentKernelError):
    """The saga could not be fully rolled back (``FailedRollbackPartial``): a compensation
    failed or an outcome is unknown, and a dead letter waits for an operator."""


class AwaitingApproval(AgentKernelError):
    """The step needs an operator's approval (``agent-kernel approve ID``); nothing of it ran.
    ``approval`` holds the request as ``kernel.approvals()`` lists it (``id``, ``saga_id``,
    ``step``, ``tool``, ``digest``, ``args``, ``expires_at``); call ``saga.resume()`` once
    it is decided. Leaving a ``with kernel.saga()`` block with it leaves the saga waiting."""

    def __init__(self, message: str, *, approval: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.approval = approval


class Conflict(AgentKernelError):
    """Another saga that is not settled holds a resource the call would claim (a file, an
    account): nothing of the call ran. A live saga stays open (try something else, or the
    same call once the holder is settled); a plan was rolled back. ``holder`` is
    ``{"saga_id", "state", "alive", "resource"}`` when known; a holder whose process is gone
    (``alive`` false) keeps its locks until ``kernel.recover()`` settles it."""

    def __init__(self, message: str, *, holder: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.holder = holder


class SagaClosed(AgentKernelError):
    """The saga has ended (committed, rolled back, or lost with its process)."""


class LogError(AgentKernelError):
    """The log failed; a saga in flight is left for ``recover``."""


class NotApplied(Exception):
    """Raised by a tool's function to say it failed *before* any effect: the step fails
    definitely and is not compensated. Any other exception leaves the outcome unknown, and
    the step is settled by the tool's settlement (compensated, by default)."""


_KINDS: dict[str, type[AgentKernelError]] = {
    "bad_input": BadInput,
    "denied": Denied,
    "conflict": Conflict,
    "saga_closed": SagaClosed,
    "not_found": BadInput,
    "log": LogError,
    "operator_attention": OperatorAttention,
}


def approval_of(request: dict[str, Any]) -> dict[str, Any]:
    """A request as the engine's call answer holds it, in the shape ``kernel.approvals()``
    lists requests."""
    import datetime

    expires = request.get("expires_at_ms")
    return {
        "id": request.get("approval_id"),
        "saga_id": request.get("saga_id"),
        "step": request.get("step_seq"),
        "tool": request.get("tool_id"),
        "digest": request.get("digest"),
        "args": request.get("args"),
        "expires_at": None
        if expires is None
        else datetime.datetime.fromtimestamp(expires / 1000, datetime.timezone.utc)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z"),
    }


def from_native(error: Exception) -> AgentKernelError:
    """The exception for a ``NativeError(kind, message)`` of the engine."""
    kind, message = error.args if len(error.args) == 2 else ("kernel", str(error))
    return _KINDS.get(kind, AgentKernelError)(message)
