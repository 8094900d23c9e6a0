"""The width study's arithmetic (examples/budgetformer/budget_research/width_study.py):
cascades chosen on dev at a fixed width's latency, then scored on test; the targets
held or missed from the figures."""

import pytest
import torch

from budget_research.width_study import best_cascades, cascade, figure, report, targets


def probs(rows):
    return torch.tensor(rows, dtype=torch.float)


def test_a_cascade_escalates_the_unsure_examples_only():
    small = probs([[0.9, 0.1], [0.55, 0.45], [0.2, 0.8]])
    large = probs([[0.1, 0.9], [0.1, 0.9], [0.9, 0.1]])
    gold = torch.tensor([0, 1, 1])
    assert cascade(small, large, gold, 0.6) == (pytest.approx(100.0), pytest.approx(1 / 3))
    assert cascade(small, large, gold, 0.0) == (pytest.approx(200 / 3), 0.0)  # never escalated: small alone
    assert cascade(small, large, gold, 1.01)[1] == 1.0  # always: large alone


def test_the_best_cascade_is_chosen_on_dev_within_the_fixed_widths_latency():
    gold = {"valid": torch.tensor([0, 1, 1, 0]), "test": torch.tensor([0, 1, 0, 0])}
    small = {"valid": probs([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7], [0.8, 0.2]]),
             "test": probs([[0.9, 0.1], [0.55, 0.45], [0.7, 0.3], [0.4, 0.6]])}
    large = {"valid": probs([[0.8, 0.2], [0.2, 0.8], [0.1, 0.9], [0.7, 0.3]]),
             "test": probs([[0.8, 0.2], [0.3, 0.7], [0.6, 0.4], [0.6, 0.4]])}
    latency = {"width 0.3": 0.3, "width 1": 1.0}
    fixed = {"width 0.3": {"dev_accuracy": 75.0, "test_accuracy": 50.0},
             "width 1": {"dev_accuracy": 100.0, "test_accuracy": 100.0}}
    found = {row["at"]: row for row in best_cascades({"width 0.3": small, "width 1": large}, gold, latency, fixed)}
    assert "width 0.3" not in found  # nothing that escalates is as fast as the small width alone
    row = found["width 1"]
    # on dev, escalating the one unsure example (0.6) is all it takes: 100%, at 0.3 + 0.25 x 1
    assert row["small"] == "width 0.3" and row["large"] == "width 1"
    assert row["dev_accuracy"] == 100.0 and row["dev_escalated"] == 0.25
    assert row["dev_latency_b1"] == pytest.approx(0.55) and row["threshold"] > 0.6
    # test at dev's threshold: the two unsure examples go to large, which gets them right
    assert row["test_escalated"] == 0.5 and row["test_accuracy"] == 100.0
    assert row["test_latency_b1"] == pytest.approx(0.8) and row["fixed_test_accuracy"] == 100.0


def study(width_half_dev=81.5, width_half_b1=0.52):
    row = {"model_flops_ratio": 1.0, "latency_b32": 1.0}
    systems = {"dense": {**row, "dev_accuracy": 82.0, "test_accuracy": 82.4, "latency_b1": 1.0},
               "width 1": {**row, "dev_accuracy": 81.8, "test_accuracy": 82.0, "latency_b1": 1.02},
               "width 0.5": {**row, "dev_accuracy": width_half_dev, "test_accuracy": 81.6,
                             "latency_b1": width_half_b1},
               "heads per-input 0.5": {**row, "dev_accuracy": 83.0, "test_accuracy": 82.0, "latency_b1": 0.9},
               "4 of 6 layers": {**row, "dev_accuracy": 79.6, "test_accuracy": 79.3, "latency_b1": 0.65}}
    baselines = {"nested per_input @ 0.5": {"dev_accuracy": 83.4, "test_accuracy": 83.1},
                 "layers4": {"dev_accuracy": 79.6, "test_accuracy": 79.3}}
    return {"systems": systems, "baselines": baselines}


def test_targets_are_held_or_missed_from_the_figures():
    found = {row["target"].split(",")[0]: row for row in targets(study())}
    assert found["full width within 0.3 of dense on dev"]["held"]  # -0.2
    assert not found["heads-only heads per-input 0.5 within 0.3 of the heads-only record (nested per_input @ 0.5) "
                     "on dev"]["held"]  # -0.4
    half = found["a setting at most 0.55x dense at batch 1"]
    assert half["held"] and "width 0.5" in half["figures"]
    assert found["at the 4-layer model's batch-1 latency"]["held"]  # 81.5 vs 79.6, 81.6 vs 79.3
    slow = {row["target"].split(",")[0]: row for row in targets(study(width_half_b1=0.7))}
    assert not slow["a setting at most 0.55x dense at batch 1"]["held"]
    assert "the fastest is 0.70x" in slow["a setting at most 0.55x dense at batch 1"]["figures"]
    assert not slow["at the 4-layer model's batch-1 latency"]["held"]


def test_the_report_and_figure_show_every_system_and_target(tmp_path):
    found = study()
    for name, row in found["systems"].items():
        row.update(model_flops=1.0, latency_b1_ms=4.0 * row["latency_b1"], latency_b32_ms=100.0,
                   setting={"counts": (6, 6), "neurons": (768, 768), "shift": 0.0} if name == "width 0.5" else None)
    for width in ("1", "0.75", "0.4", "0.3", "0.25"):
        found["systems"].setdefault(f"width {width}", dict(found["systems"]["width 1"]))
    found["systems"]["4 of 6 layers"]["test_accuracy"] = None  # no record: not scored here
    found.update(dataset="MR", seed=1, threads=2, cascades=[{
        "at": "width 1", "small": "width 0.3", "large": "width 1", "threshold": 0.9, "dev_accuracy": 82.0,
        "dev_escalated": 0.3, "dev_latency_b1": 0.7, "test_accuracy": 81.9, "test_escalated": 0.32,
        "test_latency_b1": 0.72, "fixed_dev_accuracy": 81.8, "fixed_test_accuracy": 82.0, "fixed_latency_b1": 1.02}])
    found["targets"] = targets(found)
    text = report(found)
    assert text.count("\n| width ") == 6 + 1 and "| width 0.5 | 6/6 ; 768/768 | 1.000 | 0.520 |" in text
    assert "| 4 of 6 layers |  | 1.000 | 0.650 | 1.000 | 79.60 | - |" in text
    assert "| width 1 (1.020) | width 0.3 -> width 1 | 0.900 |" in text
    assert text.count("- held: ") + text.count("- MISSED: ") == len(found["targets"])
    picture = figure(found, tmp_path / "MR.png")
    if picture is not None:  # matplotlib is optional
        assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
