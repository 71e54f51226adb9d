"""agent-kernel in front of real third-party MCP servers (reference §11): the npm reference
memory server and the PyPI git server, declared in tools.toml, driven through the real
binary with plans: a saga of upstream calls committed, one failing at its last step with
every earlier call compensated through the server (its state read back through its own
read tool), and a call of an undeclared mutating tool held for approval."""

import json
import os
import pathlib
import subprocess

BIN = os.environ["AGENT_KERNEL_BIN"]
MEMORY_SERVER = os.environ["MEMORY_SERVER"]
GIT_SERVER = os.environ["GIT_SERVER"]

MEMORY_TOOLS = f"""
[mcp_servers.memory]
command = ["{MEMORY_SERVER}"]
env = {{ MEMORY_FILE_PATH = "@MEMORY@" }}

[mcp_servers.memory.tool.create_entities]
effect = "mutating"
compensate = {{ tool = "delete_entities", args = {{ entityNames = "$.output.entities[*].name" }} }}

[mcp_servers.memory.tool.read_graph]
effect = "read-only"
"""

GIT_TOOLS = f"""
[mcp_servers.git]
command = ["{GIT_SERVER}"]

[mcp_servers.git.tool.git_add]
effect = "mutating"
reversibility = "partial"
compensate = {{ tool = "git_reset", args = {{ repo_path = "$.args.repo_path" }} }}

[mcp_servers.git.tool.git_status]
effect = "read-only"
"""


def project(tmp_path: pathlib.Path, tools: str) -> pathlib.Path:
    (tmp_path / "sandbox.toml").write_text("")
    # The memory server reads a relative path against its own folder: each test its own file.
    tools = tools.replace("@MEMORY@", str(tmp_path / "memory.json"))
    (tmp_path / "tools.toml").write_text(tools)
    return tmp_path


def kernel(project: pathlib.Path, *args: str) -> tuple[int, dict]:
    done = subprocess.run(
        [BIN, "--db", str(project / "log.db"), "--json", *args],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=180,
        env={key: value for key, value in os.environ.items() if not key.startswith("AGENT_KERNEL")},
    )
    try:
        document = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"exit {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done.returncode, document


def run_plan(project: pathlib.Path, name: str, steps: list, *extra: str) -> tuple[int, dict]:
    path = project / name
    path.write_text(json.dumps({"steps": steps}))
    return kernel(project, "run", *extra, "--plan", str(path))


def create(name: str) -> dict:
    return {
        "tool": "memory.create_entities",
        "args": {"entities": [{"name": name, "entityType": "person", "observations": ["seen"]}]},
    }


def graph_names(project: pathlib.Path) -> list[str]:
    code, report = run_plan(project, "read.json", [{"tool": "memory.read_graph", "args": {}}])
    assert code == 0, report
    return sorted(entity["name"] for entity in report["steps"][0]["output"]["data"]["entities"])


def test_memory_server_calls_commit_and_a_failing_saga_is_undone_through_the_server(tmp_path):
    proj = project(tmp_path, MEMORY_TOOLS)
    code, listed = kernel(proj, "tools", "--upstream")
    assert code == 0, listed
    tools = {tool["tool"]: tool for tool in listed["tools"]}
    assert tools["memory.read_graph"]["effect"] == "read-only"
    assert tools["memory.create_entities"]["reversibility"] == "full"
    assert tools["memory.delete_entities"]["needs_approval"] is True, "undeclared: irreversible"

    code, report = run_plan(proj, "ok.json", [create("alice"), create("bob")])
    assert code == 0 and report["state"] == "Done", report
    assert graph_names(proj) == ["alice", "bob"]

    code, report = run_plan(
        proj, "fails.json", [create("carol"), create("dave"), {"tool": "fault.fail", "args": {}}]
    )
    assert code == 1 and report["state"] == "FailedRolledBack", report
    assert [step["status"] for step in report["steps"]][:2] == ["COMPENSATED", "COMPENSATED"]
    # The server's own state is back as it was: only what the failed saga created is gone.
    assert graph_names(proj) == ["alice", "bob"]
    code, audit = kernel(proj, "audit", "verify")
    assert code == 0, audit


def test_an_undeclared_mutating_upstream_tool_waits_for_an_approval(tmp_path):
    proj = project(tmp_path, MEMORY_TOOLS)
    run_plan(proj, "ok.json", [create("alice")])
    code, report = run_plan(
        proj,
        "delete.json",
        [{"tool": "memory.delete_entities", "args": {"entityNames": ["alice"]}}],
        "--no-wait",
    )
    assert code == 5, report
    assert report["approval"]["tool"] == "memory.delete_entities"
    assert graph_names(proj) == ["alice"], "nothing ran"


def test_git_server_add_is_undone_by_reset_when_the_saga_fails(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = lambda *args: subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True)
    git("init", "-q")
    git("-c", "user.email=a@example.com", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "start")
    (repo / "new.txt").write_text("new")
    proj = project(tmp_path, GIT_TOOLS)
    add = {"tool": "git.git_add", "args": {"repo_path": str(repo), "files": ["new.txt"]}}
    code, report = run_plan(proj, "fails.json", [add, {"tool": "fault.fail", "args": {}}])
    assert code == 1 and report["state"] == "FailedRolledBack", report
    assert git("diff", "--cached", "--name-only").stdout == "", "unstaged again"
    code, report = run_plan(proj, "ok.json", [add])
    assert code == 0, report
    assert git("diff", "--cached", "--name-only").stdout.split() == ["new.txt"]


def test_an_agent_aborts_a_saga_over_the_kernels_mcp_server_and_the_upstream_effect_is_undone(tmp_path):
    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    proj = project(tmp_path, MEMORY_TOOLS)

    async def scenario():
        params = StdioServerParameters(
            command=BIN,
            args=["--db", str(proj / "log.db"), "-q", "mcp"],
            cwd=str(proj),
            env={key: value for key, value in os.environ.items() if not key.startswith("AGENT_KERNEL")},
        )
        async with stdio_client(params) as streams:
            async with ClientSession(streams[0], streams[1]) as client:
                await client.initialize()
                names = {tool.name for tool in (await client.list_tools()).tools}
                assert "memory_create_entities" in names, sorted(names)
                begun = await client.call_tool("saga_begin", {"name": "agent"})
                saga = begun.structured_content["saga_id"]
                made = await client.call_tool(
                    "memory_create_entities", {"saga_id": saga, "args": create("erin")["args"]}
                )
                assert not made.is_error, made
                read = await client.call_tool("memory_read_graph", {"args": {}})
                assert [e["name"] for e in read.structured_content["output"]["entities"]] == ["erin"]
                aborted = await client.call_tool("saga_abort", {"saga_id": saga})
                assert not aborted.is_error and aborted.structured_content["state"] == "FailedRolledBack"

    anyio.run(scenario)
    assert graph_names(proj) == [], "undone through the upstream server"
