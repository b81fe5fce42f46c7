# Developer and CI entry points. Every target uses the project's .venv, so none
# needs an activated environment. `make install` creates it with python3.11.

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
SOURCES := app workers fakes tests bench alembic
# The end-to-end Matrix tests run a real Synapse from PyPI in a virtualenv of its own (its pins
# are not ours); tests/support/synapse.py finds it here.
SYNAPSE_VENV ?= .synapse-venv
SYNAPSE_VERSION := 1.163.2
SYNAPSE_STAMP := $(SYNAPSE_VENV)/.matrix-synapse-$(SYNAPSE_VERSION)
# Every dependency pinned (pyproject.toml's, all extras, and theirs); installs use it as constraints,
# so a dependency added to pyproject.toml and not yet locked still installs. `make lock` rewrites it.
LOCK := requirements.lock
UV_VERSION := 0.13.8

.DEFAULT_GOAL := help
.PHONY: help install lock synapse redis-cluster test test-fast test-slow lint format typecheck rules manifests proto openapi run check bench bench-scale
.PHONY: pg-replica fast-tier

help:
	@echo "make install    create $(VENV) (with $(PYTHON)) if missing and install the package with dev extras"
	@echo "                at the versions of $(LOCK)"
	@echo "make lock       regenerate $(LOCK) from pyproject.toml, keeping its pins where they still fit"
	@echo "                (UPGRADE=1: the newest release of everything)"
	@echo "make run        xmtp-push dev: HTTP :8080 and gRPC :50051 on SQLite, in-process queue"
	@echo "make synapse    create $(SYNAPSE_VENV) with matrix-synapse $(SYNAPSE_VERSION) if missing (for the Matrix end-to-end tests)"
	@echo "make redis-cluster  start a six-node Redis Cluster on 127.0.0.1:$(REDIS_CLUSTER_PORT)..+5 if not running (the tests"
	@echo "                find it by XMTP_PUSH_TEST_REDIS_CLUSTER=redis://127.0.0.1:$(REDIS_CLUSTER_PORT))"
	@echo "make test       run the test suite (needs PostgreSQL on 127.0.0.1:5432 and make pg-replica; .ci/run sets"
	@echo "                them up); makes synapse first"
	@echo "make test-fast  in about a minute, the tests that need no outside service (PostgreSQL, Redis, Chromium,"
	@echo "                Synapse, nginx, promtool, docker-compose) and are not slow"
	@echo "make test-slow  the tests test-fast leaves out (make test runs both)"
	@echo "make pg-replica a PostgreSQL streaming replica of 127.0.0.1:5432 on 127.0.0.1:$(PG_REPLICA_PORT) (pg_basebackup -R),"
	@echo "                for the read-replica tests; uses one already there"
	@echo "make lint       ruff check, ruff format --check and the package layers (lint-imports)"
	@echo "make format     apply ruff format and safe ruff fixes"
	@echo "make typecheck  mypy, strict, on app, workers, fakes and bench"
	@echo "make rules      promtool check rules and test rules on deploy/prometheus (Debian: apt-get install prometheus)"
	@echo "make manifests  validate deploy/kubernetes against Kubernetes' schemas (offline: kubernetes-validate ships them)"
	@echo "make proto      regenerate app/proto modules from the .proto files"
	@echo "make openapi    rewrite openapi/openapi.json from the HTTP app"
	@echo "make check      lint, typecheck, the fast tier (without its time bound), rules, manifests and test-slow"
	@echo "make bench      install the bench extra and run, one after another, the benchmarks of docs/performance.md's"
	@echo "                table (python -m bench.<name>; each prints its numbers as a table)"
	@echo "make bench-scale  the schema and fan-out at 1M and at 100M subscriptions (python -m bench.scale; about"
	@echo "                half an hour and 25 GB of disk for 100M; not in CI)"

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

# The queue's contract suite and pipeline tests also run on a Redis Cluster: three primaries with a
# replica each, on six consecutive ports from REDIS_CLUSTER_PORT.
REDIS_CLUSTER_PORT ?= 7001
REDIS_CLUSTER_DIR ?= /tmp/xmtp-push-redis-cluster-$(REDIS_CLUSTER_PORT)

redis-cluster:
	.ci/redis-cluster $(REDIS_CLUSTER_DIR) $(shell seq $(REDIS_CLUSTER_PORT) $$(($(REDIS_CLUSTER_PORT) + 5)))

test: synapse
	XMTP_PUSH_TEST_SYNAPSE_VENV=$(abspath $(SYNAPSE_VENV)) $(BIN)/python -m pytest

# The tiers: a test is marked with each outside service it needs, and slow when it takes a second or
# more (markers in pyproject.toml, written at the tests or set by the fixtures they use:
# tests/support/tiers.py); test-fast runs the tests with none of these markers, and fails one of them
# that takes longer than FAST_TIER_SECONDS (stretched by the machine's load); test-slow runs the others.
NOT_FAST := postgres or pg_replica or redis or redis_cluster or browser or synapse or tools or slow
FAST_TIER_SECONDS := 1
test-fast:
	$(BIN)/python -m pytest -m "not ($(NOT_FAST))" --fast-tier-seconds=$(FAST_TIER_SECONDS)

test-slow: synapse
	XMTP_PUSH_TEST_SYNAPSE_VENV=$(abspath $(SYNAPSE_VENV)) $(BIN)/python -m pytest -m "$(NOT_FAST)"

# The read-replica tests find it through XMTP_PUSH_TEST_POSTGRES_REPLICA (this port by default).
PG_REPLICA_PORT ?= 5433
pg-replica:
	.ci/pg-replica start $(PG_REPLICA_PORT)

lint:
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/ruff format --check $(SOURCES)
	$(BIN)/lint-imports

format:
	$(BIN)/ruff check --fix $(SOURCES)
	$(BIN)/ruff format $(SOURCES)

typecheck:
	$(BIN)/mypy app workers fakes
	$(BIN)/mypy bench

# The alert rules and their tests (deploy/prometheus/alerts_test.yml).
rules:
	promtool check rules deploy/prometheus/alerts.yml
	promtool test rules deploy/prometheus/alerts_test.yml

# The Kubernetes deployment, every resource of it, strictly (an unknown field fails) against the oldest
# version it needs (1.30: the preStop sleep action) and the newest the validator knows. Any line from
# the validator fails too: with --quiet it prints only failures and warnings, and a kind it has no
# schema for (a typo) is only a warning. kustomization.yaml is kustomize's, not a resource.
K8S_VERSIONS := 1.30.0 1.37.0
MANIFESTS := $(filter-out %/kustomization.yaml,$(wildcard deploy/kubernetes/*.yaml))
manifests:
	@for version in $(K8S_VERSIONS); do \
		out=$$($(BIN)/kubernetes-validate --strict --quiet -k $$version $(MANIFESTS) 2>&1); status=$$?; \
		if [ $$status -ne 0 ] || [ -n "$$out" ]; then echo "$$out"; exit 1; fi; \
		echo "deploy/kubernetes: $(words $(MANIFESTS)) files valid for Kubernetes $$version"; \
	done

proto:
	$(BIN)/python -m app.proto.generate

openapi:
	$(BIN)/python -m app.api.openapi_export

run:
	$(BIN)/xmtp-push dev

# In check (CI, a loaded machine) the fast tier runs without its time bound: there a machine's pause, not
# a slow test, would fail it. `make test-fast` keeps the bound for whoever adds a test.
check: lint typecheck fast-tier rules manifests test-slow

fast-tier:
	$(BIN)/python -m pytest -m "not ($(NOT_FAST))"

# The commands of docs/performance.md's figures (all but the soak and listener_decode), one after another,
# each printing its own table; about fifteen minutes and heavy: run it on a quiet machine.
bench: $(BIN)/python
	$(BIN)/python -m pip install -c $(LOCK) -e '.[dev,bench]'
	$(BIN)/python -m bench.registration
	$(BIN)/python -m bench.callers
	$(BIN)/python -m bench.subscriber_plan
	$(BIN)/python -m bench.pipeline --mode memory --scenario throughput
	$(BIN)/python -m bench.pipeline --mode redis --workers 1 --scenario throughput
	$(BIN)/python -m bench.pipeline --mode redis --workers 2 --scenario throughput
	$(BIN)/python -m bench.pipeline --mode redis --scenario fanout --subscribers 100000
	$(BIN)/python -m bench.pipeline --mode redis --workers 2 --scenario fanout --subscribers 100000
	$(BIN)/python -m bench.pipeline --mode redis --scenario latency --rate 1000 --duration 30
	$(BIN)/python -m bench.channels --channel apns
	$(BIN)/python -m bench.channels --channel fcm --concurrency 16 --env DELIVERY_CONCURRENCY=16
	$(BIN)/python -m bench.legacy
	$(BIN)/python -m bench.marmot
	$(BIN)/python -m bench.matrix --duration 300

# Builds 1M, then 100M subscriptions in PostgreSQL (server-side, about half an hour and 25 GB of disk at
# 100M) and measures pages, Register, UpdateSubscriptions and a 1M-subscriber topic's fan-out at each.
SCALE_SIZES ?= 1000000 100000000
bench-scale: $(BIN)/python
	for size in $(SCALE_SIZES); do $(BIN)/python -m bench.scale --subscriptions $$size || exit 1; done
