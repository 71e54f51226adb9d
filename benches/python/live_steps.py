"""Live sagas of `noop` steps driven from Python through `agent_kernel`: the Python side of
benches/python/run.sh (the Rust side is the front-door crate's `live_steps` example).

    python live_steps.py SAGAS STEPS full|normal [builtin|python-tool]

`python-tool` calls a Python no-op tool instead of the built-in `noop`, so each step also
crosses from the engine back into Python. Prints one JSON line; building the kernel is not
timed.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from agent_kernel import Kernel, tool


@tool(id="py.noop", effect="read-only")
def py_noop() -> None:
    """Does nothing, in Python."""


def main() -> None:
    sagas, steps, durability = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    variant = sys.argv[4] if len(sys.argv) > 4 else "builtin"
    tool_id = {"builtin": "noop", "python-tool": "py.noop"}[variant]
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "sandbox.toml").write_text("")
        kernel = Kernel(
            db=Path(folder) / "bench.db",
            sandbox=Path(folder) / "sandbox.toml",
            fsm=None,
            durability=durability,
            cwd=folder,
            python_tools=[py_noop],
        )
        started = time.perf_counter()
        for _ in range(sagas):
            saga = kernel.begin()
            for _ in range(steps):
                saga.call(tool_id, {})
            saga.commit()
        seconds = time.perf_counter() - started
    print(
        json.dumps(
            {
                "driver": f"python ({variant})",
                "sagas": sagas,
                "steps": steps,
                "durability": durability,
                "seconds": seconds,
                "steps_per_s": sagas * steps / seconds,
            }
        )
    )


if __name__ == "__main__":
    main()
