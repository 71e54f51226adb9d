#!/usr/bin/env bash
# Adds agent-kernel to Claude Code for the project in the current folder: its log
# (agent-kernel.db), policy (sandbox.toml), tools file (tools.toml) and transition table
# (fsm.toml) are the project folder's, and relative paths are taken from it, whatever folder
# Claude Code starts the server in.
set -euo pipefail
claude mcp add agent-kernel -- agent-kernel --config "$PWD" mcp
