#!/usr/bin/env bash
# Runs the upstream suite: agent-kernel in front of real third-party MCP servers, the npm
# reference memory server and the PyPI git server, installed here (npm into a prefix under
# target/, pip into a venv under target/, both rebuilt when their pins change), then
# tests/upstream/test_servers.py drives the real binary with plans through them.
set -euo pipefail
cd "$(dirname "$0")/../.."
root="target/upstream-servers"
mkdir -p "$root"
if ! cmp -s tests/upstream/package.json "$root/package.json" 2>/dev/null; then
    rm -rf "$root/node_modules"
    cp tests/upstream/package.json "$root/package.json"
    npm install --silent --no-audit --no-fund --prefix "$root" >/dev/null
fi
source .ci/venv.sh
venv="$root/venv"
ensure_venv "$venv" tests/upstream/requirements.txt
ensure_binary
MEMORY_SERVER="$PWD/$root/node_modules/.bin/mcp-server-memory" \
    GIT_SERVER="$PWD/$venv/bin/mcp-server-git" \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/upstream
