# The two set-up commands (see README.md): `make broker` and `make test`.
# Both create .venv on first use: `make broker` with the broker's own dependencies only,
# `make test` adds the test tools, the optional Spark pipeline (pyspark, ~460 MB) and the web
# console (`phpmq web`) with its browser-test driver.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# pytest-xdist workers for `make test`; tests of one xdist_group share a worker. 4 workers
# keep the 2 cores busy most of the run; 5 took 5:36 instead of about 6:00, but two of its
# runs each failed a timing-sensitive test (docs/testing.md).
# --durations: each run lists its 25 slowest tests, where the suite's time goes (issue #29).
# --no-loadscope-reorder: the groups start in the collection's order, the longest first
# (tests/conftest.py's LONGEST_GROUPS), not in the order of their number of tests.
JOBS ?= 4
# Set only where a recipe compiles (compiled, wheel, test): exported from a shell it would make
# every `pip install` of the venv try to compile.
unexport PHPMQ_COMPILE
# The Python sources, compiled to bytecode before the tests run.
PY_SOURCES = bench bridges broker phpmq pipeline protocol workers tests tools conftest.py

# The compiled hot path (setup.py, docs/performance.md): mypyc's C extensions beside their
# sources. `make test` runs the suite once pure, once compiled, and leaves the tree pure.
COMPILED_FILES = broker/*.so protocol/*.so broker/_compiled_sources.txt \
	protocol/_compiled_sources.txt
PYTEST = env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -n $(JOBS) --dist loadgroup \
	--no-loadscope-reorder --durations=25 $(ARGS)

.PHONY: broker test lint bench compiled pure wheel

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.core: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test,spark,web,compile]'
	touch $@ $(VENV)/.compile

$(VENV)/.compile: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[compile]'
	touch $@

compiled: $(VENV)/.compile
	rm -f $(COMPILED_FILES)
	PHPMQ_COMPILE=1 $(BIN)/python setup.py --quiet build_ext --inplace

pure:
	rm -f $(COMPILED_FILES)

# A compiled wheel in dist/, checked installed on its own; the tree is left pure (an in-place
# `make compiled` build is removed). The build's output is shown only when it fails.
wheel: $(VENV)/.compile
	rm -rf dist build/lib* build/bdist*
	mkdir -p build
	PHPMQ_COMPILE=1 $(BIN)/pip wheel --quiet --no-deps --no-build-isolation -w dist . \
	  >build/wheel.log 2>&1 || { cat build/wheel.log; rm -f $(COMPILED_FILES); exit 1; }
	rm -f $(COMPILED_FILES)
	$(BIN)/python tools/check_wheel.py dist/phpmq_zmq-*.whl

broker: $(VENV)/.core
	$(BIN)/phpmq broker $(ARGS)

test: $(VENV)/.test
	@# php-cli for the stock-client end-to-end test, tmux for the `phpmq top` test,
	@# systemd-analyze (package systemd) for the deploy/ units, chromium and chromedriver for the
	@# web console's browser tests; in CI a missing one fails its test.
	@for tool in php:php-cli tmux:tmux systemd-analyze:systemd chromium:chromium \
	    chromedriver:chromium-driver; do \
	  if [ -n "$$CI" ] && ! command -v $${tool%%:*} >/dev/null 2>&1; then \
	    apt-get install -y -q --no-install-recommends $${tool#*:} >/dev/null 2>&1 \
	    || { apt-get update -q >/dev/null \
	         && apt-get install -y -q --no-install-recommends $${tool#*:} >/dev/null; }; \
	  fi; \
	done
	$(BIN)/ruff check .
	$(BIN)/python tools/unasync.py --check
	@# The suite starts about 1,650 Python processes (brokers, CLI runs, workers, Spark's
	@# Python workers): without bytecode each compiled our sources again (80 ms of a broker's
	@# 180 ms start), and pytest its test files in each worker. So the bytecode is written
	@# first, and written by the run, even where PYTHONDONTWRITEBYTECODE is set.
	$(BIN)/python -m compileall -q -j 0 $(PY_SOURCES)
	@# Spark's classes parsed once for all the run's JVMs (tests/spark_cds.py; kept in the venv).
	$(BIN)/python tests/spark_cds.py
	@# Once pure Python, once with the compiled hot path: both pass the same tests.
	rm -f $(COMPILED_FILES)
	@echo "== the suite, pure Python"
	EXPECT_COMPILED_HOT_PATH=0 $(PYTEST); status=$$?; \
	  if [ $$status -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$status
	@echo "== the suite, with the compiled hot path"
	@# The tree is left pure however this ends (a failure, Ctrl-C).
	trap 'rm -f $(COMPILED_FILES)' EXIT; trap 'exit 130' INT; trap 'exit 143' TERM; \
	  PHPMQ_COMPILE=1 $(BIN)/python setup.py --quiet build_ext --inplace \
	  && EXPECT_COMPILED_HOT_PATH=1 $(PYTEST); status=$$?; \
	  if [ $$status -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$status
	@echo "== a compiled wheel, installed on its own"
	$(MAKE) --no-print-directory wheel

bench: $(VENV)/.core
	$(BIN)/phpmq bench $(ARGS)
