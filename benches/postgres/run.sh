#!/usr/bin/env bash
# Steps per second of 1, 2 and 4 worker processes sharing one log, on PostgreSQL and on
# SQLite, alternating round by round in the same minutes (BENCHMARK.md). Starts the
# machine's PostgreSQL with a throwaway database (tests/postgres/server.sh) and stops it.
#   benches/postgres/run.sh [--rounds N] [--steps N] [--durability full|normal]
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --locked -q -p agent-kernel-cli
url="$(tests/postgres/server.sh start)"
trap 'tests/postgres/server.sh stop' EXIT
python3 benches/postgres/bench.py --bin target/release/agent-kernel --url "$url" "$@"
