"""Fixtures for the MCP client suite: a scratch project and sessions with the real server."""

import contextlib
import os
import pathlib

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

BIN = os.environ.get("AGENT_KERNEL_BIN", "target/debug/agent-kernel")


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def project(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "ws").mkdir()
    (tmp_path / "sandbox.toml").write_text(
        '[fs]\nallow = ["ws"]\nmax_io_bytes = 65536\n'
    )
    return tmp_path


@contextlib.asynccontextmanager
async def session(project: pathlib.Path, *extra: str, logging_callback=None):
    """An initialized client session with `agent-kernel mcp` in `project`; the server's
    notifications/message go to `logging_callback`."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("AGENT_KERNEL")}
    params = StdioServerParameters(
        command=str(pathlib.Path(BIN).resolve()),
        args=["--db", str(project / "log.db"), "-q", "mcp", *extra],
        cwd=str(project),
        env=env,
    )
    async with stdio_client(params) as streams:
        async with ClientSession(streams[0], streams[1], logging_callback=logging_callback) as client:
            # What the server said of itself, for the tests of its instructions.
            client.initialized = await client.initialize()
            yield client
