#!/usr/bin/env bash
# Runs the Python MCP client suite against the real `agent-kernel mcp`: creates a venv
# (under target/, rebuilt when requirements.txt changes), installs the pinned official
# `mcp` client and pytest, builds the binary, and runs tests/mcp/test_server.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="target/mcp-client-venv"
stamp="$venv/.requirements"
if ! cmp -s tests/mcp/requirements.txt "$stamp" 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/mcp/requirements.txt
    cp tests/mcp/requirements.txt "$stamp"
fi
cargo build --locked -q -p agent-kernel-cli
AGENT_KERNEL_BIN="$PWD/target/debug/agent-kernel" \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/mcp
