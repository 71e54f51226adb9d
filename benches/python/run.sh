#!/usr/bin/env bash
# Live sagas from Python against the same from Rust, in the same minutes: builds the
# package (release, `pip install ./crates/agent-kernel-py` into a venv under target/) and
# the front-door crate's `live_steps` example (release), then alternates them round by round:
# Rust, Python calling the built-in `noop`, Python calling a Python no-op tool; each run a
# fresh process and a fresh temporary log. Prints one JSON line per run.
#   benches/python/run.sh [ROUNDS] [SAGAS] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds="${1:-3}" sagas="${2:-200}" steps="${3:-10}"
venv="target/python-bench-venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps \
    ./crates/agent-kernel-py
cargo build --release --locked -q -p agent-kernel --example live_steps
for durability in full normal; do
    for _ in $(seq "$rounds"); do
        target/release/examples/live_steps "$sagas" "$steps" "$durability"
        "$venv/bin/python" benches/python/live_steps.py "$sagas" "$steps" "$durability" builtin
        "$venv/bin/python" benches/python/live_steps.py "$sagas" "$steps" "$durability" python-tool
    done
done
