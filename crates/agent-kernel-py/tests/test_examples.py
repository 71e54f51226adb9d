"""The README's Python example runs as documented."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_langgraph_example_undoes_its_notes_when_the_third_call_fails():
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "python" / "langgraph_agent.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "FailedRolledBack" in run.stdout
    assert run.stdout.count(": COMPENSATED") == 3
    assert run.stdout.rstrip().endswith("notes after the run: {}")
