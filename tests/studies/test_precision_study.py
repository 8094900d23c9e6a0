"""examples/budgetformer/budget_research/precision_study.py: the bf16 runs' dev accuracy
against the seeds study's fp32 records, each system's mean difference over the seeds
held against the issue's 0.3; and calibration_cost.py's bisection kept as it was."""

import copy

import torch

from budget_plugin.dial.calibration import MISSED, calibrate, calibration_ratios, mean_ratio
from budget_research.bisection_calibration import bisection_calibrate
from budget_research.precision_study import SYSTEMS, fp32_dev, report
from helpers import dial_batches, nested_model


def seeds_record(accuracy: float) -> dict:
    return {"systems": {f"{name}, ONNX Runtime": {"dev_accuracy": accuracy} for name in SYSTEMS}}


def test_fp32_is_the_seeds_studys_onnx_runtime_fp32_dev_accuracy():
    assert fp32_dev(seeds_record(80.0)) == {name: 80.0 for name in SYSTEMS}


def test_a_system_misses_when_its_mean_loss_over_the_seeds_passes_0_3():
    fp32 = {name: 80.0 for name in SYSTEMS}
    seeds = [{"seed": 1, "fp32": fp32, "bf16": {**fp32, "width 0.3": 79.2}},  # -0.8
             {"seed": 2, "fp32": fp32, "bf16": {**fp32, "width 0.3": 80.0, "dense": 79.8}}]  # 0, -0.2
    text = report({"MR": seeds})
    assert "## MR (seeds 1, 2)" in text
    assert "| width 0.3 | 80.00 / 79.20 | 80.00 / 80.00 | -0.40 | **missed** |" in text
    assert "| dense | 80.00 / 80.00 | 80.00 / 79.80 | -0.10 | held |" in text


def test_the_product_calibration_agrees_with_the_bisection_it_replaced():
    """Both tables hold every ratio the dial is calibrated at (either may add a middle
    row), the ends agree to the bisection's resolution, and both dial within MISSED."""
    torch.manual_seed(0)
    model, data = nested_model(), dial_batches()
    tables = {"now": calibrate(model, data), "before": bisection_calibrate(model, data)}
    aims = calibration_ratios(1, 4)
    for table in tables.values():
        assert all(any(abs(r - aim) < 1e-6 for r in table[:, 0].tolist()) for aim in aims)
    assert (tables["now"][[0, -1], 1] - tables["before"][[0, -1], 1]).abs().max() <= 0.01
    for name, table in tables.items():
        dialled = copy.deepcopy(model)
        dialled.store_dial(table)
        for ratio in (0.35, 0.45, 0.55, 0.675, 0.825, 0.95):
            with dialled.dialled(str(ratio)):
                assert abs(mean_ratio(dialled, data) - ratio) <= MISSED, (name, ratio)
