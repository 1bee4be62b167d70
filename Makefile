# verl Batch Lab — two entry points on a fresh machine (Python 3.11, no GPU):
#   make lab    set up .venv if needed, install, open JupyterLab on 127.0.0.1 at the first notebook
#   make test   set up / update .venv, lint (ruff), run every test (the layer contract included)
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.labkit-installed
ORACLE_071 := .oracle/verl-0.7.1
LAB_PORT ?= 8888
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export RAY_AUTH_MODE := disabled
export RAY_USAGE_STATS_ENABLED := 0
export TOKENIZERS_PARALLELISM := false

.PHONY: lab test lint venv bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -U pip
	$(PIP) install torch==2.13.0                     # the CPU build; never plain `torch`
	$(PIP) install torch==2.13.0 -e '.[lab,test]'
	# verl is a test oracle only: 0.9.1 (engine profile) in the venv, 0.7.1 (legacy workers) beside it.
	$(PIP) install --no-deps verl==0.9.1
	@test -d $(ORACLE_071)/verl || $(PIP) install --no-deps --target $(ORACLE_071) verl==0.7.1
	$(PY) -m labkit.ui.jupyter_settings $(VENV)
	@touch $(STAMP)

lab: venv
	$(VENV)/bin/jupyter lab $(ROOT_FLAG) --ip=127.0.0.1 --port=$(LAB_PORT) \
		--ServerApp.root_dir=$(CURDIR) notebooks/01_four_layers.ipynb

test: venv lint
	$(PY) -m pytest -q tests

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: venv
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .oracle .pytest_cache
