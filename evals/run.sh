#!/usr/bin/env bash
# The eval suite (evals/README.md): builds the agent-kernel binary and the suite (release),
# runs every scenario through the kernel and as the baseline, and writes
# evals/results/results.json and results.md. Arguments go to `agent-kernel-evals run`
# instead (e.g. `--quick`, `--seed N`, `--out DIR`, `--only crash`).
# Needs the Rust toolchain and `sh`; everything runs on temp dirs and loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$#" -eq 0 ]; then
    set -- --out evals/results
fi
cargo build --release --locked -q -p agent-kernel-cli -p agent-kernel-evals
exec target/release/agent-kernel-evals run "$@"
