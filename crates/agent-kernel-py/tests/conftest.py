"""Fixtures: a project folder with a workspace the policy allows, and kernels over it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent_kernel import Kernel


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A folder with `ws/` (the only folder the policy allows) and `sandbox.toml`."""
    (tmp_path / "ws").mkdir()
    (tmp_path / "sandbox.toml").write_text('[fs]\nallow = ["ws"]\n')
    return tmp_path


@pytest.fixture
def make_kernel(project: Path):
    """Builds a kernel on the project's log and policy, with the given Python tools."""

    def make(*python_tools, **options) -> Kernel:
        options.setdefault("db", project / "agent-kernel.db")
        options.setdefault("sandbox", project / "sandbox.toml")
        options.setdefault("fsm", None)
        options.setdefault("cwd", project)
        return Kernel(python_tools=python_tools, **options)

    return make


@pytest.fixture
def binary() -> Path:
    """The `agent-kernel` binary (`$AGENT_KERNEL_BIN`, which the suite's run.sh sets)."""
    path = Path(os.environ.get("AGENT_KERNEL_BIN", "target/debug/agent-kernel"))
    if not path.is_file():
        pytest.fail(f"no agent-kernel binary at {path}: set AGENT_KERNEL_BIN")
    return path
