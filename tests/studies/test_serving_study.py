"""The serving study's arithmetic (examples/budgetformer/budget_research/serving_study.py):
the setting of each target chosen on dev, its figures against the right anchors, held or
missed; the report and figure from a study's record."""

import pytest

from budget_research.serving_study import RUNTIMES, figure, ratio, report, targets
from budget_research.width_study import DIAL_WIDTHS


def study(dev_drop: float, speed: float, test_drop: float = 0.0) -> dict:
    """Dense at 80/80 (ms: eager 10/100, int8 eager 6/60, ORT 5/100, ORT int8 3/50) and
    every width w at (80 - dev_drop x (1 - w)) on dev, its latency w x ``speed`` of dense in
    the same runtime."""
    dense = {"eager": (10.0, 100.0), "eager int8": (6.0, 60.0), "ONNX Runtime": (5.0, 100.0),
             "ONNX Runtime int8": (3.0, 50.0)}
    systems = {f"dense, {r}": {"dev_accuracy": 80.0, "test_accuracy": 80.0, "latency_b1_ms": b1,
                               "latency_b32_ms": b32} for r, (b1, b32) in dense.items()}
    for w in DIAL_WIDTHS:
        for runtime in RUNTIMES:
            b1, b32 = dense[runtime]
            loss = dev_drop * (1 - float(w))
            systems[f"width {w}, {runtime}"] = {"dev_accuracy": 80.0 - loss, "test_accuracy": 80.0 - loss - test_drop,
                                                "latency_b1_ms": b1 * float(w) * speed,
                                                "latency_b32_ms": b32 * float(w) * speed}
    exports = {name: {"model_flops_ratio": 1.0 if name == "dense" else float(name.split()[1]),
                      "checked_on": {"max_abs_logit_difference": {"fp32": 1e-5}}}
               for name in ["dense", *(f"width {w}" for w in DIAL_WIDTHS)]}
    return {"dataset": "TOY", "seed": 1, "threads": 2, "systems": systems, "exports": exports,
            "test_max_abs_logit_difference": {"dense": 2e-5}}


def test_the_fastest_width_within_a_point_on_dev_is_chosen_and_scored_against_its_own_runtime():
    found = {t["target"].split(":")[0]: t for t in targets(study(dev_drop=2.0, speed=1.0))}
    # dev loss 2 x (1 - w) is within a point down to w = 0.5 (-1.0), the smallest such: chosen
    fp32 = next(t for name, t in found.items() if name == "fp32")
    assert "width 0.5 (chosen on dev)" in fp32["target"] and fp32["held"]
    assert "b1 0.500, b32 0.500" in fp32["figures"] and "(-1.00)" in fp32["figures"]
    int8 = next(t for name, t in found.items() if name == "int8")
    assert "width 0.5" in int8["target"] and int8["held"] and "b1 0.500" in int8["figures"]
    against = next(t for t in found.values() if "PyTorch's dynamic int8" in t["target"])
    # width 0.5 on ORT int8 (1.5 ms) against dense in PyTorch's int8 (6 ms)
    assert against["held"] and "0.250x" in against["figures"] and "4.00x faster" in against["figures"]
    assert all(t["held"] for t in found.values() if "equal fairseq" in t["target"])


def test_a_target_is_missed_on_test_accuracy_or_on_speed():
    slow = targets(study(dev_drop=0.0, speed=1.3))  # every width equal on dev: 0.25 chosen, at 0.325x dense
    assert all(t["held"] for t in slow if t["target"].startswith("fp32: "))  # 0.25 x 1.3 = 0.325 <= 0.6
    slower = targets(study(dev_drop=0.0, speed=2.6))  # 0.25 x 2.6 = 0.65: over 0.6, under 0.7
    assert [t["held"] for t in slower if t["target"].startswith(("fp32: ", "int8: "))] == [False, True]
    worse = targets(study(dev_drop=0.0, speed=1.0, test_drop=1.5))  # within on dev, 1.5 under on test
    missed = [t for t in worse if t["target"].startswith(("fp32: ", "int8: "))]
    assert not any(t["held"] for t in missed) and all("(-1.50)" in t["figures"] for t in missed)
    assert ratio(study(0.0, 1.0), "width 0.5, ONNX Runtime int8", "dense, eager", 1) == pytest.approx(0.15)


def test_the_report_and_figure_are_written_from_the_record(tmp_path):
    record = study(dev_drop=2.0, speed=1.0)
    record["targets"] = targets(record)
    text = report(record)
    assert "| width 0.5, ONNX Runtime int8 | 0.500 | 0.150 | 0.250 | 0.500 | 0.500 | 79.00 | 79.00 |" in text
    assert text.count("- held:") + text.count("- MISSED:") == len(record["targets"])
    figure(record, tmp_path / "toy.png")
    assert (tmp_path / "toy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
