#!/usr/bin/env bash
# Builds what a release ships, into dist/ (or the folder given):
#   agent-kernel-VERSION-TARGET      the command-line binary, release build, symbols stripped
#   agent_kernel-VERSION-cp310-abi3-*.whl
#                                    the Python package: one wheel for every CPython 3.10+
#                                    of this platform (abi3)
#   agent_kernel-VERSION.tar.gz      the Python package's sdist (builds with Rust and maturin)
#   SHA256SUMS                       `sha256sum -c SHA256SUMS` checks them all
# The Python build uses the pinned maturin of crates/agent-kernel-py/requirements.txt, in a
# venv under target/ (the Python suite's). Run from anywhere; needs the Rust toolchain and
# Python 3.10+ with venv. .ci/run runs it, then installs the wheel into a fresh venv, runs
# the Python suite against it, and runs the binary through the README's main job;
# .github/workflows/release.yml runs it for a tag.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-dist}"
version="$(cargo metadata --no-deps --format-version 1 --locked | python3 -c '
import json, sys
packages = json.load(sys.stdin)["packages"]
print(next(p["version"] for p in packages if p["name"] == "agent-kernel-cli"))
')"
target="$(rustc -vV | sed -n 's/^host: //p')"
source .ci/venv.sh
venv="target/python-venv"
ensure_venv "$venv" crates/agent-kernel-py/requirements.txt

rm -rf "$out"
mkdir -p "$out"
echo "release: agent-kernel $version for $target into $out/"
cargo build --release --locked -q -p agent-kernel-cli
strip --strip-all -o "$out/agent-kernel-$version-$target" target/release/agent-kernel
"$venv/bin/maturin" build --release --locked --strip --quiet \
    -m crates/agent-kernel-py/Cargo.toml --out "$out"
"$venv/bin/maturin" sdist -m crates/agent-kernel-py/Cargo.toml --out "$out" >/dev/null
sums="$(cd "$out" && sha256sum -- *)"
printf '%s\n' "$sums" > "$out/SHA256SUMS"
ls -l "$out"
