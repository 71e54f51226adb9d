#!/usr/bin/env bash
# Sourced by the scripts that need Python packages.
#
# `ensure_venv DIR REQUIREMENTS` makes DIR a venv holding exactly the pinned REQUIREMENTS,
# rebuilt only when the file changes (a copy of it in the venv marks what was installed).
ensure_venv() {
    local dir="$1" requirements="$2"
    if ! cmp -s "$requirements" "$dir/.requirements" 2>/dev/null; then
        rm -rf "$dir"
        python3 -m venv "$dir"
        "$dir/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
        cp "$requirements" "$dir/.requirements"
    fi
}

# `ensure_binary` exports AGENT_KERNEL_BIN, the debug `agent-kernel` the suites drive. A
# caller that already built it (.ci/run, after `cargo test --workspace`) sets it beforehand,
# so no second build with another feature set lands in target/; otherwise it is built here.
ensure_binary() {
    if [[ -z "${AGENT_KERNEL_BIN:-}" ]]; then
        cargo build --locked -q -p agent-kernel-cli
        AGENT_KERNEL_BIN="$PWD/target/debug/agent-kernel"
    fi
    test -x "$AGENT_KERNEL_BIN"
    export AGENT_KERNEL_BIN
}
