"""Python functions as transactional tools, run by the Rust engine's dispatcher."""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Callable
from typing import Any

from . import _native
from .errors import NotApplied

_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
}


def schema_of(function: Callable[..., Any]) -> dict[str, Any]:
    """A JSON Schema for a function's keyword arguments, from its type hints: ``str``,
    ``int``, ``float``, ``bool``, ``list``, ``dict`` (``list[X]`` and ``dict[str, X]`` as
    ``array`` and ``object``, their items unchecked; ``X | None`` also allows ``null``; any
    other hint allows anything); a parameter without a default is required; no other
    property is allowed."""
    hints = typing.get_type_hints(function)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, parameter in inspect.signature(function).parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        properties[name] = _schema_of_hint(hints.get(name, Any))
        if parameter.default is parameter.empty:
            required.append(name)
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = required
    return schema


def _schema_of_hint(hint: Any) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        inner = _schema_of_hint(options[0]) if len(options) == 1 else {}
        return {"anyOf": [inner, {"type": "null"}]} if inner else {}
    if origin in (list, dict):
        return {"type": _JSON_TYPES[origin]}
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    return {}


def _answer(run: Callable[[], Any]) -> str:
    """Runs one phase and tells the engine how it went, as JSON text."""
    try:
        value = run()
    except NotApplied as error:
        return json.dumps({"failed": str(error) or type(error).__name__})
    except Exception as error:  # noqa: BLE001 - every exception of a tool is reported
        return json.dumps({"uncertain": f"{type(error).__name__}: {error}"})
    try:
        return json.dumps({"ok": value})
    except (TypeError, ValueError) as error:
        # It returned, so its effect happened; only its answer cannot be recorded.
        return json.dumps(
            {"uncertain": f"it returned a value that is not JSON ({type(value).__name__}): {error}"}
        )


class Tool:
    """A Python function declared as a transactional tool (see :func:`tool`)."""

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        id: str,
        effect: str,
        compensate: Callable[..., Any] | None,
        prepare: Callable[..., Any] | None,
        probe: Callable[..., Any] | None,
        idempotent: bool,
        settlement: str,
        reversibility: str | None,
        undo_window: str | None,
        schema: dict[str, Any] | None,
        description: str | None,
        version: str,
        timeout_ms: int | None,
        resources: list[str] | None = None,
        duplicate_keys: list[str] | None = None,
    ) -> None:
        self.function = function
        self.id = id
        self.effect = effect
        self.compensate_function = compensate
        self.prepare_function = prepare
        self.probe_function = probe
        self.idempotent = idempotent
        self.settlement = settlement
        self.reversibility = reversibility
        self.undo_window = undo_window
        self.schema = schema if schema is not None else schema_of(function)
        self.description = description if description is not None else inspect.getdoc(function) or ""
        self.version = version
        self.timeout_ms = timeout_ms
        self.resources = list(resources or [])
        self.duplicate_keys = list(duplicate_keys or [])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calls the function itself, outside any saga."""
        return self.function(*args, **kwargs)

    def compensation(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Declares ``function(args, output)`` (or ``(args, output, undo)``) as the
        compensation; use as a decorator."""
        self.compensate_function = function
        return function

    def preparation(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Declares ``function(**args)`` as the preparation: what it returns (JSON) is made
        durable before the effect and given to the compensation as ``undo``."""
        self.prepare_function = function
        return function

    def probing(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Declares ``function(args, undo)`` as the probe: ``True`` the effect happened,
        ``False`` it did not, ``None`` unknown."""
        self.probe_function = function
        return function

    def _native(self) -> Any:
        function, compensate, prepare, probe = (
            self.function,
            self.compensate_function,
            self.prepare_function,
            self.probe_function,
        )
        takes_undo = compensate is not None and len(inspect.signature(compensate).parameters) >= 3

        def execute(args: str) -> str:
            return _answer(lambda: function(**json.loads(args)))

        def native_compensate(args: str, output: str, undo: str) -> str:
            assert compensate is not None
            parsed = (json.loads(args), json.loads(output))
            if takes_undo:
                return _answer(lambda: compensate(*parsed, json.loads(undo)))
            return _answer(lambda: compensate(*parsed))

        def native_prepare(args: str) -> str:
            assert prepare is not None
            return _answer(lambda: prepare(**json.loads(args)))

        def native_probe(args: str, undo: str) -> str:
            assert probe is not None
            return _answer(lambda: probe(json.loads(args), json.loads(undo)))

        return _native.NativeTool(
            self.id,
            execute,
            compensate=native_compensate if compensate is not None else None,
            prepare=native_prepare if prepare is not None else None,
            probe=native_probe if probe is not None else None,
            effect=self.effect,
            idempotent=self.idempotent,
            settlement=self.settlement,
            reversibility=self.reversibility,
            undo_window=self.undo_window,
            schema=json.dumps(self.schema),
            description=self.description,
            version=self.version,
            timeout_ms=self.timeout_ms,
            resources=self.resources,
            duplicate_keys=self.duplicate_keys,
        )


def tool(
    id: str | None = None,
    *,
    effect: str = "mutating",
    compensate: Callable[..., Any] | None = None,
    prepare: Callable[..., Any] | None = None,
    probe: Callable[..., Any] | None = None,
    idempotent: bool = False,
    settlement: str = "compensate",
    reversibility: str | None = None,
    undo_window: str | None = None,
    schema: dict[str, Any] | None = None,
    description: str | None = None,
    version: str = "1",
    timeout_ms: int | None = None,
    resources: list[str] | None = None,
    duplicate_keys: list[str] | None = None,
) -> Callable[[Callable[..., Any]], Tool]:
    """Declares a function as a transactional tool of the kernel.

    The function is called with the step's arguments as keyword arguments and returns its
    output (anything JSON can hold). ``compensate(args, output)`` undoes it (``output`` is
    ``None`` when the outcome was unknown); ``prepare(**args)`` may capture what undoing
    needs before the effect (then ``compensate(args, output, undo)``); ``probe(args, undo)``
    tells whether an effect of unknown outcome happened (for ``settlement="probe"``).

    ``effect`` is ``"mutating"`` or ``"read-only"``; a mutating tool needs a compensation or
    ``reversibility="none"`` (then every call waits for an operator's approval). The schema
    comes from the type hints unless given. Raise :class:`NotApplied` for a failure before
    any effect; any other exception leaves the outcome unknown.

    ``resources`` names what a call touches, as JSONPath over ``{"args": …}`` with an
    optional literal prefix (``["acct:$.args.account"]``): no other saga may touch it until
    this one is settled (a call that would raises :class:`Conflict`). Without it, a
    mutating tool is one resource, its id. ``duplicate_keys`` (reversibility ``"none"`` or
    ``"partial"`` only, e.g. ``["$.args.invoice"]``) makes a call that repeats one of the
    tool's steps of the last ``[limits] duplicate_window`` wait for an operator.
    """
    options = {name: value for name, value in locals().items() if name != "id"}

    def declare(function: Callable[..., Any]) -> Tool:
        return Tool(function, id=id or function.__name__, **options)

    return declare
