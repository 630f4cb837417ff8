#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (the peer system the bench and the editor load profile compare
# the project with) from the llama.cpp source vendored in a pinned llama-cpp-python sdist.
#
# Why the sdist: it pins one llama.cpp revision through the ordinary package index the project
# already uses (no git clone, no second download channel), and the server built from it is the
# one llama.vim / llama.vscode talk to (`/infill`, `cache_prompt`), which llama-cpp-python's own
# Python server is not. CPU only, Release, only the `llama-server` target; the web UI is left
# out (no npm, no Hugging Face download).
#
# The instruction sets are named, not GGML_NATIVE: each x86 extension /proc/cpuinfo lists is
# switched on, and AMX never. On an Intel Xeon whose flags list amx_tile, a GGML_NATIVE build
# died with SIGILL at its first request (`tilezero` in tinygemm_kernel_amx: the CPU lists AMX
# but the guest may not use the tiles). So the built server answers one request before this
# says it is built (with the first GGUF under build/downloads/, or LLAMA_CHECK_GGUF).
#
# Idempotent: exits at once when the binary is there and was built from the same version.
# Never run by `make test` or CI: it takes about 10 minutes of CPU time (24 minutes on 2 shared
# cores).
# Usage: scripts/build-llama-server.sh   (make llama-server)
# Environment: LLAMA_CPP_PYTHON_VERSION (0.3.36), LLAMA_BUILD_DIR (build/llama.cpp),
# PYTHON (the interpreter whose pip downloads the sdist: .venv/bin/python, else python3),
# JOBS (parallel compile jobs: the CPU count), LLAMA_CHECK_GGUF (the GGUF the check request
# runs; default the first under build/downloads/).
set -euo pipefail

VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${LLAMA_BUILD_DIR:-$ROOT/build/llama.cpp}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
BINARY="$BUILD_DIR/bin/llama-server"
STAMP="$BUILD_DIR/VERSION"
START=$(date +%s)

step() { echo "build-llama-server: [$(($(date +%s) - START))s] $*"; }

# this CPU's x86 extensions, as ggml's options (AMX left off: see above)
CPU_FLAGS=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
ISA=()
for pair in avx:AVX avx2:AVX2 bmi2:BMI2 fma:FMA f16c:F16C avx_vnni:AVX_VNNI avx512f:AVX512 \
    avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    if [[ $CPU_FLAGS == *" ${pair%%:*} "* ]]; then ISA+=("-DGGML_${pair#*:}=ON"); else ISA+=("-DGGML_${pair#*:}=OFF"); fi
done
ISA+=(-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
WANTED="llama-cpp-python==$VERSION ${ISA[*]}"

if [ -x "$BINARY" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$WANTED" ]; then
    step "$BINARY is built from $WANTED; nothing to do"
    exit 0
fi

missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v make >/dev/null 2>&1 || missing+=(make)
if [ ${#missing[@]} -gt 0 ]; then
    step "installing ${missing[*]} with apt-get"
    bash "$ROOT/scripts/apt-install.sh" "${missing[@]}"
fi

mkdir -p "$BUILD_DIR/download"
SDIST="$BUILD_DIR/download/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
    step "downloading the llama-cpp-python==$VERSION sdist (about 75 MB)"
    # --no-binary for this package alone: `:all:` would build its build tools from source too
    "$PYTHON" -m pip download --disable-pip-version-check --quiet --no-deps \
        --no-binary llama-cpp-python -d "$BUILD_DIR/download" "llama-cpp-python==$VERSION"
fi
SOURCE="$BUILD_DIR/src/llama_cpp_python-$VERSION"
if [ ! -f "$SOURCE/vendor/llama.cpp/CMakeLists.txt" ]; then
    step "unpacking the vendored llama.cpp source"
    rm -rf "$BUILD_DIR/src"
    mkdir -p "$BUILD_DIR/src"
    tar -xzf "$SDIST" -C "$BUILD_DIR/src" "llama_cpp_python-$VERSION/vendor/llama.cpp"
fi

CMAKE_BUILD="$BUILD_DIR/cmake-$VERSION"
step "configuring (CPU only, Release; ${ISA[*]})"
cmake -S "$SOURCE/vendor/llama.cpp" -B "$CMAKE_BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF "${ISA[@]}" -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF \
    -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
    >"$BUILD_DIR/configure.log" 2>&1 || {
    tail -n 30 "$BUILD_DIR/configure.log" >&2
    echo "build-llama-server: cmake could not configure; see $BUILD_DIR/configure.log" >&2
    exit 1
}
step "compiling llama-server with $JOBS jobs (about 10 CPU-minutes; log: $BUILD_DIR/build.log)"
# cmake prints "[ n%] Building ..." lines: show one progress line per tenth, and any error
report_progress() {
    local line percent last=-10
    while IFS= read -r line; do
        if [[ $line =~ ^\[\ *([0-9]+)%\] ]]; then
            percent=${BASH_REMATCH[1]}
            if ((percent >= last + 10)); then
                last=$((percent - percent % 10))
                step "${percent}%"
            fi
        elif [[ $line == *"error:"* ]]; then
            echo "$line"
        fi
    done
}
BUILT="$CMAKE_BUILD/bin/llama-server"  # llama.cpp sets its own output folder
if ! cmake --build "$CMAKE_BUILD" --target llama-server --config Release -j "$JOBS" 2>&1 |
    tee "$BUILD_DIR/build.log" | report_progress || [ ! -x "$BUILT" ]; then
    echo "build-llama-server: the build failed; see $BUILD_DIR/build.log" >&2
    exit 1
fi

# one request before it counts as built: a kernel this CPU cannot run dies here, not in a bench
GGUF=${LLAMA_CHECK_GGUF:-$(find "$ROOT/build/downloads" -name '*.gguf' 2>/dev/null | sort | head -n 1)}
if [ -n "$GGUF" ]; then
    PORT=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    step "checking it with one request on $(basename "$GGUF") (port $PORT)"
    "$BUILT" -m "$GGUF" --host 127.0.0.1 --port "$PORT" -c 512 -t "$JOBS" >"$BUILD_DIR/check.log" 2>&1 &
    SERVER=$!
    ANSWER=""
    for _ in $(seq 1 120); do
        if ! kill -0 "$SERVER" 2>/dev/null; then break; fi
        ANSWER=$(curl -sf -m 60 "http://127.0.0.1:$PORT/completion" \
            -d '{"prompt": "def add(a, b):", "n_predict": 8}' 2>/dev/null) && break
        sleep 1
    done
    kill "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null
    STATUS=$?
    if [[ $ANSWER != *'"content"'* ]]; then
        tail -n 20 "$BUILD_DIR/check.log" >&2
        echo "build-llama-server: the built server did not answer a request (exit status $STATUS;" \
            "132 is SIGILL: an instruction this CPU refuses); see $BUILD_DIR/check.log" >&2
        exit 1
    fi
    step "it answered: $(echo "$ANSWER" | "$PYTHON" -c 'import json, sys; print(repr(json.load(sys.stdin)["content"]))')"
else
    step "no GGUF under build/downloads/ to check it with (run make model first); not checked"
fi
install -D -m 755 "$BUILT" "$BINARY"
echo "$WANTED" >"$STAMP"
step "built $BINARY ($("$BINARY" --version 2>&1 | grep -m1 version || true))"
