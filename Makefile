# The two commands a new user needs:  `make demo`  and  `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: venv tools unit-tools up down status demo test unit e2e crd
# What the unit tests run from the tool cache: helm (chart), promtool (alert rules), the LWS CRD (schema),
# prometheus (the Prometheus metrics source against a real server), kwok's stage files (the harness's pod
# stages), the InferencePool and HTTPRoute CRDs and the endpoint picker and P/D sidecar binaries (mode Gateway:
# schemas and flags), and llm-d-inference-sim (bench serve measured against bare simulators).
UNIT_TOOLS := helm promtool lws prometheus kwok gie gateway-api pd-sidecar epp inference-sim

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.installed ## Python environment with pinned dependencies

tools: ## build (or reuse cached) etcd, Kubernetes, kwok, llm-d-inference-sim, helm, LWS, promtool, Prometheus from pinned Go modules
	bash e2e/build-tools.sh

unit-tools: ## build (or reuse cached) only what the unit tests need
	bash e2e/build-tools.sh $(UNIT_TOOLS)

up: venv tools ## start the local real control plane with simulated GPU nodes
	$(PY) -m e2e.harness up

down: ## stop every process the harness started and remove its state (the e2e shards' clusters too)
	$(PY) -m e2e.harness down
	for d in e2e/.state-shard*/; do [ ! -d "$$d" ] || V41F_STATE="$$d" $(PY) -m e2e.harness down; done

status:
	$(PY) -m e2e.harness status

demo: venv tools ## the main job: cluster + operator + example deployment Ready + a chat completion
	$(PY) -m e2e.demo

unit: venv unit-tools ## unit tests (with CI=true a test whose tool is missing fails instead of skipping)
	$(VENV)/bin/pytest -q -rs tests

e2e: venv ## the e2e suite (builds the tools first), in E2E_SHARDS pytest processes, each on its own cluster
	$(PY) -m e2e.make_test --only e2e

test: venv ## every test: the tools, then the unit suite beside the e2e suite (e2e/make_test.py); prints phase times
	$(PY) -m e2e.make_test --unit-tools "$(UNIT_TOOLS)"

crd: venv ## regenerate crds/ from the API models
	$(VENV)/bin/v41flash crd
	$(PY) manifests/sync.py --crds-only
