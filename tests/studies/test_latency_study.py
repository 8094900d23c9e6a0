"""The latency study's baselines and report: fairseq's AdaPrune (which heads it keeps,
that the pruned model computes only them, that fairseq-validate loads its checkpoint),
and the targets judged from the numbers."""

import copy

import pytest
import torch

from budget_plugin.nested.importance import kept_heads, kept_heads_option
from budget_plugin.tools.building import build_model as build_arch
from budget_research.adaprune import prune_by_magnitude, shape_adaprune_heads
from budget_research.study.latency import kept_counts
from budget_research.study.latency_report import nested_curve, targets
from helpers import HEAD, REPO, assert_close, close, random_tokens, write_toy_task

TINY = dict(encoder_layers=2, encoder_embed_dim=32, encoder_ffn_embed_dim=64, encoder_attention_heads=4)


def tiny_roberta():
    return build_arch("roberta", 50, max_positions=64, num_classes=2, **TINY).eval()


def magnitudes(attention) -> torch.Tensor:
    """Each head's L1 norm over its q, k and v rows and biases, as AdaPrune ranks them."""
    d, H = attention.head_dim, attention.num_heads
    total = torch.zeros(H)
    for proj in (attention.q_proj, attention.k_proj, attention.v_proj):
        total += proj.weight.abs().view(H, d, -1).sum((1, 2)) + proj.bias.abs().view(H, d).sum(1)
    return total


@torch.no_grad()
def test_adaprune_keeps_the_largest_heads_and_computes_only_them():
    model = tiny_roberta()
    for layer in model.encoder.sentence_encoder.layers:  # distinct magnitudes per head
        layer.self_attn.v_proj.weight.mul_(torch.linspace(0.5, 2.0, 32).unsqueeze(1))
    expected = [magnitudes(layer.self_attn).argsort(descending=True)[:2].tolist()
                for layer in model.encoder.sentence_encoder.layers]
    pruned = copy.deepcopy(model)
    assert prune_by_magnitude(pruned, 2) == expected
    # the dense model with the other heads' values zeroed computes the same: their output is 0
    reference = copy.deepcopy(model)
    for layer, kept in zip(reference.encoder.sentence_encoder.layers, expected):
        v, d = layer.self_attn.v_proj, layer.self_attn.head_dim
        for head in set(range(4)) - set(kept):
            v.weight[head * d:(head + 1) * d] = 0
            v.bias[head * d:(head + 1) * d] = 0
    tokens = random_tokens()
    found, _ = pruned(tokens, classification_head_name=HEAD)
    assert_close(found, reference(tokens, classification_head_name=HEAD)[0])
    assert not close(found, model(tokens, classification_head_name=HEAD)[0], atol=1e-3)
    assert [layer.self_attn.q_proj.weight.shape[0] for layer in pruned.encoder.sentence_encoder.layers] == [16, 16]
    # what the task's build_model does for a checkpoint pruned so: the shapes, then its weights load
    rebuilt = tiny_roberta()
    shape_adaprune_heads(rebuilt, 2)
    rebuilt.load_state_dict(pruned.state_dict())
    assert_close(rebuilt(tokens, classification_head_name=HEAD)[0], found)


def test_no_adaprune_leaves_the_model_alone():
    model = tiny_roberta()
    shape_adaprune_heads(model, -1)
    assert [layer.self_attn.num_heads for layer in model.encoder.sentence_encoder.layers] == [4, 4]


def test_kept_counts_read_the_kept_heads_option():
    assert kept_counts(["--head-selection", "kept", "--kept-heads", "0,3,5;1;2,4"]) == [3, 1, 2]


def summary_of(test: dict, b1: dict, seeds=3, std=0.4) -> dict:
    """A summary with the given test means and b1 latency ratios (every other value 0)."""
    def value(mean, spread=0.0):
        return {"mean": mean, "std": spread}

    return {"DS": {name: {"seeds": list(range(seeds)), "test_accuracy": value(acc, std), "dev_accuracy": value(acc),
                          "latency_b1_ratio": value(b1[name]), "latency_b32_ratio": value(b1[name]),
                          "head_ratio": value(0), "flops_ratio": value(0)} for name, acc in test.items()}}


NAMES = ["dense", "importance-0.3", "layers4", "exported @ 0.3", "exported @ 0.2"] + [
    f"{kind} @ {r}" for kind in ("nested", "fixed") for r in ("1", "0.75", "0.5", "0.3", "0.2")]


def study():
    """Test means of 80 everywhere; b1 latency 0.9 of dense but for dense, 4 layers and
    the fastest export."""
    test = {name: 80.0 for name in NAMES}
    b1 = {name: 0.9 for name in NAMES}
    b1.update({"dense": 1.0, "layers4": 0.7, "exported @ 0.2": 0.8})
    return test, b1


def judged(test, b1, seeds=3):
    return {t["target"]: t["held"] for t in targets(summary_of(test, b1, seeds), seeds) if t["dataset"] == "DS"}


def test_targets_are_judged_from_the_means():
    test, b1 = study()
    test.update({"nested @ 0.3": 80.2, "importance-0.3": 80.5, "nested @ 0.5": 79.8, "dense": 80.2,
                 "fixed @ 0.3": 80.3, "layers4": 79.0})
    found = judged(test, b1)
    assert found["nested @ 0.3 >= importance pruning 0.3 - one seed std (0.40)"] is True  # -0.3 > -0.4
    assert found["nested @ 0.5 within 0.3 of dense"] is False  # 0.4 lost
    assert found["per-input >= fixed counts @ 0.3"] is False and found["per-input >= fixed counts @ 0.75"] is True
    # 4 layers run at 0.7 of dense, the fastest nested setting at 0.8: out of reach, so missed
    assert found["nested beats 4 layers at 4 layers' b1 latency"] is False
    b1["exported @ 0.2"] = 0.65
    assert judged(test, b1)["nested beats 4 layers at 4 layers' b1 latency"] is True  # 80.0 > 79.0 at 0.65


def test_targets_wait_for_every_seed_and_data_set():
    test, b1 = study()
    found = targets(summary_of(test, b1, seeds=2), 3)
    assert {t["held"] for t in found} == {None}


def test_the_nested_curve_holds_the_dial_and_the_exports_fastest_first():
    test, b1 = study()
    b1.update({"nested @ 0.2": 0.85, "exported @ 0.2": 0.8})
    curve = nested_curve(summary_of(test, b1)["DS"], "latency_b1_ratio")
    assert [name for _, _, name in curve][:2] == ["exported @ 0.2", "nested @ 0.2"]
    assert not any(name.startswith("fixed") for _, _, name in curve)


def write_records(cfg, heads, layers, rng):
    """What the latency study reads from the accuracy study: the dense run (its head
    importance) and importance pruning at 0.5 and 0.3, under today's recipe."""
    from dataclasses import asdict

    from budget_plugin.tools.files import write_json
    from budget_research.study.plan import Run, recipe_of

    importance = torch.rand(layers, heads, generator=rng)
    for system, ratio in (("dense", None), ("importance", 0.5), ("importance", 0.3)):
        run = Run("TOY", system, 1, ratio)
        record = {"dataset": "TOY", "system": system, "ratio": ratio, "seed": 1, "recipe": asdict(recipe_of(run, cfg)),
                  "dev_accuracy": 70.0, "test_accuracy": 71.0, "finished": "2026-12-05 00:00:00", "options": []}
        if system == "dense":
            record["importance"] = importance.tolist()
        else:
            counts = [round(ratio * heads)] * layers
            record["options"] = ["--head-selection", "kept", "--kept-heads", kept_heads_option(kept_heads(importance, counts))]
        write_json(run.record(cfg), record)


@pytest.mark.slow
def test_the_latency_study_end_to_end_on_a_toy_task(tmp_path):
    """examples/budgetformer/latency_study.py on a toy task and a tiny 6-layer BERT of 10 heads: every
    system trained once, the nested model scored at every dial setting, everything timed
    side by side, and the report written; a second run trains and times nothing."""
    import importlib.util
    import json

    from budget_plugin.data.bert_conversion import convert_logged
    from budget_plugin.data.prepare import prepare_task
    from budget_plugin.tools.tiny_bert import TINY, write_bert
    from budget_research.study.plan import StudyConfig

    write_toy_task(tmp_path / "raw" / "TOY")
    config = dict(TINY, vocab_size=26, num_hidden_layers=6, hidden_size=40, num_attention_heads=10)
    model = convert_logged(write_bert(tmp_path / "bert", config), tmp_path / "data" / "model", lambda m: None)
    prepare_task(tmp_path / "raw" / "TOY", tmp_path / "data", layout="SST-2", labelled_test=True, wordpiece=model,
                 log=lambda m: None)
    cfg = StudyConfig(data_dir=tmp_path / "data", model_dir=tmp_path / "data" / "model", out_dir=tmp_path / "results",
                      save_dir=tmp_path / "runs", datasets=("TOY",), seeds=(1,), updates={"TOY": 4}, jobs=1)
    write_records(cfg, heads=10, layers=6, rng=torch.Generator().manual_seed(0))
    spec = importlib.util.spec_from_file_location("latency_study", REPO / "examples" / "budgetformer" / "latency_study.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    argv = ["--datasets", "TOY", "--seeds", "1", "--updates", "TOY=4", "--data-dir", tmp_path / "data",
            "--out-dir", tmp_path / "results", "--save-dir", tmp_path / "runs", "--latency-repeats", "1",
            "--latency-batches", "1", "--latency-examples", "4"]
    script.main(list(map(str, argv)))
    records = tmp_path / "results" / "reproduce" / "TOY"
    nested = json.loads((records / "nested-seed1.json").read_text())
    assert list(nested["dial_per_input"]) == ["1", "0.75", "0.5", "0.3", "0.2"]
    for ratio, scored in nested["dial_fixed"].items():  # the twin keeps the dial's total heads on dev
        assert sum(scored["counts"]) == round(sum(nested["dial_per_input"][ratio]["valid"]["heads_per_layer"]))
    importance = json.loads((records / "importance-0.2-seed1.json").read_text())
    assert kept_counts(importance["options"]) == nested["dial_fixed"]["0.2"]["counts"]
    # fairseq-train pruned the model as AdaPrune does, and fairseq-validate loaded it through the task
    assert json.loads((records / "adaprune-0.3-seed1.json").read_text())["dev_heads_per_layer"] == [4.0] * 6
    assert "Prune model: keep 4 heads" in (tmp_path / "runs" / "TOY" / "adaprune-0.3" / "seed1" / "train.log").read_text()
    assert json.loads((records / "layers4-seed1.json").read_text())["dev_heads_per_layer"] == [10.0] * 4
    group = json.loads((records / "latency-seed1.json").read_text())
    systems = group["systems"]
    assert set(systems) == {"dense", "importance-0.5", "importance-0.3", "importance-0.2", "adaprune-0.3", "layers4",
                            "exported @ 0.3", "exported @ 0.2"} | {f"{kind} @ {r}" for kind in ("nested", "fixed")
                                                                    for r in ("0.75", "0.5", "0.3", "0.2")} | {"nested @ 1"}
    for ratio in ("0.3", "0.2"):  # the export computes what the dial's fixed counts compute
        assert systems[f"exported @ {ratio}"]["test_accuracy"] == nested["dial_fixed"][ratio]["test"]["accuracy"]
        assert systems[f"exported @ {ratio}"]["heads_per_layer"] == nested["dial_fixed"][ratio]["counts"]
    assert systems["layers4"]["model_flops"] < systems["dense"]["model_flops"]
    report = json.loads((tmp_path / "results" / "latency.json").read_text())
    held = {t["dataset"]: t["held"] for t in report["targets"]}
    assert held["all"] is None  # it needs three data sets; one data set's are judged on the seeds asked for
    report_recomputed(report, (tmp_path / "results" / "latency.md").read_text(), group, nested, records)
    assert (tmp_path / "results" / "latency_TOY.png").is_file()
    before = {p.name: p.stat().st_mtime_ns for p in records.iterdir()}
    script.main(list(map(str, argv)))
    assert {p.name: p.stat().st_mtime_ns for p in records.iterdir()} == before


def report_recomputed(report, markdown, group, nested, records):
    """The latency report's numbers recomputed from what the study recorded: every
    system's accuracies (from the records and the nested model's dial), its head, FLOPs
    and latency ratios (from the side-by-side timing, against dense's), each target held
    or missed as those numbers say, and the table and the paragraph showing them."""
    import json
    import re

    from budget_research.study.latency_report import label

    systems, dense = group["systems"], group["systems"]["dense"]
    summary = report["summary"]["TOY"]
    assert set(summary) == set(systems)
    test, b1 = {}, {}
    for name, measured in systems.items():
        if " @ " in name:
            kind, ratio = name.split(" @ ")
            fixed = nested["dial_fixed"].get(ratio)
            scored = nested["dial_per_input"][ratio] if kind == "nested" else fixed
            dev_accuracy = scored["valid"]["accuracy"]
            test_accuracy = measured["test_accuracy"] if kind == "exported" else scored["test"]["accuracy"]
        else:
            record = json.loads((records / f"{name}-seed1.json").read_text())
            dev_accuracy, test_accuracy = record["dev_accuracy"], record["test_accuracy"]
        values = summary[name]
        assert values["seeds"] == [1], name
        assert (values["dev_accuracy"], values["test_accuracy"]) == (
            {"mean": dev_accuracy, "std": 0.0}, {"mean": test_accuracy, "std": 0.0}), name
        expected = {"head_ratio": sum(measured["heads_per_layer"]) / 60,  # 6 layers of 10 heads
                    "flops_ratio": measured["model_flops"] / dense["model_flops"],
                    "latency_b1_ratio": measured["latency_b1_ms"] / dense["latency_b1_ms"],
                    "latency_b32_ratio": measured["latency_b32_ms"] / dense["latency_b32_ms"]}
        for key, value in expected.items():
            assert values[key]["mean"] == pytest.approx(value), (name, key)
        test[name], b1[name] = test_accuracy, expected["latency_b1_ratio"]
        # the table's row: the same numbers at its precision
        row = re.search(rf"^\| {re.escape(label(name))} \| 1 \| (.*) \|$", markdown, re.M)
        assert row, name
        cells = [float(part.split(" ± ")[0]) for part in row.group(1).split(" | ")]
        shown = [dev_accuracy, test_accuracy, *expected.values()]
        assert cells[:2] == pytest.approx(shown[:2], abs=0.0051) and cells[2:] == pytest.approx(shown[2:], abs=0.00051)
    # the targets, judged here from those numbers (one seed: a std of 0)
    reach = [n for n in systems if n.split(" @ ")[0] in ("nested", "exported") and b1[n] <= b1["layers4"]]
    judged = {
        "nested @ 0.3 >= importance pruning 0.3 - one seed std (0.00)": test["nested @ 0.3"] >= test["importance-0.3"],
        "nested @ 0.5 within 0.3 of dense": test["dense"] - test["nested @ 0.5"] <= 0.3,
        **{f"per-input >= fixed counts @ {r}": test[f"nested @ {r}"] >= test[f"fixed @ {r}"] for r in ("0.75", "0.5", "0.3")},
        "nested beats 4 layers at 4 layers' b1 latency": any(test[n] > test["layers4"] for n in reach),
    }
    found = {t["target"]: t for t in report["targets"] if t["dataset"] == "TOY"}
    assert {name: t["held"] for name, t in found.items()} == judged
    gap = test["nested @ 0.3"] - test["importance-0.3"]
    assert found["nested @ 0.3 >= importance pruning 0.3 - one seed std (0.00)"]["detail"] == (
        f"{gap:+.2f} points ({test['nested @ 0.3']:.2f} vs {test['importance-0.3']:.2f})")
    # the paragraph: the most accurate system at the nested model's latency at 0.3, and
    # the per-input budgets against the fixed counts, by ratio
    at = b1["nested @ 0.3"]
    best = max(test[n] for n in systems if b1[n] <= at)
    found = re.search(r"the nested model at 0\.3 \(([\d.]+) of dense\) the most accurate system is (.+?) "
                      r"\(([\d.]+) test; dense ([\d.]+) at 1\.000\)", report["paragraph"])
    assert found, report["paragraph"]
    assert float(found.group(1)) == pytest.approx(at, abs=0.00051)
    winners = [n for n in systems if label(n) == found.group(2)]
    assert len(winners) == 1 and test[winners[0]] == best and b1[winners[0]] <= at
    assert (float(found.group(3)), float(found.group(4))) == pytest.approx((best, test["dense"]), abs=0.0051)
    diffs = ", ".join(f"{r}: {test[f'nested @ {r}'] - test[f'fixed @ {r}']:+.2f}" for r in ("0.75", "0.5", "0.3", "0.2"))
    assert f"fixed counts, test points by ratio: {diffs};" in report["paragraph"]
    # the nested recipe's dense step against the dense record, at fairseq-validate's rounding
    dense_record = json.loads((records / "dense-seed1.json").read_text())
    same = (round(nested["dense_step"]["valid"], 1), round(nested["dense_step"]["test"], 1)) == (
        dense_record["dev_accuracy"], dense_record["test_accuracy"])
    assert f"equal the record's in {int(same)} of 1 data sets and seeds" in markdown
