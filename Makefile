# Two entry points for a fresh machine: `make demo` (the main job) and `make test`.
# Both create the virtual environment when it is missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: setup test test-fast demo clean

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# 1. torch first, pinned: unpinned it pulls a multi-GB CUDA build.
	$(PIP) install torch==2.13.0 numpy cython setuptools wheel
	# 2. fairseq-fixed compiled against that torch (~3 min); with build isolation
	#    its build would download another torch.
	$(PIP) install --no-build-isolation fairseq-fixed==0.12.3.1
	# 3. the plugin itself, with its test extras.
	$(PIP) install --no-build-isolation -e '.[test]'
	touch $@

setup: $(VENV)/.installed

# two workers (most tests run one single-threaded fairseq process at a time); a
# file's tests stay together, so each module's fixtures are built once
test: setup
	$(PY) -m pytest -q -n 2 --dist loadfile tests

# the math and wiring, without the end-to-end runs of fairseq's tools and the scripts
test-fast: setup
	$(PY) -m pytest -q -m "not slow" tests

demo: setup
	$(PY) scripts/demo.py

clean:
	rm -rf $(VENV) *.egg-info
