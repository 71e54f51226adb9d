#!/usr/bin/env bash
# `agent-kernel bench --db URL` in 1, 2, 4 and 8 processes sharing one PostgreSQL log, at
# concurrency 1 and 64 per process, beside one process on SQLite (BENCHMARK.md). Starts the
# machine's PostgreSQL with a throwaway database (tests/postgres/server.sh) and stops it.
#   benches/postgres/scale.sh [--rounds N] [--sagas N] [--durability full|normal]
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --locked -q -p agent-kernel-cli
url="$(tests/postgres/server.sh start)"
trap 'tests/postgres/server.sh stop' EXIT
python3 benches/postgres/scale.py --bin target/release/agent-kernel --url "$url" "$@"
