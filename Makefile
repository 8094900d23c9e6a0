# Two entry points for a fresh machine: `make demo` (the main job) and `make test`.
# Both create the virtual environment when it is missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_PIP_ARGS ?=

.PHONY: setup test test-fast test-durations demo clean

$(VENV)/.installed: setup.py serve/pyproject.toml
	@# fairseq-fixed 0.12.3.1 is built and tested here on Python 3.11 only; on other
	@# versions its compiled extensions or pinned wheels may be missing: say so up front
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if v == (3, 11) else \
		"error: make setup needs Python 3.11 (found %d.%d at %s); run it with PYTHON=python3.11" % (*v, sys.executable))'
	@command -v $${CXX:-c++} >/dev/null || { echo "error: make setup needs a C/C++ compiler (fairseq's extensions are compiled): apt-get install build-essential"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# 1. torch first, pinned to a version; the pin does not pick the build: which wheel
	#    comes is the package index's choice (TORCH_PIP_ARGS: e.g. --index-url of a CPU index)
	$(PIP) install $(TORCH_PIP_ARGS) torch==2.13.0 numpy cython setuptools wheel
	# 2. fairseq-fixed compiled against that torch (~3 min); with build isolation
	#    its build would download another torch.
	$(PIP) install --no-build-isolation fairseq-fixed==0.12.3.1
	# 3. the serving distribution (torch-free, serve/), then the plugin with its test and
	#    export extras (the suite covers all three)
	$(PIP) install --no-build-isolation -e serve
	$(PIP) install --no-build-isolation -e '.[test,export]'
	touch $@

setup: $(VENV)/.installed

# two workers (most tests run one single-threaded fairseq process at a time); a
# file's tests stay together, so each module's fixtures are built once; the longest
# files go first (the seconds tests/durations.json measured, tests/conftest.py), not
# the files of most tests (xdist's default)
test: setup
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests

# the same run, which then writes each test file's seconds to tests/durations.json
# (commit it after adding, splitting or much changing test files)
test-durations: setup
	BUDGET_TEST_DURATIONS=1 $(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests

# the math and wiring, without the end-to-end runs of fairseq's tools and the scripts
test-fast: setup
	$(PY) -m pytest -q -m "not slow" tests

demo: setup
	$(PY) examples/budgetformer/demo.py

clean:
	rm -rf $(VENV) *.egg-info
