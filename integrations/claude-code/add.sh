#!/usr/bin/env bash
# Adds agent-kernel to Claude Code for the project in the current folder: the log is
# ./agent-kernel.db and the policy ./sandbox.toml (file tools confined to what it allows).
set -euo pipefail
claude mcp add agent-kernel -- agent-kernel --db "$PWD/agent-kernel.db" --sandbox "$PWD/sandbox.toml" mcp
