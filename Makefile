# Two entry points, both safe on a fresh machine: they create (or reuse) .venv
# and install the pinned versions from constraints.txt before running.
#   make simulate - the main job: simulate an example scenario (no cluster
#                   needed) and print what happened to the ranks
#   make test     - the whole test suite, after the static checks (make lint:
#                   ruff, mypy, and mypy over the README's and docs' examples)
# Also: make demo (the bare core, step by step), make bench (benchmarks).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.rankcore-installed
PYTEST_ARGS ?=

SCENARIO ?= examples/scenarios/controller-crash.yaml

.PHONY: simulate demo test lint browser bench mutate mutate-rules install clean

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

lint: $(STAMP)
	$(VENV)/bin/ruff check rankcore executors tools benchmarks tests
	$(VENV)/bin/mypy
	$(PY) tools/typecheck_docs.py

# (--durations: the slowest tests, so each CI log says where the suite's time goes.) Two processes
# (pytest-xdist), each taking whole files: a file's Ray is started once in the process that runs it.
# On 2 cores the suite takes ~24 minutes so, against ~38 in one (2026-11-27): most of a Ray test's
# time is waiting. TEST_WORKERS=1 runs it in one process.
TEST_WORKERS ?= 2
test: lint browser
	$(PY) -m pytest $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) --durations=25 $(PYTEST_ARGS)

# The status page's browser test drives Debian's chromium (playwright's own browser
# download cannot be fetched here); installed when missing and we may (root, apt).
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	    { apt-get install -y -qq chromium >/dev/null 2>&1 || \
	      { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1; }; }; } || \
	  echo "make: no chromium could be installed: the status page's browser test will be skipped"

bench: $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[bench]'
	$(PY) benchmarks/bench_ranks.py
	$(PY) benchmarks/bench_sim.py
	$(PY) benchmarks/bench_checks.py

# mutmut's mutants of the rule modules of issues 19-23 (config: pyproject.toml's
# [tool.mutmut]; docs/testing.md): slow, run before a release. Results are kept
# in mutants/: a plain `make mutate` tests only mutants not tested yet or of
# functions that changed; naming modules tests all of theirs again, e.g.
# make mutate MUTATE_MODULES="rankcore.requests.queue rankcore.tiers.residency"
# It fails when a mutant survives that docs/testing.md does not explain.
MUTATE_MODULES ?=
MUTATE_JOBS ?= 1
MUTMUT_STAMP := $(VENV)/.rankcore-mutmut-installed

$(MUTMUT_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,mutate]'
	touch $(MUTMUT_STAMP)

mutate: $(MUTMUT_STAMP)
	$(PY) tools/mutmut_summary.py --drop-empty-stats
	$(PY) -m mutmut run --max-children $(MUTATE_JOBS) $(foreach m,$(MUTATE_MODULES),'$(m).*')
	$(PY) tools/mutmut_summary.py $(foreach m,$(MUTATE_MODULES),$(subst .,/,$(m)).py)

# The hand-written rule-breaking mutations of rankcore/ (tools/mutate.py; see
# docs/mutation-testing.md): every one must be killed.
mutate-rules: $(STAMP)
	$(PY) tools/mutate.py

clean:
	rm -rf $(VENV) .hypothesis .pytest_cache .mypy_cache mutants
