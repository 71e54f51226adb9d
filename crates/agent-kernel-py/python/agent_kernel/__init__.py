"""agent-kernel from Python: every tool call a step of a saga, over the Rust engine.

>>> from agent_kernel import Kernel
>>> kernel = Kernel(db="agent-kernel.db", sandbox="sandbox.toml")  # doctest: +SKIP
>>> with kernel.saga(name="notes") as saga:                        # doctest: +SKIP
...     saga.call("fs.write", {"path": "workspace/a.txt", "content": "hello"})

The block commits when it ends and rolls back (every committed step compensated, last
first) when it raises.
"""

from ._kernel import Kernel, Saga
from ._tools import Tool, schema_of, tool
from .errors import (
    AgentKernelError,
    AwaitingApproval,
    BadInput,
    Denied,
    LogError,
    NotApplied,
    OperatorAttention,
    SagaClosed,
    StepFailed,
)

__all__ = [
    "AgentKernelError",
    "AwaitingApproval",
    "BadInput",
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
