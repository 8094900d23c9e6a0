"""examples/budgetformer/budget_research/serving_throughput.py: each scenario sends what
it says (one text a request, four callers at once, batches of 32), the medians are
taken over interleaved rounds, and the report's ratios are the recorded figures'."""

import threading

from budget_research import serving_throughput
from budget_research.serving_throughput import BASELINE, SCENARIOS, report, throughput


class Counting:
    """A predictor that records each call's texts, batch size and thread."""

    def __init__(self):
        self.calls, self.lock = [], threading.Lock()

    def predict(self, texts, batch_size=32):
        with self.lock:
            self.calls.append((len(texts), batch_size, threading.get_ident()))
        return [None] * len(texts)


def test_each_scenario_sends_what_it_says():
    texts = [f"text {i}" for i in range(40)]
    predictor = Counting()
    assert serving_throughput.one_caller(predictor, texts) > 0
    assert [c[0] for c in predictor.calls] == [1] * 40
    predictor.calls.clear()
    serving_throughput.callers(predictor, texts, count=4)
    assert [c[0] for c in predictor.calls] == [1] * 40 and len({c[2] for c in predictor.calls}) == 4
    predictor.calls.clear()
    serving_throughput.batch_job(predictor, texts)
    assert predictor.calls == [(40, 32, threading.get_ident())]


def test_the_medians_and_the_reports_ratios_are_the_recorded_figures(monkeypatch):
    rates = iter([float(n) for n in range(1, 100)])
    for name in ("one_caller", "callers", "batch_job"):
        monkeypatch.setattr(serving_throughput, name, lambda *args, **kwargs: next(rates))
    found = throughput({BASELINE: Counting(), "width 0.5, int8": Counting()}, ["a"] * 8, ["a"] * 8, rounds=3,
                       log=lambda _: None)
    # round r times the rotated order (r=0: baseline first), three scenarios each
    assert found[BASELINE]["1 caller, b1"] == 10.0 and found["width 0.5, int8"]["1 caller, b1"] == 7.0
    study = {"dataset": "MR", "seed": 1, "threads": 2, "rounds": 3, "singles": 8, "batch_texts": 8,
             "throughput": found}
    table = report(study)
    row = next(line for line in table.splitlines() if line.startswith("| width 0.5, int8"))
    cells = [float(c) for c in row.strip("| ").split(" | ")[1:]]  # after the system's name
    for i, scenario in enumerate(SCENARIOS):
        value, ratio = cells[2 * i], cells[2 * i + 1]
        assert value == round(found["width 0.5, int8"][scenario], 1)
        assert ratio == round(found["width 0.5, int8"][scenario] / found[BASELINE][scenario], 2)
