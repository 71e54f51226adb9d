#!/usr/bin/env bash
# Runs the console's browser suite: Debian's Chromium and ChromeDriver (installed with apt
# when missing) drive a real `agent-kernel serve` over WebDriver (tests/browser/*.py, the
# standard library only). Screenshots land in target/browser-screenshots/.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ ! -x /usr/bin/chromium || ! -x /usr/bin/chromedriver ]]; then
    echo "--- installing Debian's chromium and chromium-driver"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi
source .ci/venv.sh
ensure_binary
python3 -u tests/browser/console_test.py
