# Developer and CI entry points. Every target uses the project's .venv, so none
# needs an activated environment. `make install` creates it with python3.11.

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
SOURCES := app workers tests bench alembic
# The end-to-end Matrix tests run a real Synapse from PyPI in a virtualenv of its own (its pins
# are not ours); tests/synapse_support.py finds it here.
SYNAPSE_VENV ?= .synapse-venv
SYNAPSE_VERSION := 1.163.2
SYNAPSE_STAMP := $(SYNAPSE_VENV)/.matrix-synapse-$(SYNAPSE_VERSION)
# Every dependency pinned (pyproject.toml's, all extras, and theirs); installs use it as constraints,
# so a dependency added to pyproject.toml and not yet locked still installs. `make lock` rewrites it.
LOCK := requirements.lock
UV_VERSION := 0.13.8

.DEFAULT_GOAL := help
.PHONY: help install lock synapse test lint format typecheck rules proto openapi run check bench

help:
	@echo "make install    create $(VENV) (with $(PYTHON)) if missing and install the package with dev extras"
	@echo "                at the versions of $(LOCK)"
	@echo "make lock       regenerate $(LOCK) from pyproject.toml, keeping its pins where they still fit"
	@echo "                (UPGRADE=1: the newest release of everything)"
	@echo "make run        xmtp-push dev: HTTP :8080 and gRPC :50051 on SQLite, in-process queue"
	@echo "make synapse    create $(SYNAPSE_VENV) with matrix-synapse $(SYNAPSE_VERSION) if missing (for the Matrix end-to-end tests)"
	@echo "make test       run the test suite (needs PostgreSQL on 127.0.0.1:5432; .ci/run sets it up); makes synapse first"
	@echo "make lint       ruff check, ruff format --check and the package layers (lint-imports)"
	@echo "make format     apply ruff format and safe ruff fixes"
	@echo "make typecheck  mypy app workers"
	@echo "make rules      promtool check rules and test rules on deploy/prometheus (Debian: apt-get install prometheus)"
	@echo "make proto      regenerate app/proto modules from the .proto files"
	@echo "make openapi    rewrite openapi/openapi.json from the HTTP app"
	@echo "make check      lint, typecheck, rules and test"
	@echo "make bench      install the bench extra, run every benchmark (python -m bench), write bench/report/"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

install: $(BIN)/python
	$(BIN)/python -m pip install -c $(LOCK) -e '.[dev]'

# uv resolves for Linux and Python 3.11 (the image's and CI's); it needs the package index.
lock: $(BIN)/python
	$(BIN)/python -m pip install -q 'uv==$(UV_VERSION)'
	$(BIN)/uv pip compile pyproject.toml --all-extras --python-version 3.11 --python-platform linux \
		--custom-compile-command 'make lock' $(if $(UPGRADE),--upgrade) -o $(LOCK)

$(SYNAPSE_STAMP):
	$(PYTHON) -m venv $(SYNAPSE_VENV)
	$(SYNAPSE_VENV)/bin/python -m pip install -q 'matrix-synapse==$(SYNAPSE_VERSION)'
	touch $@

synapse: $(SYNAPSE_STAMP)

test: synapse
	XMTP_PUSH_TEST_SYNAPSE_VENV=$(abspath $(SYNAPSE_VENV)) $(BIN)/python -m pytest

lint:
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/ruff format --check $(SOURCES)
	$(BIN)/lint-imports

format:
	$(BIN)/ruff check --fix $(SOURCES)
	$(BIN)/ruff format $(SOURCES)

typecheck:
	$(BIN)/mypy app workers

# The alert rules and their tests (deploy/prometheus/alerts_test.yml).
rules:
	promtool check rules deploy/prometheus/alerts.yml
	promtool test rules deploy/prometheus/alerts_test.yml

proto:
	$(BIN)/python -m app.proto.generate

openapi:
	$(BIN)/python -m app.api.openapi_export

run:
	$(BIN)/xmtp-push dev

check: lint typecheck rules test

# Long (tens of minutes) and heavy: run it on a quiet machine. BENCH_ARGS=--quick for a smoke run.
bench: $(BIN)/python
	$(BIN)/python -m pip install -c $(LOCK) -e '.[dev,bench]'
	$(BIN)/python -m bench $(BENCH_ARGS)
