#!/usr/bin/env bash
# Install Debian packages (no recommends) as root, or through sudo; the project's install
# scripts call it. Usage: scripts/apt-install.sh PACKAGE...
set -euo pipefail

if ! command -v apt-get >/dev/null 2>&1; then
    echo "apt-install: no apt-get on this machine; install $* by other means" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "apt-install: run as root or install sudo (apt-get install $*)" >&2
        exit 1
    fi
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
