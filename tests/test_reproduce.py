"""scripts/reproduce.py --quick on a tiny data set: the accuracy study's pipeline end to
end (five systems, two seeds, fairseq-train and fairseq-validate, analysis, report). Its
accuracies are noise at this size and not asserted; the report's schema and invariants are."""

import json
import math
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, make_classification_data, run

SYSTEMS = {"full", "budget", "no_explore", "static", "random"}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    data = make_classification_data(root / "toy", n_train=160, n_valid=60)
    raw = root / "toy" / "raw"
    for name in ("input0", "label"):  # a test split, binarized with the training dictionaries
        shutil.copy(raw / f"valid.{name}", raw / f"test.{name}")
        run(["fairseq-preprocess", "--only-source", "--testpref", raw / f"test.{name}",
             "--srcdict", data / name / "dict.txt", "--destdir", data / name, "--workers", "1"])
    (root / "data").mkdir()
    (root / "data" / "TOY-bin").symlink_to(data)
    cmd = [sys.executable, REPO / "scripts" / "reproduce.py", "--quick", "--datasets", "TOY", "--seeds", "1", "2",
           "--data-dir", root / "data", "--out-dir", root / "results", "--save-dir", root / "runs"]
    output = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=600)
    assert output.returncode == 0, output.stdout[-3000:] + output.stderr[-3000:]
    report = json.loads((root / "results" / "reproduce.json").read_text())
    return root, cmd, report, output.stdout


def test_every_system_and_seed_is_trained_and_scored_on_every_test_example(study):
    _, _, report, _ = study
    runs = report["runs"]
    assert {(r["system"], r["seed"]) for r in runs} == {(s, seed) for s in SYSTEMS for seed in (1, 2)}
    for r in runs:
        assert r["test_examples"] == 60
        assert 0 <= r["test_accuracy"] <= 100 and 0 <= r["dev_accuracy"] <= 100
        assert r["total_flops"] > 0 and r["attn_flops"] > 0 and r["latency_ms"] > 0 and r["train_wall_s"] > 0


def test_ratios_are_against_full_attention_and_follow_the_heads(study):
    _, _, report, _ = study
    full = {r["seed"]: r for r in report["runs"] if r["system"] == "full"}
    for r in report["runs"]:
        if r["system"] == "full":
            assert r["flops_ratio"] == r["attn_flops_ratio"] == r["latency_ratio"] == 1.0
            assert r["head_ratio"] == 1.0
            continue
        # attention FLOPs are proportional to the heads run, plus a small router
        assert r["attn_flops_ratio"] == pytest.approx(r["head_ratio"], abs=0.08), r
        # everything outside attention (embeddings, FFNs, classifier) costs the same
        stock = full[r["seed"]]
        assert stock["total_flops"] - r["total_flops"] == pytest.approx(stock["attn_flops"] - r["attn_flops"])


def test_fixed_budgets_follow_the_learned_one_of_the_same_seed(study):
    _, _, report, _ = study
    runs = {(r["system"], r["seed"]): r for r in report["runs"]}
    for seed in (1, 2):
        learned = runs["budget", seed]["dev_heads_per_layer"]
        for system in ("static", "random"):
            assert runs[system, seed]["fixed_heads"] == learned
        static = runs["static", seed]["heads_per_layer"]
        assert static == [float(round(h)) for h in learned]  # one subset, same size for every input
        for heads, target in zip(runs["random", seed]["heads_per_layer"], learned):
            assert math.floor(target) <= heads <= math.ceil(target)


def test_summary_spread_targets_and_report(study):
    root, _, report, stdout = study
    summary = report["summary"]["TOY"]
    assert set(summary) == SYSTEMS
    for system, s in summary.items():
        accuracies = [r["test_accuracy"] for r in report["runs"] if r["system"] == system]
        assert s["test_accuracy_mean"] == pytest.approx(sum(accuracies) / 2)
        assert s["seeds"] == 2
    spread = report["budget_spread"]["TOY"]
    assert len(spread["per_layer"]) == 2 and set(spread["per_class"]) == {"pos", "neg"}
    for layer in spread["per_layer"]:
        assert 1 <= layer["min"] <= layer["mean"] <= layer["max"] <= 4 and layer["std"] >= 0
    assert {t["target"].split(" ")[0] for t in report["targets"]} >= {"BudgetFormer", "per-input", "what"}
    assert all(t["held"] in (True, False, None) for t in report["targets"])
    markdown = (root / "results" / "reproduce.md").read_text()
    assert "### TOY" in markdown and "### Targets" in markdown and report["paragraph"] in markdown
    assert report["paragraph"] in stdout
    assert (root / "results" / "reproduce_accuracy_vs_flops.png").stat().st_size > 0


def test_a_second_run_reuses_finished_trainings(study):
    root, cmd, report, _ = study
    records = sorted((root / "runs").glob("TOY/*/seed*/result.json"))
    assert len(records) == 10
    before = [p.stat().st_mtime_ns for p in records]
    output = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=600)
    assert output.returncode == 0, output.stderr[-3000:]
    assert [p.stat().st_mtime_ns for p in records] == before
    again = json.loads((root / "results" / "reproduce.json").read_text())
    assert [r["test_accuracy"] for r in again["runs"]] == [r["test_accuracy"] for r in report["runs"]]


def test_bad_updates_option_names_it(tmp_path):
    cmd = [sys.executable, REPO / "scripts" / "reproduce.py", "--updates", "MR=abc", "--data-dir", tmp_path]
    output = subprocess.run(list(map(str, cmd)), capture_output=True, text=True)
    assert output.returncode != 0 and "--updates" in output.stderr


def test_sweep_chooses_on_dev_reuses_the_study_and_scores_test_once(study):
    """scripts/sweep.py on the same tiny data: the study's BudgetFormer runs are reused
    (not retrained), a new variant is trained, the variant with the best mean dev accuracy
    is the one scored on test, on every example."""
    root, _, report, _ = study
    cmd = [sys.executable, REPO / "scripts" / "sweep.py", "--quick", "--datasets", "TOY",
           "--variants", "default", "temperature_start_1", "--seeds", "1", "2", "--test-seeds", "1", "2",
           "--data-dir", root / "data", "--out-dir", root / "sweep_results", "--save-dir", root / "sweep",
           "--study-dir", root / "runs"]
    output = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=600)
    assert output.returncode == 0, output.stdout[-3000:] + output.stderr[-3000:]
    sweep = json.loads((root / "sweep_results" / "sweep.json").read_text())
    study_runs = {(r["system"], r["seed"]): r for r in report["runs"]}
    runs = {(r["variant"], r["seed"]): r for r in sweep["runs"]}
    for seed in (1, 2):
        assert runs["default", seed]["reused_from_study"]
        assert runs["default", seed]["dev_accuracy"] == study_runs["budget", seed]["dev_accuracy"]
        assert not runs["temperature_start_1", seed]["reused_from_study"]
        assert (root / "sweep" / "TOY" / "temperature_start_1" / f"seed{seed}" / "checkpoint_best.pt").exists()
        assert 0 < runs["temperature_start_1", seed]["dev_head_ratio"] <= 1
    summary = sweep["summary"]["TOY"]
    means = {name: row["dev"][0] for name, row in summary["variants"].items()}
    assert summary["chosen_on_dev"] == max(means, key=means.get)
    tested = sweep["tested"]["TOY"]
    assert [r["variant"] for r in tested] == [summary["chosen_on_dev"]] * 2
    assert all(r["test_examples"] == 60 for r in tested)
    if summary["chosen_on_dev"] == "default":  # reused: the study's own test score
        assert [r["test_accuracy"] for r in tested] == [study_runs["budget", s]["test_accuracy"] for s in (1, 2)]
    assert summary["full_attention"]["seeds"] == [1, 2]
    assert "### TOY" in (root / "sweep_results" / "sweep.md").read_text()
