#!/usr/bin/env bash
# Runs the Python MCP client suite against the real `agent-kernel mcp`: creates a venv
# (under target/, rebuilt when requirements.txt changes), installs the pinned official
# `mcp` client and pytest, builds the binary, and runs tests/mcp/test_server.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
source .ci/venv.sh
venv="target/mcp-client-venv"
ensure_venv "$venv" tests/mcp/requirements.txt
ensure_binary
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/mcp
