# llmop — the single entry point for people and CI. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make \033[36m<target>\033[0m\n"} \
	  /^[a-zA-Z0-9_.-]+:.*?##/ { printf "  \033[36m%-20s\033[0m %s\n", $$1, $$2 } \
	  /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: install
install: $(STAMP) ## Create the virtualenv and install llmop with its dev tools.

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-* && touch $@

.PHONY: lint
lint: install ## Lint and check formatting (ruff).
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

.PHONY: fmt
fmt: install ## Format and auto-fix (ruff).
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

.PHONY: typecheck
typecheck: install ## Type-check (mypy strict, pydantic plugin).
	$(BIN)/mypy

.PHONY: generate
generate: install ## Regenerate the CRD, the chart's CRD template, the API reference and deploy/llmop.yaml.
	$(PY) -m llmop.crdgen_io
	$(PY) deploy/generate.py

.PHONY: verify
verify: generate ## Fail when generated files differ from what is committed.
	@git diff --exit-code -- crds helm/llmop/templates/crds docs/api-reference.md docs/api-reference-llmtenant.md docs/engine-contract.md deploy/llmop.yaml || \
	  (echo "generated files are stale: run 'make generate' and commit" >&2; exit 1)

.PHONY: unit
unit: install ## Unit tests only (pure core, fast).
	$(BIN)/pytest tests/unit -q

.PHONY: test
test: install lint typecheck ## Full suite from a fresh clone: lint, types, unit, engine, integration and e2e tests.
	@$(MAKE) --no-print-directory -j4 test-prereqs-first
	$(PY) tests/support/lanes.py --beside '$(MAKE) --no-print-directory test-prereqs-beside'

# The pytest step runs two sessions side by side (tests/support/lanes.py): the real node's
# (tests/e2e, tests/images) and the rest. LLMOP_TEST_LANES=serial runs them one after the other.

# Every slow thing the suite needs, built (or reused from ~/.cache/llmop); each mk/*.mk adds its
# own. test-prereqs-first: what sessions need from their first test, built in the open before
# pytest starts, in parallel: the Go builds queue on one lock (on 2 cores they would only slow
# each other) while the vLLM install, the image stand-in's downloads and the next Go set's module
# downloads overlap them. test-prereqs-beside: what only some tests need; those run last in their
# session and wait for it (tests/support/metrics.py), so it is built beside the sessions' first
# tests, at nice 19, on the cores their waiting leaves idle. `make test-prereqs` builds both.
.PHONY: test-prereqs test-prereqs-first test-prereqs-beside
test-prereqs: test-prereqs-first test-prereqs-beside
test-prereqs-first: install
test-prereqs-beside: install

.PHONY: bench
bench: install ## Run every benchmark; each prints a table (not timed tests).

include $(wildcard mk/*.mk)
