"""examples/budgetformer/plot_heads.py: the pictures of which heads a trained BudgetFormer
runs and how many, their numbers in heads.json, and TensorBoard histograms of them."""

import json
import subprocess
import sys

import pytest

from helpers import REPO, run, trained_sst_like

pytestmark = pytest.mark.slow  # trains with the fairseq tools


@pytest.fixture(scope="module")
def trained_sst(tmp_path_factory):
    return trained_sst_like(tmp_path_factory)


def test_plot_heads_writes_pictures(trained_sst, tmp_path):
    pytest.importorskip("matplotlib")
    data, save = trained_sst
    out = tmp_path / "heads"
    run([sys.executable, REPO / "examples" / "budgetformer" / "plot_heads.py", "--checkpoint-dir", save, "--data", data,
         "--split", "valid", "--out-dir", out, "--tensorboard-logdir", tmp_path / "tb"])
    for name in ("heads_overall.png", "heads_by_class.png", "budgets.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    summary = json.loads((out / "heads.json").read_text())
    assert summary["examples"] == 40  # every dev example
    assert len(summary["selection_frequency"]) == 2 and len(summary["selection_frequency"][0]) == 4
    assert set(summary["selection_frequency_by_class"]) == {"0", "1"}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb" / "valid"))
    events.Reload()
    assert events.Tags()["histograms"] == ["budget_heads/layer0", "budget_heads/layer1"]
    histogram = events.Histograms("budget_heads/layer0")[-1].histogram_value
    # every dev input's heads in layer 0, as heads.json counts them
    assert histogram.num == 40 and histogram.sum / 40 == pytest.approx(summary["mean_heads_per_layer"][0])
    bad = subprocess.run([sys.executable, REPO / "examples" / "budgetformer" / "plot_heads.py", "--checkpoint-dir", tmp_path, "--data",
                          data, "--out-dir", out], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr == f"error: --checkpoint-dir {tmp_path}: no checkpoint_best.pt in it\n"
