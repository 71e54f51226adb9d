"""LangGraph: every tool call of a graph run as a step of one saga.

Put :meth:`KernelToolCalls.wrap` (and :meth:`~KernelToolCalls.awrap` for ``ainvoke``) on the
graph's ``ToolNode`` (``ToolNode(tools, wrap_tool_call=calls.wrap, awrap_tool_call=calls.awrap)``),
declare the tools with :func:`transactional` so the kernel knows how to undo them, and run
the graph through :meth:`KernelToolCalls.invoke` / :meth:`~KernelToolCalls.ainvoke` (or
inside ``with calls.run(config):``). The saga commits when the run ends and rolls back,
every tool call of the run undone last first, when the run raises or is interrupted. Each
``ToolMessage`` carries the saga id in its ``artifact``.

The kernel runs a tool as ``tool.invoke(args)`` on its own thread, outside the graph's
context: a tool that needs the run's config, ``InjectedState`` or ``interrupt()`` is not
supported. An interrupted run's tool calls are undone, while their ``ToolMessage``\ s stay in
the checkpoint: resume such a thread with a new run, not ``Command(resume=…)``.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ._kernel import Kernel, Saga
from ._tools import Tool, tool
from .errors import SagaClosed

try:
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import BaseTool
except ImportError as error:  # pragma: no cover - the extra is not installed
    raise ImportError(
        "agent_kernel.langgraph needs LangGraph: pip install 'agent-kernel[langgraph]'"
    ) from error

_CURRENT: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar(
    "agent_kernel_langgraph_scope", default=None
)


def transactional(
    base: BaseTool,
    *,
    compensate: Callable[[dict[str, Any], Any], Any] | None = None,
    effect: str = "mutating",
    reversibility: str | None = None,
    idempotent: bool = False,
    timeout_ms: int | None = None,
) -> Tool:
    """A LangChain tool as a kernel tool of the same name: the kernel runs it
    (``base.invoke(args)``) as a saga step and undoes it with ``compensate(args, output)``.
    A read-only tool (``effect="read-only"``) needs no compensation."""
    schema = base.get_input_schema().model_json_schema()

    def run(**args: Any) -> Any:
        result = base.invoke(args)
        if hasattr(result, "content"):
            return result.content
        return result

    declared = tool(
        base.name,
        effect=effect,
        compensate=compensate,
        reversibility=reversibility,
        idempotent=idempotent,
        schema={
            key: schema[key] for key in ("type", "properties", "required", "$defs") if key in schema
        },
        description=base.description,
        timeout_ms=timeout_ms,
    )(run)
    return declared


class _Scope:
    """The saga of one run (or thread), begun at its first tool call."""

    def __init__(self, calls: KernelToolCalls, name: str) -> None:
        self.calls = calls
        self.name = name
        self.saga: Saga | None = None
        self.lock = threading.Lock()

    def saga_for_call(self) -> Saga:
        with self.lock:
            if self.saga is None:
                self.saga = self.calls.kernel.begin(name=self.name)
            elif self.saga.closed:
                # One saga per run: after a rollback, no call of the run starts another.
                raise SagaClosed(
                    f"the saga of this run ended {self.saga.report and self.saga.report.get('state')}; "
                    "its later tool calls are refused",
                    saga_id=self.saga.id,
                )
            return self.saga

    def finish(self, error: BaseException | None) -> None:
        with self.lock:
            if self.saga is not None:
                self.saga._finish(error)

    def end_if_interrupted(self, result: Any) -> None:
        """Rolls the saga back when a graph's result says the run was interrupted: what it
        did stays undone until the run is resumed as a new one."""
        interrupts = result.get("__interrupt__") if isinstance(result, dict) else None
        if interrupts:
            with self.lock:
                if self.saga is not None and not self.saga.closed:
                    self.saga.abort(f"the graph run was interrupted: {interrupts!r}"[:1000])


class KernelToolCalls:
    """The tool calls of a graph, through a kernel.

    ``per="run"``: one saga per :meth:`run` (or :meth:`invoke`); ``per="thread"``: one per
    ``thread_id`` of the config, kept open across runs of the thread until
    :meth:`commit_thread` (a run that raises rolls the thread's saga back).
    """

    def __init__(self, kernel: Kernel, *, per: str = "run") -> None:
        if per not in ("run", "thread"):
            raise ValueError(f"per is 'run' or 'thread', not {per!r}")
        self.kernel = kernel
        self.per = per
        self._threads: dict[str, _Scope] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def run(self, config: dict[str, Any] | None = None) -> Iterator[_Scope]:
        """The scope of one graph run: the saga of its tool calls commits when the block
        ends and rolls back when it raises (an interrupt included)."""
        scope = self._scope(config)
        token = _CURRENT.set(scope)
        try:
            yield scope
        except BaseException as error:
            self._end(scope, error)
            raise
        else:
            self._end(scope, None)
        finally:
            _CURRENT.reset(token)

    def _end(self, scope: _Scope, error: BaseException | None) -> None:
        """The end of a run: a failure rolls its saga back (and a thread's saga is
        forgotten); a success commits a run's saga and leaves a thread's open."""
        if error is not None:
            scope.finish(error)
            if self.per == "thread":
                self._forget(scope)
        elif self.per == "run":
            scope.finish(None)

    def invoke(self, graph: Any, inputs: Any, config: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        """``graph.invoke(inputs, config)`` inside :meth:`run`; a run that ends interrupted
        (``__interrupt__`` in its result) is rolled back too."""
        with self.run(config) as scope:
            result = graph.invoke(inputs, config, **kwargs)
            scope.end_if_interrupted(result)
            return result

    async def ainvoke(self, graph: Any, inputs: Any, config: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        """``await graph.ainvoke(inputs, config)`` as :meth:`invoke`; the saga's commit or
        rollback runs on a worker thread, off the event loop."""
        import asyncio

        scope = self._scope(config)
        token = _CURRENT.set(scope)
        try:
            result = await graph.ainvoke(inputs, config, **kwargs)
            await asyncio.to_thread(scope.end_if_interrupted, result)
        except BaseException as error:
            await asyncio.to_thread(self._end, scope, error)
            raise
        else:
            await asyncio.to_thread(self._end, scope, None)
            return result
        finally:
            _CURRENT.reset(token)

    def commit_thread(self, thread_id: str) -> dict[str, Any] | None:
        """Commits the saga of a thread (``per="thread"``); its report, or ``None``."""
        with self._lock:
            scope = self._threads.pop(thread_id, None)
        if scope is None or scope.saga is None or scope.saga.closed:
            return None
        return scope.saga.commit()

    def saga_id(self) -> str | None:
        """The id of the saga of the run in progress, once a tool was called."""
        scope = _CURRENT.get()
        return None if scope is None or scope.saga is None else scope.saga.id

    def wrap(self, request: Any, execute: Callable[[Any], Any]) -> Any:
        """The ``wrap_tool_call`` of a ``ToolNode``: the call is a step of the run's saga."""
        scope = _CURRENT.get()
        if scope is None:
            raise RuntimeError(
                "a tool call outside KernelToolCalls.run(): run the graph with calls.invoke(graph, …)"
            )
        call = request.tool_call
        saga = scope.saga_for_call()
        output = saga.call(call["name"], dict(call.get("args") or {}), key=None)
        content = output if isinstance(output, str) else json.dumps(output)
        return ToolMessage(
            content=content,
            tool_call_id=call["id"],
            name=call["name"],
            artifact={"agent_kernel_saga_id": saga.id},
        )

    async def awrap(self, request: Any, execute: Callable[[Any], Any]) -> Any:
        """The ``awrap_tool_call`` of a ``ToolNode``, for ``ainvoke``: as :meth:`wrap`, the
        step on a worker thread."""
        import asyncio

        context = contextvars.copy_context()
        return await asyncio.to_thread(context.run, self.wrap, request, execute)

    def _scope(self, config: dict[str, Any] | None) -> _Scope:
        configurable = (config or {}).get("configurable", {})
        thread_id = configurable.get("thread_id")
        if self.per == "run":
            return _Scope(self, f"langgraph run (thread {thread_id})" if thread_id else "langgraph run")
        if thread_id is None:
            raise ValueError('per="thread" needs config={"configurable": {"thread_id": …}}')
        with self._lock:
            return self._threads.setdefault(thread_id, _Scope(self, f"langgraph thread {thread_id}"))

    def _forget(self, scope: _Scope) -> None:
        with self._lock:
            for key, value in list(self._threads.items()):
                if value is scope:
                    del self._threads[key]
