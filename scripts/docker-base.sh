#!/usr/bin/env bash
# Build a stand-in for python:3.11-slim-bookworm from Debian's own packages, for a machine that
# cannot pull from an image registry (deb.debian.org is enough): debootstrap a Debian 12 minbase
# root file system with python3 (3.11), pip, venv and CA certificates, and `docker import` it.
# libpython3.11 too: python:3.11-slim's python is built shared, and Triton's python backend stub
# links libpython3.11.so.1.0, which Debian's python3 alone does not bring.
# The Dockerfiles take it with --build-arg BASE_IMAGE=codegen-triton-base:bookworm
# (scripts/docker-build.sh does so, and says so, when the public image cannot be had).
#   BASE_TAG=<tag> (codegen-triton-base:bookworm)  MIRROR=<debian mirror> (deb.debian.org)
#   FORCE=1 rebuilds a base that is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/docker-lib.sh
BASE_TAG="${BASE_TAG:-$LOCAL_BASE}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"

if [ -z "${FORCE:-}" ] && "$DOCKER" image inspect "$BASE_TAG" > /dev/null 2>&1; then
    echo "[docker-base] $BASE_TAG is already there (FORCE=1 rebuilds it)"
    exit 0
fi
command -v debootstrap > /dev/null || {
    echo "[docker-base] debootstrap is missing: apt-get install -y debootstrap" >&2
    exit 1
}
[ "$(id -u)" = 0 ] || { echo "[docker-base] debootstrap needs root" >&2; exit 1; }

ROOTFS="$(mktemp -d /tmp/codegen-base.XXXXXX)"
trap 'rm -rf "$ROOTFS"' EXIT
echo "[docker-base] debootstrap bookworm (minbase + python3) into $ROOTFS from $MIRROR"
nice -n 10 debootstrap --variant=minbase \
    --include=python3,libpython3.11,python3-pip,python3-venv,ca-certificates \
    bookworm "$ROOTFS" "$MIRROR" > "$ROOTFS.log" 2>&1 || {
    tail -20 "$ROOTFS.log" >&2
    exit 1
}
rm -f "$ROOTFS.log"
# what python:3.11-slim leaves out too: package caches and lists, docs, man pages
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* \
    "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/*
# python:3.11-slim has `python`; Debian names it python3 only
ln -sf python3 "$ROOTFS/usr/bin/python"
# mktemp made the folder 0700: as the image's / that would lock every non-root user out
chmod 755 "$ROOTFS"
tar -C "$ROOTFS" -c . | "$DOCKER" import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' \
    --message "Debian 12 minbase + python3 (debootstrap), stand-in for python:3.11-slim-bookworm" \
    - "$BASE_TAG" > /dev/null
echo "[docker-base] built $BASE_TAG from Debian's packages: $("$DOCKER" run --rm --network host --user 10001 "$BASE_TAG" python3 --version) (as uid 10001)"
