# Two entry points, both safe on a fresh machine: they create (or reuse) .venv
# and install the pinned versions from constraints.txt before running.
#   make demo   - the main job: walk the rank core through upscale, crash,
#                 downscale and controller recovery (no cluster needed)
#   make test   - the whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.rankcore-installed
PYTEST_ARGS ?=

.PHONY: demo test bench install clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): $(PY) pyproject.toml constraints.txt
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/rankcore demo

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[bench]'
	$(PY) benchmarks/bench_ranks.py

clean:
	rm -rf $(VENV) .hypothesis .pytest_cache
