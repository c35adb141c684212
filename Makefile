# make setup : install everything into .venv (seconds when already installed)
# make test  : setup + the layer contract (lint-imports, pyproject.toml) + the test suite
# make demo  : setup + the default training run (task=lift, state obs, CPU budget)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.robo_rl_installed

.PHONY: setup test demo bench
setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt scripts/setup.sh robo_rl/envs/setup_sim.py
	VENV=$(VENV) bash scripts/setup.sh
	touch $(STAMP)

test: setup
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q --durations=15 tests

demo: setup
	$(PY) scripts/train_qwm.py

bench: setup
	$(PY) benchmarks/env_throughput.py --task lift --num-envs 2 --steps 300 --json runs/bench/env_throughput.json
