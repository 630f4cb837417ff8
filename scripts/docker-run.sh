#!/usr/bin/env bash
# `make docker-run`: the CPU server image (make docker) on this machine's ports, as `make triton`
# lays them out: HTTP_PORT (8000), GRPC_PORT (8001), METRICS_PORT (8002) on TRITON_ADDRESS
# (127.0.0.1; 0.0.0.0 publishes them on every interface). In the foreground, Ctrl-C stops it;
# DETACH=1 starts it in the background, waits until Triton is ready and says how long that took.
# Either way `docker stop` ends it gracefully: the launcher turns SIGTERM into Triton's own stop.
# It runs as k8s/base/deployment.yaml runs it: read-only root file system, /tmp a 2 GB tmpfs,
# every capability dropped, no privilege escalation (READ_ONLY=0: a writable root, as plain
# `docker run` gives).
#   IMAGE=<tag> (codegen-triton:cpu)  NAME=<container> (codegen-triton-cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/docker-lib.sh
IMAGE="${IMAGE:-codegen-triton:cpu}"
NAME="${NAME:-codegen-triton-cpu}"
ADDRESS="${TRITON_ADDRESS:-127.0.0.1}"
HTTP_PORT="${HTTP_PORT:-8000}"
GRPC_PORT="${GRPC_PORT:-8001}"
METRICS_PORT="${METRICS_PORT:-8002}"

"$DOCKER" image inspect "$IMAGE" > /dev/null 2>&1 || {
    echo "[docker-run] no image $IMAGE here: make docker builds it" >&2
    exit 1
}
# --shm-size: the python backend moves tensors through /dev/shm (Docker's default is 64 MB)
# --stop-timeout 30: Triton's exit timeout (10 s) and the launcher's 10 s more, before SIGKILL
# CODEGEN_RUNTIME_DIR: Triton's python backend makes its stub executable at every model load,
# which needs the runtime copy writable and the server user's: /tmp, not the image's /app/.triton
ARGS=(--name "$NAME" --rm --shm-size=1g --stop-timeout 30 -e CODEGEN_RUNTIME_DIR=/tmp/codegen-runtime
    -p "$ADDRESS:$HTTP_PORT:8000" -p "$ADDRESS:$GRPC_PORT:8001" -p "$ADDRESS:$METRICS_PORT:8002")
if [ "${READ_ONLY:-1}" != 0 ]; then
    ARGS+=(--read-only --tmpfs /tmp:rw,exec,size=2g --cap-drop ALL --security-opt no-new-privileges)
fi
if [ -z "${DETACH:-}" ]; then
    [ ! -t 0 ] || ARGS+=(-it)  # Ctrl-C reaches the launcher through the terminal
    exec "$DOCKER" run "${ARGS[@]}" "$IMAGE"
fi

started=$(date +%s.%N)
"$DOCKER" run -d "${ARGS[@]}" "$IMAGE" > /dev/null
url="http://127.0.0.1:$HTTP_PORT/v2/health/ready"
[ "$ADDRESS" = 127.0.0.1 ] || [ "$ADDRESS" = 0.0.0.0 ] || url="http://$ADDRESS:$HTTP_PORT/v2/health/ready"
deadline=$(($(date +%s) + ${READY_TIMEOUT:-600}))
until python3 -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('$url', timeout=2).status != 200)" 2> /dev/null; do
    if [ "$("$DOCKER" inspect -f '{{.State.Running}}' "$NAME" 2> /dev/null)" != true ]; then
        echo "[docker-run] $NAME stopped before it was ready" >&2
        exit 1
    fi
    if [ "$(date +%s)" -gt "$deadline" ]; then
        "$DOCKER" logs --tail 30 "$NAME" >&2
        echo "[docker-run] $NAME not ready after ${READY_TIMEOUT:-600} s: docker logs $NAME" >&2
        exit 1
    fi
    sleep 0.5
done
ready=$(python3 -c "print(f'{$(date +%s.%N) - $started:.1f}')")
echo "[docker-run] $NAME ready at $url ${ready} s after docker run (docker stop $NAME ends it)"
