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
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-chromium: no apt-get here; install Chromium and its chromedriver so that" \
        "$CHROMIUM and $CHROMEDRIVER exist (or set CHROMIUM= and CHROMEDRIVER=)" >&2
    exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "install-chromium: run as root or install sudo (apt-get install chromium chromium-driver)" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
"$CHROMIUM" --version 2>/dev/null | head -n 1 || true
