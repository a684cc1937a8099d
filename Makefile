# The two commands a new user needs:  `make demo`  and  `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: venv tools up down status demo test unit e2e crd

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.installed ## Python environment with pinned dependencies

tools: ## build (or reuse cached) etcd, Kubernetes, kwok, llm-d-inference-sim, helm, LWS from pinned Go modules
	bash e2e/build-tools.sh

up: venv tools ## start the local real control plane with simulated GPU nodes
	$(PY) e2e/harness.py up

down: ## stop every process the harness started and remove its state
	$(PY) e2e/harness.py down

status:
	$(PY) e2e/harness.py status

demo: venv tools ## the main job: cluster + operator + example deployment Ready + a chat completion
	$(PY) e2e/demo.py

unit: venv
	$(VENV)/bin/pytest -q tests

e2e: venv tools
	$(VENV)/bin/pytest -q -m e2e e2e

test: unit e2e ## every test: unit tests, then e2e on the real control plane

crd: venv ## regenerate crds/ from the API models
	$(VENV)/bin/v41flash crd
	$(PY) manifests/sync.py --crds-only
