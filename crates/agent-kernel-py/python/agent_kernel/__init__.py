"""agent-kernel from Python: every tool call a step of a saga, over the Rust engine.

>>> from agent_kernel import Kernel
>>> kernel = Kernel(db="agent-kernel.db", sandbox="sandbox.toml")  # doctest: +SKIP
>>> with kernel.saga(name="notes") as saga:                        # doctest: +SKIP
...     saga.call("fs.write", {"path": "workspace/a.txt", "content": "hello"})

The block commits when it ends and rolls back (every committed step compensated, last
first) when it raises.
"""

import atexit as _atexit
import importlib.metadata as _metadata
import time as _time

from . import _native
from ._kernel import Kernel, Saga
from ._tools import Tool, schema_of, tool
from .errors import (
    AgentKernelError,
    AwaitingApproval,
    BadInput,
    Conflict,
    Denied,
    LogError,
    NotApplied,
    OperatorAttention,
    SagaClosed,
    StepFailed,
)

#: The installed package's version (the workspace's).
__version__ = _metadata.version("agent-kernel")

__all__ = [
    "AgentKernelError",
    "AwaitingApproval",
    "BadInput",
    "Conflict",
    "Denied",
    "Kernel",
    "LogError",
    "NotApplied",
    "OperatorAttention",
    "Saga",
    "SagaClosed",
    "StepFailed",
    "Tool",
    "schema_of",
    "tool",
]

#: How long the interpreter's exit waits for Python tools still running on the engine's
#: threads (one that outlived its timeout, say), in seconds.
TOOLS_DRAIN_AT_EXIT_S = 10.0


@_atexit.register
def _wait_for_tools() -> None:
    """At exit, waits (at most ``TOOLS_DRAIN_AT_EXIT_S``) for Python tools still running on
    the engine's threads: one still in Python code when the interpreter finalizes would
    abort the process."""
    deadline = _time.monotonic() + TOOLS_DRAIN_AT_EXIT_S
    while _native.python_phases_running() and _time.monotonic() < deadline:
        _time.sleep(0.01)
