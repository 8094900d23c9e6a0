"""examples/budgetformer/budget_research/benchmark/recipe_memory.py: a command's process
tree is sampled together, so that memory a parent holds while its child runs counts."""

import sys

import pytest

from budget_research.benchmark.recipe_memory import descendants, report, sampled

# a parent holding 150 MB while its child holds 100 MB (both touched, so resident)
PARENT = """
import subprocess, sys, time
held = bytearray(150 * 2**20)
child = "held = bytearray(100 * 2**20); import time; time.sleep(1.5)"
subprocess.run([sys.executable, "-c", child], check=True)
"""


def test_a_process_tree_is_read_from_the_parents():
    table = {1: (0, 10), 2: (1, 20), 3: (2, 30), 4: (1, 40), 5: (0, 50)}
    assert descendants(1, table) == [1, 2, 3, 4] and descendants(3, table) == [3]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="samples /proc")
def test_the_peak_sums_a_parent_and_its_child_at_the_same_moment(tmp_path):
    found = sampled([sys.executable, "-c", PARENT], tmp_path / "log", {}, interval=0.05)
    mib = 2**20 / 2**30
    assert found["peak_sum_gib"] >= 240 * mib, found
    assert sum(found["at_peak_gib"].values()) == pytest.approx(found["peak_sum_gib"])
    # both are "python" to role(): one process's own peak is the larger one's, not their sum
    assert 150 * mib <= max(found["own_peak_gib"].values()) < 240 * mib, found


def test_the_report_says_when_the_machine_was_shared():
    found = {"own_peak_gib": {"budget-finetune": 4.0, "dense step (fairseq-train)": 5.0, "other (exited)": 0.0},
             "at_peak_gib": {"budget-finetune": 0.5}, "peak_sum_gib": 6.0, "dense_step_peak_gib": 5.0,
             "ratio": 1.2, "wall_s": 900}
    alone = report(found)
    assert "| budget-finetune | 0.50 | 4.00 |" in alone and "| dense step (fairseq-train) | 0.00 | 5.00 |" in alone
    assert "other (exited)" not in alone and "1.20x" in alone and "shared the machine" not in alone
    assert "its time is not" in report({**found, "shared": True})
