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
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
POLICY=/usr/sbin/policy-rc.d
cleanup() { :; }
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod 755 "$POLICY"
    cleanup() { $SUDO rm -f "$POLICY"; }
fi
trap cleanup EXIT

bash "$(dirname "$0")/apt-install.sh" prometheus
prometheus --version 2>&1 | head -n 1
