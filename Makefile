# Two entry points, both safe on a fresh machine: they create (or reuse) .venv
# and install the pinned versions from constraints.txt before running.
#   make simulate - the main job: simulate an example scenario (no cluster
#                   needed) and print what happened to the ranks
#   make test     - the whole test suite
# Also: make demo (the bare core, step by step), make bench (benchmarks).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.rankcore-installed
PYTEST_ARGS ?=

SCENARIO ?= examples/scenarios/controller-crash.yaml

.PHONY: simulate demo test bench install clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): $(PY) pyproject.toml constraints.txt
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

simulate: $(STAMP)
	$(VENV)/bin/rankcore simulate $(SCENARIO)

demo: $(STAMP)
	$(VENV)/bin/rankcore demo

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[bench]'
	$(PY) benchmarks/bench_ranks.py
	$(PY) benchmarks/bench_sim.py

clean:
	rm -rf $(VENV) .hypothesis .pytest_cache
