#!/usr/bin/env bash
# Install a Prometheus server (Debian's `prometheus` package) for `make prometheus`, the load test
# and tests/test_loadtest_sweep.py, unless a `prometheus` binary is already on PATH.
#
# The project runs its own Prometheus (loadtest/run_prometheus.py: config from the repository,
# data under .prometheus/, 127.0.0.1 only), so the package's system service must not start: a
# policy-rc.d that refuses service starts is put in place for the install when none exists.
# Recommends (node exporter, SNMP tooling) are not needed and are left out.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1; then
    prometheus --version 2>&1 | head -n 1
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-prometheus: no apt-get here; install Prometheus >= 2.x so that 'prometheus'" \
        "is on PATH (https://prometheus.io/download/)" >&2
    exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "install-prometheus: run as root or install sudo (apt-get install prometheus)" >&2
        exit 1
    fi
fi

POLICY=/usr/sbin/policy-rc.d
cleanup() { :; }
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod 755 "$POLICY"
    cleanup() { $SUDO rm -f "$POLICY"; }
fi
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
prometheus --version 2>&1 | head -n 1
