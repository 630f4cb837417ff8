# Sourced by scripts/docker-*.sh: which docker client to run, and how.
# DOCKER=<client> overrides. The client first on PATH may be newer than the engine (a 28.x
# client in front of Debian's 20.10 dockerd) and may lack the buildx plugin, so builds use the
# classic builder (DOCKER_BUILDKIT=0), which every engine since 1.x has and which honours
# `--network host` for RUN steps (the build's pip and apt reach the network through the host).
DOCKER="${DOCKER:-docker}"
export DOCKER_BUILDKIT="${DOCKER_BUILDKIT:-0}"
# the public base every Dockerfile names by default, and the stand-in `make docker-base` builds
PUBLIC_BASE="python:3.11-slim-bookworm"
LOCAL_BASE="codegen-triton-base:bookworm"

if ! command -v "$DOCKER" > /dev/null; then
    echo "docker: no '$DOCKER' client on PATH (apt-get install -y docker.io)" >&2
    exit 1
fi
if ! "$DOCKER" info > /dev/null 2>&1; then
    echo "docker: no engine answers '$DOCKER info'; start one as root, e.g." >&2
    echo "  dockerd --storage-driver=vfs --iptables=false > /tmp/dockerd.log 2>&1 &" >&2
    exit 1
fi
