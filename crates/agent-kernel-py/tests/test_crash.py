"""A Python process holding a saga is SIGKILLed; `agent-kernel recover` from the command
line puts every file back, and a program with the Python tool recovers the saga it used."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from agent_kernel import tool

HOLDER = textwrap.dedent(
    """
    import sys, time
    from agent_kernel import Kernel, tool

    project = sys.argv[1]
    with_python_tool = sys.argv[2] == "yes"
    marks = []

    @tool(id="marks.add")
    def add(mark: str) -> None:
        with open(project + "/ws/marks.txt", "a") as f:
            f.write(mark + "\\n")

    @add.compensation
    def remove(args, output):
        raise AssertionError("compensated by the dying process")

    kernel = Kernel(db=project + "/agent-kernel.db", sandbox=project + "/sandbox.toml",
                    cwd=project, python_tools=[add] if with_python_tool else [])
    saga = kernel.begin(name="held")
    saga.call("fs.write", {"path": "ws/a.txt", "content": "changed"})
    saga.call("fs.delete", {"path": "ws/b.txt"})
    if with_python_tool:
        saga.call("marks.add", {"mark": "m1"})
    print("ready", flush=True)
    time.sleep(60)
    """
)


def hold_and_kill(project: Path, with_python_tool: bool) -> None:
    (project / "ws" / "a.txt").write_text("original a")
    (project / "ws" / "b.txt").write_text("original b")
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(project), "yes" if with_python_tool else "no"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL
    assert (project / "ws" / "a.txt").read_text() == "changed"
    assert not (project / "ws" / "b.txt").exists()


def cli(binary: Path, project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(binary), "--db", "agent-kernel.db", *args],
        cwd=project,
        capture_output=True,
        text=True,
        env={key: value for key, value in os.environ.items() if not key.startswith("AGENT_KERNEL_DB")},
    )


def test_a_sigkilled_python_process_is_recovered_by_the_command_line(project: Path, binary: Path):
    hold_and_kill(project, with_python_tool=False)
    recovered = cli(binary, project, "recover")
    assert recovered.returncode == 0, recovered.stderr
    assert (project / "ws" / "a.txt").read_text() == "original a"
    assert (project / "ws" / "b.txt").read_text() == "original b"
    assert cli(binary, project, "audit", "verify").returncode == 0


def test_a_saga_with_a_python_tool_waits_for_a_program_that_has_it(project: Path, binary: Path, make_kernel):
    hold_and_kill(project, with_python_tool=True)
    assert (project / "ws" / "marks.txt").read_text() == "m1\n"
    # The command line lacks the Python tool: it leaves the saga as it is (exit 3).
    recovered = cli(binary, project, "recover")
    assert recovered.returncode == 3, recovered.stderr
    assert (project / "ws" / "a.txt").read_text() == "changed"

    @tool(id="marks.add")
    def add(mark: str) -> None:
        raise AssertionError("not run again")

    @add.compensation
    def remove(args, output):
        (project / "ws" / "marks.txt").write_text("")

    report = make_kernel(add).recover()
    assert (project / "ws" / "marks.txt").read_text() == ""
    assert (project / "ws" / "a.txt").read_text() == "original a"
    assert (project / "ws" / "b.txt").read_text() == "original b"
    assert len(report["sagas"]) == 1, report
    assert cli(binary, project, "recover").returncode == 0
