#!/usr/bin/env bash
# agent-kernel beside DBOS and LangGraph on the same work (benches/peers/peers.py): installs
# the peers pinned in requirements.txt into a venv under target/ (rebuilt when the pins
# change), builds the release binary, and alternates the systems round by round.
#
#   benches/peers/run.sh [--rounds 3] [--workflows 200] [--json target/peers.json]
set -euo pipefail
cd "$(dirname "$0")/../.."
source .ci/venv.sh
venv="target/peers-venv"
ensure_venv "$venv" benches/peers/requirements.txt
cargo build --locked --release -q -p agent-kernel-cli
exec "$venv/bin/python" benches/peers/peers.py --kernel target/release/agent-kernel "$@"
