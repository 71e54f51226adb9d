"""Type stubs of the native module (the Rust engine); use the `agent_kernel` package instead."""

from collections.abc import Callable, Sequence
from os import PathLike

RUNTIME_WORKERS: int

def python_phases_running() -> int:
    """How many phases of Python tools are running now on the engine's threads."""

class NativeError(Exception):
    """`args` is `(kind, message)`; `agent_kernel` raises its own exceptions from it."""

class NativeTool:
    def __init__(
        self,
        id: str,
        execute: Callable[[str], str],
        *,
        compensate: Callable[[str, str, str], str] | None = None,
        prepare: Callable[[str], str] | None = None,
        probe: Callable[[str, str], str] | None = None,
        effect: str = "mutating",
        idempotent: bool = False,
        settlement: str = "compensate",
        reversibility: str | None = None,
        undo_window: str | None = None,
        schema: str = '{"type":"object"}',
        description: str = "",
        version: str = "1",
        timeout_ms: int | None = None,
        resources: Sequence[str] = (),
        duplicate_keys: Sequence[str] = (),
    ) -> None: ...
    @property
    def id(self) -> str: ...

class NativeSaga:
    @property
    def id(self) -> str: ...
    def call(self, tool: str, args: str, key: str | None = None) -> str: ...
    def resume(self) -> str: ...
    def commit(self) -> str: ...
    def abort(self, reason: str) -> str: ...
    def status(self) -> str | None: ...

class NativeKernel:
    def __init__(
        self,
        db: str | PathLike[str] | None = None,
        sandbox: str | PathLike[str] | None = None,
        fsm: str | PathLike[str] | None = None,
        tools: str | PathLike[str] | None = None,
        durability: str = "full",
        cwd: str | PathLike[str] | None = None,
        python_tools: Sequence[NativeTool] = (),
        drills: bool = False,
    ) -> None: ...
    def begin(self, name: str | None = None, actor: str | None = None) -> NativeSaga: ...
    def live_saga(self, saga_id: str) -> NativeSaga | None: ...
    def run_plan(self, plan: str) -> str: ...
    def recover(self) -> str: ...
    def sagas(self, limit: int = 20) -> str: ...
    def saga(self, saga_id: str) -> str | None: ...
    def approvals(self) -> str: ...
    def tool_ids(self) -> list[str]: ...
