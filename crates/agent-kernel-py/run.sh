#!/usr/bin/env bash
# The Python package's suite: a venv under target/ holding the pinned maturin, pytest and
# LangGraph (rebuilt when requirements.txt changes), the package built from this crate and
# installed into it with pip (maturin's PEP 517 backend; the dev profile here, so the build
# shares the workspace's debug artifacts), the binary for the command-line checks, then
# pytest. Run from anywhere; needs Python 3.10+ with venv and the Rust toolchain.
set -euo pipefail
cd "$(dirname "$0")/../.."
source .ci/venv.sh
venv="target/python-venv"
ensure_venv "$venv" crates/agent-kernel-py/requirements.txt
ensure_binary
PATH="$PWD/$venv/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev --locked" "$venv/bin/pip" install --quiet \
    --disable-pip-version-check --no-build-isolation --no-deps --force-reinstall \
    ./crates/agent-kernel-py
"$venv/bin/python" -m pytest -q -p no:cacheprovider crates/agent-kernel-py/tests "$@"
