#!/usr/bin/env bash
# Fuzz smoke: builds every cargo-fuzz target on the nightly toolchain and runs each briefly
# from its seed corpus (fuzz/corpus/<target>, seeded from the hostile tests).
# Fails on a crash, a timeout or a target that does not build.
#   FUZZ_SECONDS   seconds per target (default 20)
set -euo pipefail
cd "$(dirname "$0")"
seconds="${FUZZ_SECONDS:-20}"
targets=(path_check url_check plan_parse policy_parse fsm_parse)

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz smoke: the nightly toolchain is missing (rustup toolchain install nightly)" >&2
    exit 1
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "--- installing cargo-fuzz"
    cargo install --locked cargo-fuzz
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cargo +nightly fuzz build
for target in "${targets[@]}"; do
    echo "--- fuzz $target for ${seconds}s"
    # A copy of the seeds, so new inputs libFuzzer finds do not land in the repository.
    cp -r "corpus/$target" "$work/$target"
    mkdir -p "artifacts/$target"
    cargo +nightly fuzz run "$target" "$work/$target" -- \
        -max_total_time="$seconds" -max_len=4096 -timeout=10 \
        -artifact_prefix="artifacts/$target/" -print_final_stats=1 2>&1 | tail -n 12
done
echo "--- fuzz smoke ok"
