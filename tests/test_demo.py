"""scripts/demo.py --quick: the main job end to end, offline, on tiny synthetic data."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, recomputed

spec = importlib.util.spec_from_file_location("demo", REPO / "scripts" / "demo.py")
demo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(demo)


def read_tsv(path):
    header, *rows = path.read_text().splitlines()
    assert header == "sentence\tlabel"
    return [row.split("\t") for row in rows]


def test_the_toy_reviews_are_seeded_balanced_and_labelled_by_their_words(tmp_path):
    first = demo.write_toy_reviews(tmp_path / "a", seed=3)
    again = demo.write_toy_reviews(tmp_path / "b", seed=3)
    other = demo.write_toy_reviews(tmp_path / "c", seed=4)
    for split, n in (("train", 400), ("dev", 60), ("test", 60)):
        rows = read_tsv(first / f"{split}.tsv")
        assert (first / f"{split}.tsv").read_text() == (again / f"{split}.tsv").read_text()
        assert (first / f"{split}.tsv").read_text() != (other / f"{split}.tsv").read_text()
        assert len(rows) == n and sum(label == "1" for _, label in rows) == n // 2
        for sentence, label in rows:
            words = sentence.split()
            praise = sum(w in ("good", "great", "superb", "moving", "charming", "funny") for w in words)
            blame = sum(w in ("bad", "dull", "awful", "boring", "tedious", "weak") for w in words)
            assert (praise > blame) == (label == "1") and praise * blame == 0, sentence


@pytest.mark.slow
def test_quick_demo_runs_offline_end_to_end(tmp_path):
    """The main job's steps on a tiny random BERT: conversion, WordPiece preparation,
    fine-tuning both systems from the converted weights, fairseq-validate, measurement."""
    data, results, checkpoints = tmp_path / "data", tmp_path / "results", tmp_path / "checkpoints"
    offline = dict(os.environ, PIP_NO_INDEX="1", http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9",
                   OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "demo.py"), "--quick", "--epochs", "2", "--data-dir", str(data),
         "--out-dir", str(results), "--save-dir", str(checkpoints)],
        capture_output=True, text=True, timeout=600, env=offline, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the model and data were made, converted and prepared here, nothing fetched
    quick = data / "quick"
    assert sorted(p.name for p in quick.iterdir()) == ["QUICK-bin", "bert", "model", "raw"]
    assert (quick / "model" / "model.pt").is_file() and (quick / "QUICK-bin" / "vocab.txt").is_file()
    assert (quick / "model" / "dict.txt").read_text() == (quick / "QUICK-bin" / "input0" / "dict.txt").read_text()

    report = json.loads((results / "demo.json").read_text())
    rows = report["systems"]
    assert list(rows) == ["dense", "budget"] and report["recipe"]["epochs"] == 2
    for system, row in rows.items():
        assert row["test_examples"] == 60  # every test example, scored once
        assert row["checkpoint"] == str(checkpoints / system / "checkpoint_best.pt") and row["train_wall_s"] > 0
        # the accuracies fairseq-validate reported are the checkpoint's predictions, recomputed here
        assert row["dev_accuracy"] == recomputed(row["checkpoint"], quick / "QUICK-bin", "valid")[0]
        assert row["test_accuracy"] == recomputed(row["checkpoint"], quick / "QUICK-bin", "test")[0]
        assert row["latency_b1_ms"] > 0 and row["latency_b32_ms"] > 0 and row["attn_flops"] > 0
        assert 0 < row["attn_flops"] < row["model_flops"]
    dense, budget = rows["dense"], rows["budget"]
    assert (dense["heads_per_layer"], dense["head_ratio"]) == (4.0, 1.0)
    # BudgetFormer's heads on test: the criterion's mean (validate), the measurement's per layer and the heads
    # each test input runs, counted here, are one number; the head ratio is it over the 4 heads of a layer
    _, selected = recomputed(budget["checkpoint"], quick / "QUICK-bin", "test")
    counted = selected.sum(-1).float()
    assert budget["heads_per_layer_mean"] == pytest.approx(counted.mean(0).tolist(), abs=1e-6)
    assert budget["heads_per_layer_std"] == pytest.approx(counted.std(0).tolist(), abs=1e-6)
    assert budget["heads_per_layer"] == pytest.approx(counted.mean().item(), abs=0.006)
    assert budget["head_ratio"] == pytest.approx(counted.mean().item() / 4, abs=0.0006)

    table = (results / "demo.md").read_text()
    assert table.startswith("| system | dev acc | test acc |") and table.count("\n") == 4
    assert table.strip() in proc.stdout and "step 6/6" in proc.stdout
    usage = json.loads((results / "heads" / "heads.json").read_text())
    assert usage["split"] == "test" and usage["examples"] == 60
    assert usage["mean_heads_per_layer"] == pytest.approx(budget["heads_per_layer_mean"], abs=1e-6)
    for name in ("heads_overall.png", "heads_by_class.png", "budgets.png"):
        assert (results / "heads" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
