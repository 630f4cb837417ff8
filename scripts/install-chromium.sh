#!/usr/bin/env bash
# Install a headless browser for tests/test_openai_api.py (the web playground is driven in a real
# Chromium through selenium): Debian's `chromium` and `chromium-driver`, unless both are already
# installed. Idempotent; `make setup-dev` runs it.
set -euo pipefail

CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
CHROMEDRIVER=${CHROMEDRIVER:-/usr/bin/chromedriver}

if [ -x "$CHROMIUM" ] && [ -x "$CHROMEDRIVER" ]; then
    "$CHROMIUM" --version 2>/dev/null | head -n 1 || true
    exit 0
fi
bash "$(dirname "$0")/apt-install.sh" chromium chromium-driver
"$CHROMIUM" --version 2>/dev/null | head -n 1 || true
