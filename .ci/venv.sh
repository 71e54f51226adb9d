#!/usr/bin/env bash
# Sourced by the scripts that need Python packages: `ensure_venv DIR REQUIREMENTS` makes DIR a
# venv holding exactly the pinned REQUIREMENTS, rebuilt only when the file changes (a copy
# of it in the venv marks what was installed).
ensure_venv() {
    local dir="$1" requirements="$2"
    if ! cmp -s "$requirements" "$dir/.requirements" 2>/dev/null; then
        rm -rf "$dir"
        python3 -m venv "$dir"
        "$dir/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
        cp "$requirements" "$dir/.requirements"
    fi
}
