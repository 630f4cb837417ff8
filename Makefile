# Serve a code-completion GPT-J through a Triton ensemble. `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
# make model: STEPS=<n> trains longer, FORCE=1 rebuilds over an existing model
STEPS ?=
FORCE ?=

.PHONY: help setup setup-dev model triton test lint format clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.setup: pyproject.toml | $(BIN)/activate
	$(BIN)/pip install --disable-pip-version-check -e .
	touch $@

$(VENV)/.setup-dev: $(VENV)/.setup
	$(BIN)/pip install --disable-pip-version-check -e '.[dev]'
	touch $@

setup: $(VENV)/.setup  ## virtual environment in .venv with the server, engine and client

setup-dev: $(VENV)/.setup-dev  ## setup + test and lint tools

model: setup  ## train the default model (~5 min), unless one is present
	$(BIN)/python -m modelbuild build $(if $(STEPS),--steps $(STEPS)) $(if $(FORCE),--force)

triton: model  ## start Triton on model_repository/ (HTTP 8000, gRPC 8001, metrics 8002)
	$(BIN)/python -m serving.triton --model-repository model_repository \
		--http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT)

test: setup-dev  ## unit and integration tests (start their own server on a tiny model)
	$(BIN)/python -m pytest

lint: setup-dev  ## ruff lint and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup-dev  ## ruff format and autofix
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:  ## remove the environment, the server runtime copy and caches (not the model)
	rm -rf $(VENV) .triton .pytest_cache .ruff_cache build
