"""examples/budgetformer/reproduce.py on a tiny random BERT and a toy task: the pretrained-encoder
study's pipeline end to end (eleven runs of one seed: dense, the learned systems at two
budgets, the fixed baselines copying their budgets; fairseq-train and fairseq-validate;
measurement side by side; report). Its accuracies are noise at this size: what is
asserted is that every reported number is the one recomputed from the checkpoints and
records (accuracies, heads, targets, the paragraph), the dependencies between runs, the
caching of finished runs and the single scoring of the test split."""

import contextlib
import importlib.util
import io
import json

import pytest
import torch

from budget_plugin.data.bert_conversion import convert_logged
from budget_plugin.data.prepare import prepare_task
from budget_plugin.nested.importance import kept_heads, kept_heads_option
from budget_plugin.tools.tiny_bert import TINY, write_bert
from budget_research.study import measure as study_measure
from budget_research.study import train as study_train
from budget_research.study.measure import head_sets
from budget_research.study.prepare import prepare
from helpers import REPO, assert_close, recomputed, write_toy_task

N_TEST = 40
LEARNED = ("budget", "distill", "prior")
NAMES = {"dense", "budget-0.5", "distill-0.5", "prior-0.5", "importance-0.5", "static-0.5", "random-0.5",
         "importance-0.3", "static-0.3", "random-0.3"}  # and the learned system chosen for 0.3

spec = importlib.util.spec_from_file_location("reproduce", REPO / "examples" / "budgetformer" / "reproduce.py")
reproduce = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reproduce)


def main_output(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        reproduce.main(list(map(str, argv)))
    return out.getvalue()


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    write_toy_task(root / "raw" / "TOY", sizes=(("train", 320), ("dev", 40), ("test", N_TEST)))
    model = convert_logged(write_bert(root / "bert", dict(TINY, vocab_size=26)), root / "data" / "model",
                             lambda message: None)
    prepare_task(root / "raw" / "TOY", root / "data", layout="SST-2", labelled_test=True, wordpiece=model,
                 log=lambda message: None)
    argv = ["--datasets", "TOY", "--seeds", "1", "--updates", "TOY=8", "--data-dir", root / "data",
            "--out-dir", root / "results", "--save-dir", root / "runs", "--latency-repeats", "1",
            "--latency-batches", "1", "--latency-examples", "2"]
    stdout = main_output(argv)
    report = json.loads((root / "results" / "reproduce.json").read_text())
    return root, argv, report, stdout


def runs_of(report):
    return {r["name"]: r for r in report["runs"]}


def run_recomputed(root, name, split):
    return recomputed(root / "runs" / "TOY" / name / "seed1" / "checkpoint_best.pt", root / "data" / "TOY-bin", split)


@pytest.mark.slow
def test_every_run_is_trained_and_scored_once_on_every_test_example(study):
    root, _, report, _ = study
    runs = runs_of(report)
    chosen = report["choice_at_lower_ratio"]["TOY"]
    assert chosen in LEARNED and set(runs) == NAMES | {f"{chosen}-0.3"}
    for name, r in runs.items():
        assert r["test_examples"] == N_TEST and r["updates"] == 8 and r["seed"] == 1 and r["train_wall_s"] > 0
        if not name.startswith("random"):  # random heads: another draw here
            assert (r["dev_accuracy"], r["test_accuracy"]) == (run_recomputed(root, name, "valid")[0],
                                                               run_recomputed(root, name, "test")[0]), name
        assert (root / "results" / "reproduce" / "TOY" / f"{name}-seed1.json").is_file()
        scored = (root / "runs" / "TOY" / name / "seed1" / "validate.log").read_text()
        assert scored.count("valid on 'test' subset") == 1 and scored.count("valid on 'valid' subset") == 1


@pytest.mark.slow
def test_the_lower_budget_goes_to_the_learned_system_better_on_dev(study):
    _, _, report, _ = study
    runs = runs_of(report)
    dev = [runs[f"{system}-0.5"]["dev_accuracy"] for system in LEARNED]
    assert report["choice_at_lower_ratio"]["TOY"] == LEARNED[dev.index(max(dev))]  # a tie: the first


@pytest.mark.slow
def test_distillation_reads_the_dense_teachers_logits(study):
    root, _, report, _ = study
    assert runs_of(report)["distill-0.5"]["options"][:2] == ["--distill-logits", "TEACHER"]
    teacher = torch.load(root / "runs" / "TOY" / "dense" / "seed1" / "teacher_train.pt", weights_only=True)
    assert teacher.shape == (320, 2)
    assert "distill_loss" in (root / "runs" / "TOY" / "distill-0.5" / "seed1" / "train.log").read_text()


@pytest.mark.slow
def test_the_relevance_prior_is_the_dense_models_head_importance(study):
    root, _, report, _ = study
    importance = json.loads((root / "results" / "reproduce" / "TOY" / "dense-seed1.json").read_text())["importance"]
    option, prior = runs_of(report)["prior-0.5"]["options"]
    assert option == "--relevance-prior"
    parsed = [[float(v) for v in layer.split(",")] for layer in prior.split(";")]
    assert_close(parsed, importance, rtol=0, atol=1e-4)  # the option's 4 decimals, not float rounding


@pytest.mark.slow
def test_fixed_baselines_copy_the_dev_budget_of_the_learned_run_of_their_seed(study):
    root, _, report, _ = study
    runs = runs_of(report)
    importance = torch.tensor(json.loads((root / "results" / "reproduce" / "TOY" / "dense-seed1.json").read_text())
                              ["importance"])
    assert importance.shape == (2, 4)
    for ratio, learned in (("0.5", "budget"), ("0.3", report["choice_at_lower_ratio"]["TOY"])):
        dev_heads = runs[f"{learned}-{ratio}"]["dev_heads_per_layer"]
        _, selected = run_recomputed(root, f"{learned}-{ratio}", "valid")  # what fairseq-validate counted on dev
        assert dev_heads == pytest.approx(selected.sum(-1).float().mean(0).tolist(), abs=0.006)
        for system in ("static", "random"):
            options = runs[f"{system}-{ratio}"]["options"]
            assert options == ["--head-selection", system, "--fixed-heads", ",".join(f"{h:.2f}" for h in dev_heads)]
        counts = [max(1, round(h)) for h in dev_heads]
        kept = kept_heads(importance, counts)
        assert runs[f"importance-{ratio}"]["options"] == ["--head-selection", "kept", "--kept-heads",
                                                         kept_heads_option(kept)]
        # on test, a fixed subset runs the same heads for every input
        assert runs[f"importance-{ratio}"]["heads_per_layer"] == [float(k) for k in counts]
        assert runs[f"static-{ratio}"]["heads_per_layer"] == [float(k) for k in counts]


@pytest.mark.slow
def test_ratios_are_against_dense_of_the_same_seed_and_follow_the_heads(study):
    _, _, report, _ = study
    runs = runs_of(report)
    dense = runs["dense"]
    assert dense["flops_ratio"] == dense["attn_flops_ratio"] == dense["head_ratio"] == 1.0
    assert dense["latency_b1_ratio"] == dense["latency_b32_ratio"] == 1.0
    for name, r in runs.items():
        assert r["latency_b1_ms"] > 0 and r["latency_b32_ms"] > 0
        # everything outside attention (embeddings, FFNs, classifier) costs the same
        assert dense["model_flops"] - r["model_flops"] == pytest.approx(dense["attn_flops"] - r["attn_flops"])
        if name != "dense":  # attention FLOPs follow the heads run, plus a small router
            assert r["attn_flops_ratio"] == pytest.approx(r["head_ratio"], abs=0.1), name


@pytest.mark.slow
def test_summary_spread_targets_plot_and_report(study):
    root, _, report, stdout = study
    summary = report["summary"]["TOY"]
    runs = runs_of(report)
    assert set(summary) == set(runs)
    for name, s in summary.items():
        assert s["seeds"] == [1] and s["test_accuracy_std"] == 0.0 and s["measured_seeds"] == 1
        assert s["test_accuracy_mean"] == runs[name]["test_accuracy"] and s["head_ratio"] == runs[name]["head_ratio"]
    learned = [key for key in report["spread"] if key.split("/")[1].split("-")[0] in LEARNED]
    assert len(learned) == 4 and set(report["spread"]) == set(learned)  # three at 0.5, the chosen one at 0.3
    assert set(report["head_sets"]) == set(report["spread"])
    for key, spread in report["spread"].items():
        assert len(spread["per_layer"]) == 2 and set(spread["per_class"]) == {"pos", "neg"}
        # one seed: its spread and head sets are the run's, as this checkpoint runs its test inputs
        _, selected = run_recomputed(root, key.split("/")[1], "test")
        heads = selected.sum(-1).float()
        for i, layer in enumerate(spread["per_layer"]):
            assert (layer["min"], layer["max"]) == (heads[:, i].min().item(), heads[:, i].max().item())
            assert_close([layer["mean"], layer["std"]], [heads[:, i].mean(), heads[:, i].std()])
            assert layer["mean"] == pytest.approx(runs[key.split("/")[1]]["heads_per_layer"][i])
        importance = json.loads((root / "results" / "reproduce" / "TOY" / "dense-seed1.json").read_text())["importance"]
        for got, want in zip(report["head_sets"][key]["per_layer"], head_sets(selected, importance)):
            assert got.keys() == want.keys() and all(got[k] == pytest.approx(want[k]) for k in want), key
    targets_recomputed(report)
    paragraph = report["paragraph"]
    assert paragraph.startswith(f"{len(runs)} runs finished (1 seeds planned per system)")
    for key, sets in report["head_sets"].items():  # the paragraph's numbers are the head sets' and spreads'
        agree = [layer["importance_agreement"] for layer in sets["per_layer"]]
        stds = ", ".join(f"{layer['std']:.2f}" for layer in report["spread"][key]["per_layer"])
        assert f"their heads agree {min(agree):.2f}-{max(agree):.2f}" in paragraph
        assert f"{key.replace('/', ', ')}: per-input budgets" in paragraph and f"per layer {stds};" in paragraph
    assert len(report["targets"]) == 4  # two budgets, the static baselines, and over all data sets
    markdown = (root / "results" / "reproduce.md").read_text()
    assert "### TOY" in markdown and "### Targets" in markdown and report["paragraph"] in markdown
    assert report["paragraph"] in stdout
    assert (root / "results" / "reproduce_accuracy_vs_flops.png").stat().st_size > 0


def targets_recomputed(report):
    """Each target held or missed as its numbers in the summary say, those numbers in its
    detail and in the paragraph."""
    summary, chosen = report["summary"]["TOY"], report["choice_at_lower_ratio"]["TOY"]
    dense = summary["dense"]
    first, second, beats, over_all = report["targets"]
    for found, ratio, slack in ((first, 0.5, 0.5), (second, 0.3, 1.0)):
        learned = summary[f"{chosen}-{ratio}"]
        gap = learned["test_accuracy_mean"] - dense["test_accuracy_mean"]
        assert found["held"] == (gap >= -slack and learned["head_ratio"] <= ratio + 1e-9)
        assert found["detail"].startswith(f"{learned['test_accuracy_mean']:.2f} vs {dense['test_accuracy_mean']:.2f} "
                                          f"({gap:+.2f} points) at head ratio {learned['head_ratio']:.3f}")
    learned = summary[f"{chosen}-0.3"]
    best = max((summary[f"{system}-0.3"] for system in ("importance", "static", "random")),
               key=lambda s: s["test_accuracy_mean"])
    margin = learned["test_accuracy_mean"] - best["test_accuracy_mean"]
    worse = margin < -learned["test_accuracy_std"]  # one seed: a std of 0
    assert beats["held"] == (margin >= 0.5) and beats["detail"].startswith(f"{margin:+.2f} points over")
    assert beats["detail"].endswith(f"worse by more: {'yes' if worse else 'no'}")
    # one data set: a win of 1 is not 2 of 3
    assert over_all["held"] is False and over_all["detail"] == (f"wins on {int(beats['held'])} of 1; never worse by "
                                                                f"more than a std: {not worse}")
    for t in report["targets"]:
        verdict = {True: "holds", False: "is missed"}[t["held"]]
        assert f"{t['dataset']}: \"{t['target']}\" {verdict} ({t['detail']})." in report["paragraph"]


@pytest.mark.slow
def test_a_second_run_trains_scores_and_measures_nothing(study, monkeypatch):
    root, argv, report, _ = study
    records = sorted((root / "results" / "reproduce" / "TOY").glob("*.json"))
    assert len(records) == 13  # eleven runs, their measurements, the heads the learned ones chose
    before = [p.stat().st_mtime_ns for p in records]

    def refuse(*args, **kwargs):
        raise AssertionError("reproduce.py trained, scored or measured again what is done")

    for module, name in ((study_train, "run_command"), (study_train, "validate"), (study_train, "teacher_logits"),
                         (study_train, "head_importance"), (study_measure, "measure_checkpoints"),
                         (study_measure, "load_checkpoint")):
        monkeypatch.setattr(module, name, refuse)
    main_output(argv)
    assert [p.stat().st_mtime_ns for p in records] == before
    again = json.loads((root / "results" / "reproduce.json").read_text())
    assert again["runs"] == report["runs"]


def test_head_sets_count_the_common_set_and_the_agreement_with_importance():
    # one layer, four heads ranked 0 > 1 > 2 > 3 by importance; four inputs ran
    # {0, 1}, {0, 1}, {0, 2} and {3}
    selected = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.bool)
    (layer,) = head_sets(selected.unsqueeze(1), [[0.4, 0.3, 0.2, 0.1]])
    assert layer["share_at_modal_set"] == 0.5 and layer["distinct_sets"] == 3
    assert layer["use"] == [0.75, 0.5, 0.25, 0.25]
    # the share of each input's k heads among the k most important: 1, 1, 1/2 and 0
    assert layer["importance_agreement"] == pytest.approx(0.625)
    assert layer["chance"] == pytest.approx((3 * 2 / 4 + 1 / 4) / 4)


def test_bad_options_name_what_is_wrong(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        reproduce.main(["--updates", "MR=abc", "--data-dir", str(tmp_path)])
    assert "--updates expects NAME=N" in str(exit_.value)
    with pytest.raises(SystemExit):
        reproduce.main(["--datasets", "TOY", "--data-dir", str(tmp_path)])
    assert "--updates has no number of updates for TOY" in capsys.readouterr().err
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.pt").touch()  # present: nothing is downloaded
    with pytest.raises(SystemExit, match=r"TOY-bin: no binarized data set"):
        cfg, _, _ = reproduce.parse_args(["--datasets", "TOY", "--updates", "TOY=3", "--data-dir", str(tmp_path)])
        prepare(cfg)


@pytest.mark.slow
def test_runs_outside_the_plan_are_shown_apart(study):
    """A record the plan no longer names (here: a learned system at 0.3 that was not
    chosen) is reported in its own table, out of the summary and the targets."""
    root, argv, report, _ = study
    chosen = report["choice_at_lower_ratio"]["TOY"]
    other = next(system for system in LEARNED if system != chosen)
    folder = root / "results" / "reproduce" / "TOY"
    record = dict(json.loads((folder / f"{chosen}-0.3-seed1.json").read_text()), system=other)
    extra = folder / f"{other}-0.3-seed1.json"
    extra.write_text(json.dumps(record))
    try:
        main_output([*argv, "--report-only"])
        again = json.loads((root / "results" / "reproduce.json").read_text())
        assert [(r["system"], r["ratio"]) for r in again["other_runs"]] == [(other, 0.3)]
        assert f"{other}-0.3" not in again["summary"]["TOY"]
        assert "### Runs outside the current plan" in (root / "results" / "reproduce.md").read_text()
    finally:
        extra.unlink()
