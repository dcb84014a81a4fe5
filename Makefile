# Two commands on a fresh machine: `make tune` (set up, tune the default model, print the
# comparison table) and `make test` (set up, run the checks and the test suite).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup tune test lint clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

tune: $(STAMP)
	$(BIN)/pip install -q -e ".[dev,bench]"
	$(BIN)/sandwichc tune --budget quick
	$(BIN)/sandwichc bench gemm --json results/gemm_vs_vendor.json

lint: $(STAMP)
	$(BIN)/ruff check sandwich compiler dsl tuner topology runtime tests

test: $(STAMP) lint
	$(BIN)/python -m pytest tests

clean:
	rm -rf $(VENV) build *.egg-info
