"""budget_plugin/serving/width_latency.py: the pick is the fastest width at batch 1 among
those within a point of dense on dev, and the summary's ratios are the timed figures'."""

from budget_plugin.serving.width_latency import DENSE, pick, width_table

DEV = {DENSE: 82.0, "width 0.75": 82.5, "width 0.5": 81.1, "width 0.3": 80.9, "width 0.25": 79.0}
LATENCY = {DENSE: {"b1": 3.0, "b32": 80.0}, "width 0.75": {"b1": 2.5, "b32": 60.0},
           "width 0.5": {"b1": 2.0, "b32": 45.0}, "width 0.3": {"b1": 1.5, "b32": 30.0},
           "width 0.25": {"b1": 1.2, "b32": 25.0}}


def test_the_pick_is_the_fastest_width_within_a_point_of_dense():
    assert pick(DEV, LATENCY) == "width 0.5"  # 0.3 lost 1.1 points, 0.25 3.0
    assert pick(DEV, {**LATENCY, "width 0.75": {"b1": 1.9, "b32": 60.0}}) == "width 0.75"  # timed, not assumed
    assert pick({DENSE: 90.0, "width 0.5": 80.0}, LATENCY) is None


def test_the_summary_marks_the_pick_and_gives_the_timed_ratios():
    lines = width_table(DEV, LATENCY, "width 0.5")
    row = next(line for line in lines if "width 0.5 " in line)
    assert row.startswith("-> ") and row.split()[3:] == ["81.10", "2.00", "0.67", "45.00", "0.56"]
    assert sum(line.startswith("-> ") for line in lines[1:-1]) == 1
    assert lines[-1].startswith("-> the fastest width within 1 point") and "width 0.5" in lines[-1]
    assert "none" in width_table(DEV, LATENCY, None)[-1]
