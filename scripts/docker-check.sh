#!/usr/bin/env bash
# `make docker-check`: build, run, probe and stop every image this machine can run, one line per
# step with its time. A developer's check, never CI's (image builds take too long there). Needs a
# Docker engine (docs/deployment.md, "Containers without a registry") and ports 8000-8002, 8080
# and 9090 free: the compose file publishes those. Builds reuse Docker's layer cache (NO_CACHE=1
# builds from scratch). Stops every container it started, also when a step fails.
#   KEEP=1 leaves the composed services running at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/docker-lib.sh
COMPOSE_FILE=docker/docker-compose.yml
SERVER=codegen-triton-check
WORK="$(mktemp -d /tmp/codegen-docker-check.XXXXXX)"
CHECK_START=$(date +%s)
export GRAFANA_ADMIN_PASSWORD="${GRAFANA_ADMIN_PASSWORD:-unused-$RANDOM$RANDOM}"

if "$DOCKER" compose version > /dev/null 2>&1; then
    COMPOSE=("$DOCKER" compose -f "$COMPOSE_FILE")
elif command -v docker-compose > /dev/null; then
    COMPOSE=(docker-compose -f "$COMPOSE_FILE")
else
    echo "[docker-check] no compose: apt-get install -y docker-compose (or the compose plugin)" >&2
    exit 1
fi

cleanup() {
    "$DOCKER" rm -f "$SERVER" > /dev/null 2>&1 || true
    [ -n "${KEEP:-}" ] || "${COMPOSE[@]}" down --volumes --remove-orphans > /dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# step NAME COMMAND...: runs COMMAND (its output to $WORK/NAME.log), prints one line with the
# time and the last line COMMAND printed; on failure the log's tail, and stops the check
step() {
    local name="$1" started rc log="$WORK/${1// /-}.log"
    shift
    started=$(date +%s.%N)
    set +e
    (set -e; "$@") > "$log" 2>&1  # set -e inside: a failing command fails the step
    rc=$?
    set -e
    local took
    took=$(python3 -c "print(f'{$(date +%s.%N) - $started:6.1f}')")
    if [ "$rc" = 0 ]; then
        printf '[docker-check] ok   %s s  %-16s %s\n' "$took" "$name" "$(tail -1 "$log")"
    else
        tail -25 "$log" | sed 's/^/    /'
        printf '[docker-check] FAIL %s s  %-16s (exit %s)\n' "$took" "$name" "$rc"
        exit 1
    fi
}

http_get() {  # URL: the body, or fail
    python3 -c "import sys,urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())" "$1"
}

wait_for() {  # SECONDS COMMAND...: until COMMAND succeeds
    local deadline=$(($(date +%s) + $1))
    shift
    until "$@" > /dev/null 2>&1; do
        [ "$(date +%s)" -lt "$deadline" ] || { echo "not within the time: $*"; return 1; }
        sleep 1
    done
}

engine() {
    echo "$("$DOCKER" version --format 'client {{.Client.Version}}, engine {{.Server.Version}}')," \
        "$("$DOCKER" info --format 'storage driver {{.Driver}}'), $("${COMPOSE[@]}" version | head -1)"
}

ports_free() {
    local busy=()
    for port in 8000 8001 8002 8080 9090; do
        ! python3 -c "import socket,sys; s=socket.socket(); sys.exit(s.connect_ex(('127.0.0.1', $port)) != 0)" \
            || busy+=("$port")
    done
    [ ${#busy[@]} = 0 ] || { echo "in use: ${busy[*]} (compose publishes 8000-8002, 8080, 9090)"; return 1; }
    echo "8000-8002, 8080, 9090 free"
}

build() {  # cpu|client|prometheus (NO_CACHE=1 passes on: no layer cache)
    bash scripts/docker-build.sh "$1"
}

run_server() {
    NAME="$SERVER" DETACH=1 HTTP_PORT=8000 GRPC_PORT=8001 METRICS_PORT=8002 bash scripts/docker-run.sh
}

healthy() {
    wait_for 120 bash -c "[ \"\$($DOCKER inspect -f '{{.State.Health.Status}}' $SERVER)\" = healthy ]"
    # the Kubernetes probes' endpoints (k8s/base/deployment.yaml)
    http_get http://127.0.0.1:8000/v2/health/live > /dev/null
    http_get http://127.0.0.1:8000/v2/health/ready > /dev/null
    echo "docker's health check: $("$DOCKER" inspect -f '{{.State.Health.Status}}' "$SERVER"); /v2/health/live and /ready 200"
}

not_root() {
    local uid
    uid=$("$DOCKER" exec "$SERVER" id -u)
    [ "$uid" != 0 ] || { echo "the server runs as root"; return 1; }
    # every process of the container, as the host sees it
    "$DOCKER" top "$SERVER" -eo uid,pid,comm | tee "$WORK/processes" | tail -n +2 \
        | awk '$1 == 0 { bad = 1 } END { exit bad }' || { echo "a process runs as root"; return 1; }
    # as k8s/base/deployment.yaml runs it: nothing under / is writable, /tmp is
    ! "$DOCKER" exec "$SERVER" touch /app/.written 2> /dev/null || { echo "/app is writable"; return 1; }
    "$DOCKER" exec "$SERVER" touch /tmp/.written
    echo "uid $uid in the container; $(($(wc -l < "$WORK/processes") - 1)) processes, none root; root fs read-only"
}

memory() {
    sleep 5  # at rest: nothing asked yet
    "$DOCKER" stats --no-stream --format 'memory at rest {{.MemUsage}}' "$SERVER"
}

readme_curl() {
    # the README's request, as written there
    local body
    body=$(curl -s localhost:8000/v2/models/ensemble/infer -d '{
  "inputs": [
    {"name": "INPUT_0", "datatype": "BYTES",  "shape": [1, 1], "data": ["def fibonacci(n):\n"]},
    {"name": "INPUT_1", "datatype": "UINT32", "shape": [1, 1], "data": [32]},
    {"name": "INPUT_2", "datatype": "BYTES",  "shape": [1, 1], "data": [""]},
    {"name": "INPUT_3", "datatype": "BYTES",  "shape": [1, 1], "data": [""]}
  ], "outputs": [{"name": "OUTPUT_0"}]}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["outputs"][0]["data"][0])')
    [ -n "${body//[[:space:]]/}" ] || { echo "empty completion"; return 1; }
    echo "completion: $(printf '%s' "$body" | tr '\n' ' ' | cut -c1-60)"
}

codegen_client() {
    local out
    if [ -x .venv/bin/codegen ]; then
        out=$(.venv/bin/codegen complete "def fibonacci(n):" --max-tokens 24 --url localhost:8001)
        echo "codegen (this machine's .venv), completion: $(printf '%s' "$out" | tr '\n' ' ' | cut -c1-50)"
    else
        out=$("$DOCKER" run --rm --network host codegen-triton:client \
            codegen complete "def fibonacci(n):" --max-tokens 24 --url localhost:8001)
        echo "codegen (client image), completion: $(printf '%s' "$out" | tr '\n' ' ' | cut -c1-50)"
    fi
    [ -n "${out//[[:space:]]/}" ]
}

stop_server() {
    local pids exit_code left=()
    pids=$("$DOCKER" top "$SERVER" -eo pid | tail -n +2)
    # --rm: the container goes once stopped; its exit code is read from docker stop's wait
    "$DOCKER" stop -t 30 "$SERVER" > /dev/null &
    local stopper=$!
    exit_code=$("$DOCKER" wait "$SERVER" 2> /dev/null || echo gone)
    wait "$stopper"
    for pid in $pids; do
        [ ! -e "/proc/$pid" ] || left+=("$pid")
    done
    [ ${#left[@]} = 0 ] || { echo "still running: ${left[*]}"; return 1; }
    [ "$exit_code" = 0 ] || { echo "exit code $exit_code (137: killed after the stop timeout)"; return 1; }
    echo "exit code 0, within Triton's exit timeout; $(echo "$pids" | wc -w) processes, none left"
}

compose_up() {
    PROMETHEUS_IMAGE="$PROMETHEUS_IMAGE" "${COMPOSE[@]}" up -d --no-build triton api prometheus
    wait_for 600 http_get http://127.0.0.1:8000/v2/health/ready
    wait_for 120 http_get http://127.0.0.1:8080/health
    wait_for 120 http_get http://127.0.0.1:9090/-/ready
    echo "triton, api, prometheus ($PROMETHEUS_IMAGE) up"
}

prometheus_scrapes() {
    local query='http://127.0.0.1:9090/api/v1/query?query=up%7Bjob%3D%22triton%22%7D'
    wait_for 60 bash -c "python3 -c \"import json,sys,urllib.request; r=json.load(urllib.request.urlopen('$query')); sys.exit(not [s for s in r['data']['result'] if s['value'][1] == '1'])\""
    http_get "$query" | python3 -c 'import json,sys; s=json.load(sys.stdin)["data"]["result"][0]; print("up{job=triton} = 1 for", s["metric"]["instance"])'
}

api_answers() {
    http_get http://127.0.0.1:8080/health > /dev/null
    curl -sf localhost:8080/v1/completions -H 'Content-Type: application/json' \
        -d '{"model": "codegen", "prompt": "def fib(n):\n", "max_tokens": 16}' \
        | python3 -c 'import json,sys; r=json.load(sys.stdin); t=r["choices"][0]["text"]; assert t.strip(), r; print("/v1/completions:", repr(t[:40]))'
}

client_loadtest() {
    mkdir -p "$WORK/results"
    chmod 777 "$WORK/results"  # the client image's user (uid 10001) writes its report there
    "$DOCKER" run --rm --network host -e PROMETHEUS_URL=http://127.0.0.1:9090 \
        -v "$WORK/results:/app/loadtest/results" codegen-triton:client \
        make -o model -o prometheus-install loadtest QUICK=1 HOST=127.0.0.1:8000
    local report
    report=$(find "$WORK/results" -name report.md | head -1)
    [ -n "$report" ] || { echo "no report in loadtest/results"; return 1; }
    grep -q "Prometheus at http://127.0.0.1:9090" "$report" \
        || { echo "the report's source is not the composed Prometheus: $report"; return 1; }
    echo "report $(basename "$report"): $(grep -o "Prometheus at http://127.0.0.1:9090[^.;|]*" "$report" | head -1)"
}

compose_down() {
    local ids left=()
    ids=$("${COMPOSE[@]}" ps -q)
    local pids
    pids=$(for id in $ids; do "$DOCKER" top "$id" -eo pid | tail -n +2; done)
    [ -n "${KEEP:-}" ] && { echo "KEEP=1: left running"; return 0; }
    "${COMPOSE[@]}" down --volumes --remove-orphans
    for pid in $pids; do
        [ ! -e "/proc/$pid" ] || left+=("$pid")
    done
    [ ${#left[@]} = 0 ] || { echo "still running: ${left[*]}"; return 1; }
    echo "$(echo "$ids" | wc -w) containers stopped, $(echo "$pids" | wc -w) processes, none left"
}

echo "[docker-check] $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n): logs in $WORK"
step engine engine
step ports ports_free
step "build cpu" build cpu
step "run cpu" run_server
step healthy healthy
step "not root" not_root
step memory memory
step "README curl" readme_curl
step codegen codegen_client
step "docker stop" stop_server
step "build client" build client
if "$DOCKER" image inspect prom/prometheus:v2.54.1 > /dev/null 2>&1 \
    || "$DOCKER" pull prom/prometheus:v2.54.1 > /dev/null 2>&1; then
    PROMETHEUS_IMAGE=prom/prometheus:v2.54.1
else
    PROMETHEUS_IMAGE=codegen-triton:prometheus
    step "build prometheus" build prometheus
fi
step "compose up" compose_up
step "prometheus" prometheus_scrapes
step "api" api_answers
step "loadtest QUICK" client_loadtest
step "compose down" compose_down
echo "[docker-check] passed in $(($(date +%s) - CHECK_START)) s"
