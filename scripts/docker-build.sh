#!/usr/bin/env bash
# Build one of the project's images: scripts/docker-build.sh cpu|client|prometheus (`make docker`
# builds cpu). The base: BASE_IMAGE=<image> if given, else the public python:3.11-slim-bookworm
# when it is here or can be pulled, else the stand-in `make docker-base` builds from Debian's
# packages (built now if missing), and the build says which it used. The CPU torch wheel is
# taken from this machine's pip find-links folder ($PIP_FIND_LINKS) when one has it, so that the
# build needs no PyTorch index (TORCH_FIND_LINKS=<url> names another). NO_CACHE=1 ignores
# Docker's layer cache. Prints the build time and the image's size.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/docker-lib.sh
WHAT="${1:-cpu}"
case "$WHAT" in
    cpu | client | prometheus) ;;
    *) echo "usage: $0 cpu|client|prometheus (got '$WHAT')" >&2; exit 2 ;;
esac
TAG="${TAG:-codegen-triton:$WHAT}"

# the public base the Dockerfile names by default (python:3.11-slim-bookworm, debian:bookworm-slim)
PUBLIC_BASE="$(sed -n 's/^ARG BASE_IMAGE=//p' "docker/Dockerfile.$WHAT" | head -1)"

resolve_base() {
    if [ -n "${BASE_IMAGE:-}" ]; then
        echo "[docker] base: $BASE_IMAGE (BASE_IMAGE)" >&2
    elif "$DOCKER" image inspect "$PUBLIC_BASE" > /dev/null 2>&1 \
        || "$DOCKER" pull "$PUBLIC_BASE" > /dev/null 2>&1; then
        BASE_IMAGE="$PUBLIC_BASE"
        echo "[docker] base: $BASE_IMAGE" >&2
    else
        echo "[docker] $PUBLIC_BASE cannot be pulled here: the base is $LOCAL_BASE," \
            "built from Debian's packages by make docker-base (scripts/docker-base.sh)" >&2
        bash scripts/docker-base.sh >&2
        BASE_IMAGE="$LOCAL_BASE"
    fi
    echo "$BASE_IMAGE"
}

# What the build takes from this machine, served to it over HTTP (the build runs on the host's
# network) rather than copied into the context, where it would stay in a layer of the image:
# * torch's CPU wheel from this machine's pip find-links folder ($PIP_FIND_LINKS);
# * the CA certificates this machine added (/usr/local/share/ca-certificates; BUILD_CA_CERTS=
#   <files>), for a network that inspects TLS: the build trusts them, the image does not keep them.
ARGS=()
SERVE="$(mktemp -d /tmp/codegen-docker-serve.XXXXXX)"
SERVER_PID=
trap '[ -z "$SERVER_PID" ] || kill "$SERVER_PID" 2> /dev/null || true; rm -rf "$SERVE"' EXIT
if [ "$WHAT" = cpu ] && [ -z "${TORCH_FIND_LINKS:-}" ]; then
    IFS=' ' read -r -a LINKS <<< "${PIP_FIND_LINKS:-}"
    for dir in "${LINKS[@]}"; do
        wheel="$(compgen -G "$dir/torch-2.13.0+cpu-*.whl" | head -1 || true)"
        if [ -n "$wheel" ]; then
            ln -s "$wheel" "$SERVE/"
            echo "[docker] torch: $(basename "$wheel") from $dir"
            break
        fi
    done
fi
IFS=' ' read -r -a CA_FILES <<< "${BUILD_CA_CERTS:-$(compgen -G '/usr/local/share/ca-certificates/*.crt' | tr '\n' ' ' || true)}"
if [ ${#CA_FILES[@]} -gt 0 ] && [ "$WHAT" != prometheus ]; then  # its apt needs no TLS
    cat "${CA_FILES[@]}" > "$SERVE/build-ca.crt"
    echo "[docker] the build trusts this machine's added CA certificates: ${CA_FILES[*]}"
fi
if [ -n "$(ls -A "$SERVE")" ]; then
    # A fixed port per image: the URLs are build arguments, which are part of a step's cache key,
    # so a port that changed would rebuild the install layer every time; one port per image lets
    # two builds run at once. BUILD_SERVE_PORT=<port> when it is taken.
    case "$WHAT" in cpu) port=33453 ;; client) port=48419 ;; *) port=33454 ;; esac
    port="${BUILD_SERVE_PORT:-$port}"
    if python3 -c "import socket,sys; s=socket.socket(); sys.exit(s.connect_ex(('127.0.0.1', $port)) != 0)"; then
        echo "[docker] port $port is taken: BUILD_SERVE_PORT=<free port> (the build's cache then misses once)" >&2
        exit 1
    fi
    python3 -m http.server --bind 127.0.0.1 --directory "$SERVE" "$port" > /dev/null 2>&1 &
    SERVER_PID=$!
    [ ! -f "$SERVE/build-ca.crt" ] || ARGS+=(--build-arg "BUILD_CA_URL=http://127.0.0.1:$port/build-ca.crt")
    if compgen -G "$SERVE/torch-*.whl" > /dev/null; then TORCH_FIND_LINKS="http://127.0.0.1:$port/"; fi
fi
[ -z "${TORCH_FIND_LINKS:-}" ] || ARGS+=(--build-arg "TORCH_FIND_LINKS=$TORCH_FIND_LINKS")
[ -z "${NO_CACHE:-}" ] || ARGS+=(--no-cache)  # NO_CACHE=1: every step again, as on a fresh machine

BASE="$(resolve_base)"
started=$(date +%s)
# --network host: the build's pip and apt reach the network through the host (dockerd runs
# with --iptables=false here, so the default bridge has no NAT)
LOG="/tmp/codegen-docker-build-$WHAT.log"
set +e +o pipefail
nice -n 10 "$DOCKER" build --network host --build-arg "BASE_IMAGE=$BASE" "${ARGS[@]}" \
    -f "docker/Dockerfile.$WHAT" -t "$TAG" . 2>&1 | tee "$LOG" \
    | grep --line-buffered -E '^Step [0-9]+/[0-9]+ : (FROM|RUN)|^Successfully tagged'
rc=${PIPESTATUS[0]}
set -e -o pipefail
if [ "$rc" != 0 ]; then
    tail -30 "$LOG" >&2
    echo "[docker] build of $TAG failed (exit $rc): $LOG" >&2
    exit 1
fi
size=$("$DOCKER" image inspect -f '{{.Size}}' "$TAG")
echo "[docker] built $TAG on $BASE in $(($(date +%s) - started)) s; image size $((size / 1000000)) MB"
