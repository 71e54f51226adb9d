#!/usr/bin/env bash
# The Python package's suite: a venv under target/ holding the pinned maturin, pytest and
# LangGraph (rebuilt when requirements.txt changes), the package built from this crate and
# installed into it with pip (maturin's PEP 517 backend; the dev profile here, so the build
# shares the workspace's debug artifacts), the binary for the command-line checks, then
# pytest. Run from anywhere; needs Python 3.10+ with venv and the Rust toolchain.
#
# With AGENT_KERNEL_WHEEL set to a built wheel (scripts/release.sh's, in dist/), the suite
# runs against that wheel instead, installed into a fresh venv with the pinned test
# packages: what a user's `pip install` gets.
set -euo pipefail
cd "$(dirname "$0")/../.."
source .ci/venv.sh
ensure_binary
if [[ -n "${AGENT_KERNEL_WHEEL:-}" ]]; then
    venv="target/wheel-venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    grep -v '^maturin' crates/agent-kernel-py/requirements.txt > "$venv/test-requirements.txt"
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        -r "$venv/test-requirements.txt" "$AGENT_KERNEL_WHEEL"
else
    venv="target/python-venv"
    ensure_venv "$venv" crates/agent-kernel-py/requirements.txt
    PATH="$PWD/$venv/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev --locked" "$venv/bin/pip" install --quiet \
        --disable-pip-version-check --no-build-isolation --no-deps --force-reinstall \
        ./crates/agent-kernel-py
fi
"$venv/bin/python" -m pytest -q -p no:cacheprovider crates/agent-kernel-py/tests "$@"
