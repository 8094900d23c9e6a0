"""scripts/reproduce.py and scripts/sweep.py --quick on a tiny data set: the accuracy
study's pipeline end to end (five systems, fairseq-train and fairseq-validate,
analysis, report), run once with one seed. Its accuracies are noise at this size and
not asserted; the report's schema and invariants, the caching of finished runs and
the single scoring of the test split are."""

import contextlib
import importlib.util
import io
import json
import math
import random

import pytest

from budget_plugin.tools import study as shared
from budget_plugin.tools.prepare import prepare_task
from conftest import REPO
from fairseq import options

SYSTEMS = {"full", "budget", "no_explore", "static", "random"}
N_TEST = 40


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reproduce, sweep = load_script("reproduce"), load_script("sweep")


def write_toy_task(folder, seed=0, sizes=(("train", 320), ("dev", 40), ("test", N_TEST))):
    """SST-2's layout with a labelled test split; the label is which half of the
    vocabulary a sentence mostly draws from."""
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    for split, n in sizes:
        rows = ["sentence\tlabel"]
        for i in range(n):
            label = ("neg", "pos")[i % 2]
            words = [f"w{rng.randrange(10) + (10 if label == 'pos' else 0)}" for _ in range(rng.randint(3, 10))]
            rows.append(f"{' '.join(words)}\t{label}")
        (folder / f"{split}.tsv").write_text("\n".join(rows) + "\n")


def main_output(main, argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(list(map(str, argv)))
    return out.getvalue()


def refuse_to_train_or_score(monkeypatch, script):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{script.__name__}.py trained or scored a run that is done")

    monkeypatch.setattr(script, "fairseq_train", refuse)
    monkeypatch.setattr(script, "validate", refuse)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    write_toy_task(root / "raw" / "TOY")
    prepare_task(root / "raw" / "TOY", root / "data", layout="SST-2", labelled_test=True, vocab_size=100,
                 log=lambda message: None)
    # 3 at a time on 2 cores: a tiny training is mostly fairseq's start-up, and the fixed
    # budgets wait for the learned one
    argv = ["--quick", "--datasets", "TOY", "--seeds", "1", "--jobs", "3", "--data-dir", root / "data",
            "--out-dir", root / "results", "--save-dir", root / "runs"]
    stdout = main_output(reproduce.main, argv)
    report = json.loads((root / "results" / "reproduce.json").read_text())
    return root, argv, report, stdout


@pytest.mark.slow
def test_every_system_is_trained_and_scored_once_on_every_test_example(study):
    root, _, report, _ = study
    runs = report["runs"]
    assert {(r["system"], r["seed"]) for r in runs} == {(s, 1) for s in SYSTEMS}
    for r in runs:
        assert r["test_examples"] == N_TEST and r["updates"] == 20
        assert 0 <= r["test_accuracy"] <= 100 and 0 <= r["dev_accuracy"] <= 100
        assert r["total_flops"] > 0 and r["attn_flops"] > 0 and r["latency_ms"] > 0 and r["train_wall_s"] > 0
        # fairseq-validate scored test once (and dev for budget: its heads set the fixed budgets)
        scored = (root / "runs" / "TOY" / r["system"] / "seed1" / "validate.log").read_text()
        assert scored.count("valid on 'test' subset") == 1
        assert scored.count("valid on 'valid' subset") == (r["system"] == "budget")


@pytest.mark.slow
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


@pytest.mark.slow
def test_fixed_budgets_follow_the_learned_one_of_the_same_seed(study):
    _, _, report, _ = study
    runs = {r["system"]: r for r in report["runs"]}
    learned = runs["budget"]["dev_heads_per_layer"]
    assert len(learned) == 2 and all(1 <= h <= 4 for h in learned)
    for system in ("static", "random"):
        assert runs[system]["fixed_heads"] == learned
    assert runs["static"]["heads_per_layer"] == [float(round(h)) for h in learned]  # one subset for every input
    for heads, target in zip(runs["random"]["heads_per_layer"], learned):
        assert math.floor(target) <= heads <= math.ceil(target)


@pytest.mark.slow
def test_summary_spread_targets_and_report(study):
    root, _, report, stdout = study
    summary = report["summary"]["TOY"]
    runs = {r["system"]: r for r in report["runs"]}
    assert set(summary) == SYSTEMS
    for system, s in summary.items():
        assert s["seeds"] == 1 and s["test_accuracy_std"] == 0.0
        assert s["test_accuracy_mean"] == runs[system]["test_accuracy"]
        assert s["head_ratio"] == runs[system]["head_ratio"]
    spread = report["budget_spread"]["TOY"]
    assert len(spread["per_layer"]) == 2 and set(spread["per_class"]) == {"pos", "neg"}
    for layer in spread["per_layer"]:
        assert 1 <= layer["min"] <= layer["mean"] <= layer["max"] <= 4 and layer["std"] >= 0
    assert {t["target"].split(" ")[0] for t in report["targets"]} == {"BudgetFormer", "per-input", "what"}
    assert all(t["held"] in (True, False, None) for t in report["targets"])
    assert report["config"]["size"] == "budgetformer_tiny" and report["config"]["updates"] == {"TOY": 20}
    markdown = (root / "results" / "reproduce.md").read_text()
    assert "### TOY" in markdown and "### Targets" in markdown and report["paragraph"] in markdown
    assert report["paragraph"] in stdout
    assert (root / "results" / "reproduce_accuracy_vs_flops.png").stat().st_size > 0


@pytest.mark.slow
def test_a_second_run_trains_and_scores_nothing(study, monkeypatch):
    root, argv, report, _ = study
    records = sorted((root / "runs").glob("TOY/*/seed*/result.json"))
    assert len(records) == len(SYSTEMS)
    before = [p.stat().st_mtime_ns for p in records]
    refuse_to_train_or_score(monkeypatch, reproduce)
    main_output(reproduce.main, argv)
    assert [p.stat().st_mtime_ns for p in records] == before
    again = json.loads((root / "results" / "reproduce.json").read_text())
    assert [r["test_accuracy"] for r in again["runs"]] == [r["test_accuracy"] for r in report["runs"]]


def parse_training(model_args):
    """fairseq-train's options as it parses them, without running it."""
    recipe = shared.train_command(REPO / "data", REPO / "checkpoints", lr=5e-4, updates=100, seed=1)[1:]
    return options.parse_args_and_arch(options.get_training_parser(), list(map(str, [*recipe, *model_args])))


@pytest.mark.parametrize("system", sorted(SYSTEMS))
def test_every_system_is_a_command_line_fairseq_train_accepts(system):
    parsed = parse_training(shared.system_args(system, 100, quick=False, fixed_heads=[2.5, 3.0, 4.0, 3.5]))
    assert parsed.encoder_layers == 4 and parsed.encoder_attention_heads == 8  # budgetformer_small's size
    if system == "full":
        assert parsed.arch == "roberta" and parsed.task == "sentence_prediction"
    else:
        assert parsed.arch == "budgetformer_small" and parsed.criterion == "budget_sentence_prediction"
        assert parsed.exploration_updates == (0 if system == "no_explore" else 40)
        assert parsed.head_selection == (system if system in ("static", "random") else "learned")


@pytest.mark.parametrize("name", list(sweep.VARIANTS))
def test_every_sweep_variant_is_a_command_line_fairseq_train_accepts(name):
    variant = sweep.VARIANTS[name]
    model_args = [*shared.system_args("budget", 100, quick=True, exploration_share=variant.exploration_share),
                  *variant.args]
    parsed = parse_training(model_args)
    assert parsed.exploration_updates == int(100 * variant.exploration_share)
    for option, value in zip(variant.args[::2], variant.args[1::2]):  # the change it names took effect
        parsed_value = getattr(parsed, option[2:].replace("-", "_"))
        assert parsed_value == type(parsed_value)(value), (option, parsed_value)


def test_bad_updates_option_names_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        reproduce.main(["--updates", "MR=abc", "--data-dir", str(tmp_path)])
    assert "--updates expects NAME=N" in str(exit_.value)
    with pytest.raises(SystemExit):
        reproduce.main(["--datasets", "TOY", "--data-dir", str(tmp_path)])
    assert "--updates has no number of updates for TOY" in capsys.readouterr().err


@pytest.mark.slow
def test_sweep_reuses_the_study_chooses_on_dev_and_reports_its_test_score(study, monkeypatch):
    """scripts/sweep.py on the same tiny data, with the two variants the study has
    trained: both are reused (nothing is trained or scored again), the one with the
    best dev accuracy is chosen, and its test score is the study's."""
    root, _, report, _ = study
    refuse_to_train_or_score(monkeypatch, sweep)
    argv = ["--quick", "--datasets", "TOY", "--variants", "default", "no_explore", "--seeds", "1",
            "--test-seeds", "1", "--data-dir", root / "data", "--out-dir", root / "sweep_results",
            "--save-dir", root / "sweep", "--study-dir", root / "runs"]
    main_output(sweep.main, argv)
    result = json.loads((root / "sweep_results" / "sweep.json").read_text())
    study_runs = {r["system"]: r for r in report["runs"]}
    runs = {r["variant"]: r for r in result["runs"]}
    for variant, system in (("default", "budget"), ("no_explore", "no_explore")):
        assert runs[variant]["reused_from_study"] and runs[variant]["seed"] == 1
        assert runs[variant]["dev_accuracy"] == study_runs[system]["dev_accuracy"]
        assert runs[variant]["checkpoint_dir"] == str(root / "runs" / "TOY" / system / "seed1")
        assert 0 < runs[variant]["dev_head_ratio"] <= 1 and len(runs[variant]["dev_heads_per_layer"]) == 2
    summary = result["summary"]["TOY"]
    means = {name: row["dev"][0] for name, row in summary["variants"].items()}
    assert summary["chosen_on_dev"] == max(means, key=means.get)
    [tested] = result["tested"]["TOY"]
    chosen = {"default": "budget", "no_explore": "no_explore"}[summary["chosen_on_dev"]]
    assert tested["variant"] == summary["chosen_on_dev"] and tested["test_examples"] == N_TEST
    assert tested["test_accuracy"] == study_runs[chosen]["test_accuracy"]
    assert summary["full_attention"] == {"seeds": [1], "dev": [round(study_runs["full"]["dev_accuracy"], 2), 0.0],
                                         "test": [round(study_runs["full"]["test_accuracy"], 2), 0.0]}
    assert "### TOY" in (root / "sweep_results" / "sweep.md").read_text()
