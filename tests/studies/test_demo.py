"""examples/budgetformer/demo.py --quick: the main job end to end, offline, on tiny synthetic data (the
width chosen on dev, exported to ONNX Runtime and served without torch); then, on its
checkpoints, what a user runs next: scripts/finetune.py (which resumes: every step is
done), fairseq-validate --head-ratio and --width, scripts/export_pruned.py,
scripts/predict.py --head-ratio and examples/budgetformer/benchmark.py --data."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from budget_plugin.dial.width import WIDTHS
from helpers import PLUGIN_DIR, REPO, parse_metrics, program_of, python_script, run

spec = importlib.util.spec_from_file_location("demo", REPO / "examples" / "budgetformer" / "demo.py")
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


def script(name, *args, stdin=None, env=None):
    env = dict(env or os.environ, OMP_NUM_THREADS="1")
    folder = "examples/budgetformer" if name in ("demo.py", "benchmark.py") else "scripts"
    # forked from the tests' server, which has imported torch and fairseq (forked_tools.py)
    proc = subprocess.run([*python_script(REPO / folder / name), *map(str, args)], capture_output=True,
                          text=True, env=env, input=stdin, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def summary_rows(output: str) -> dict:
    """budget-finetune's width summary: {name: (marked as the pick, [dev acc, int8 b1 ms,
    x dense, int8 b32 ms, x dense])}."""
    return {line[3:15].strip(): (line[:2] == "->", [float(x) for x in line[15:].split()])
            for line in output.splitlines() if line[3:15].strip().startswith(("dense", "width "))}


def validate(checkpoint, data, *extra):
    output = run(["fairseq-validate", data, "--user-dir", PLUGIN_DIR, "--path", checkpoint,
                  "--task", "budget_sentence_prediction", "--criterion", "budget_sentence_prediction",
                  "--valid-subset", "valid", "--batch-size", 16, "--cpu", "--num-workers", 0, *extra])
    return parse_metrics([line for line in output.splitlines() if "valid on 'valid' subset" in line][-1])


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """The quick demo's run, offline: (its output, data root, results, checkpoints)."""
    root = tmp_path_factory.mktemp("demo")
    data, results, checkpoints = root / "data", root / "results", root / "checkpoints"
    offline = dict(os.environ, PIP_NO_INDEX="1", http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9")
    output = script("demo.py", "--quick", "--epochs", "2", "--data-dir", data, "--out-dir", results,
                    "--save-dir", checkpoints, env=offline)
    return output, data / "quick", results, checkpoints


@pytest.mark.slow
def test_quick_demo_runs_offline_end_to_end(quick):
    """The main job's steps on a tiny random BERT: conversion, WordPiece preparation, the
    nested recipe, the width chosen on dev and exported (fairseq and ONNX Runtime, int8),
    every system measured side by side, the export served by budget-predict --onnx, the
    table and pictures."""
    output, root, results, checkpoints = quick
    # the model and data were made, converted and prepared here, nothing fetched
    assert sorted(p.name for p in root.iterdir()) == ["QUICK-bin", "bert", "model", "raw"]
    assert (root / "model" / "dict.txt").read_text() == (root / "QUICK-bin" / "input0" / "dict.txt").read_text()
    for step in [f"step {i}/6" for i in range(1, 7)] + ["recipe 1/5", "recipe 5/5", "dense: $ fairseq-train",
                                                         "nested: $ fairseq-train", "valid on 'valid'"]:
        assert step in output, step

    report = json.loads((results / "demo.json").read_text())
    rows, width = report["systems"], report["width"]
    # the width: budget-finetune's pick, the fastest int8 export at batch 1 within 1.0 point of dense
    # on dev (its summary printed), each width's dev accuracy the recipe's own
    allocation = json.loads((checkpoints / "nested" / "calibration.json").read_text())["allocation"]
    scored_widths = allocation["widths"][allocation["chosen"]]
    summary = summary_rows(output)
    assert set(summary) == {"dense", *(f"width {w}" for w in scored_widths)}
    assert all(summary[f"width {w}"][1][0] == pytest.approx(row["accuracy"], abs=0.005)
               for w, row in scored_widths.items())
    within = [n for n, (_, v) in summary.items() if n != "dense" and v[0] >= summary["dense"][1][0] - 1.0]
    picked = [n for n, (marked, _) in summary.items() if marked]
    assert picked == ([min(within, key=lambda n: summary[n][1][1])] if within else [])
    assert width == (picked[0].split()[-1] if picked else "1")
    # the frontier: dense in each runtime and every width the recipe scored in eager, ONNX Runtime
    # and its int8, measured once (the pick's latencies are the table's)
    runtimes = ("eager", "ONNX Runtime", "ONNX Runtime int8")
    assert sorted(rows) == sorted(["dense, eager int8", *(f"{s}, {r}" for s in ("dense", *summary) if s != "dense"
                                                           for r in runtimes), *(f"dense, {r}" for r in runtimes)])
    for name, row in rows.items():
        assert row["latency_b1_ms"] > 0 and row["latency_b32_ms"] > 0
        assert (row["rounds_b1"], row["rounds_b32"]) == (1, 1)  # --quick: one round
    for name, (_, values) in summary.items():
        assert values[1] == pytest.approx(rows[f"{name}, ONNX Runtime int8"]["latency_b1_ms"], abs=0.006)
    assert set(report["parts_s"]) == {"recipe", "exports", "measurement", "cut and fairseq-validate", "served"}
    # fairseq-validate's accuracies (every test example, scored once) are the measured ones, and the
    # fp32 ONNX graphs predict what their fairseq models predict
    assert list(report["fairseq_validate"]) == [f"width {width}"]  # the cut; dense's is the eager row
    for system, checked in report["fairseq_validate"].items():
        assert checked["test_examples"] == 60
        for split in ("dev", "test"):
            assert rows[f"{system}, eager"][f"{split}_accuracy"] == pytest.approx(checked[f"{split}_accuracy"],
                                                                                  abs=0.05)  # fairseq rounds
            assert rows[f"{system}, ONNX Runtime"][f"{split}_accuracy"] == \
                rows[f"{system}, eager"][f"{split}_accuracy"]
    exports = report["exports"]
    assert all(e["checked_on"]["max_abs_logit_difference"]["fp32"] < 1e-4 for e in exports.values())
    assert exports["dense"]["model_flops_ratio"] == 1.0
    assert exports[f"width {width}"]["model_flops_ratio"] == pytest.approx(float(width), abs=0.05)
    exported = checkpoints / "exported" / "checkpoint_pruned.pt"
    assert exported.stat().st_size < (checkpoints / "nested" / "checkpoint_best.pt").stat().st_size
    # served: budget-predict --onnx's TSV, a label for each text
    assert "line\tlabel\tprobability\theads_per_layer\tselected_heads" in output
    served = (checkpoints / "served.tsv").read_text().splitlines()
    assert len(served) == 3 and all(row.split("\t")[1] in ("0", "1") for row in served[1:])

    table = (results / "demo.md").read_text()
    assert table.startswith("| system | dev acc | test acc |") and table.count("\n") == 2 + len(rows)
    assert table.strip() in output
    usage = json.loads((results / "heads" / "heads.json").read_text())
    assert usage["split"] == "test" and usage["examples"] == 60
    for name in ("demo_accuracy_vs_latency.png", "heads/heads_overall.png", "heads/heads_by_class.png",
                 "heads/budgets.png"):
        assert (results / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


@pytest.mark.slow
def test_a_user_dials_exports_and_predicts_with_the_demos_model(quick):
    _, root, _, checkpoints = quick
    data, model = root / "QUICK-bin", root / "model"
    nested = checkpoints / "nested" / "checkpoint_best.pt"
    trained = nested.read_bytes()
    # the demo's options again (its --log-interval is not recorded: it changes nothing trained)
    again = script("finetune.py", model, data, checkpoints, "--min-heads", 1, "--epochs", 2, "--min-updates", 0, "--cpu")
    assert again.count("done before, with the same options") == 5 and "$ fairseq-train" not in again
    assert nested.read_bytes() == trained
    # other options are refused, naming the first step they change; nothing is touched
    refused = subprocess.run(program_of([sys.executable, REPO / "scripts" / "finetune.py", model, data, checkpoints,
                                         "--min-heads", 1, "--epochs", 2, "--min-updates", 0, "--cpu", "--lr", "3e-4"]),
                             capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert refused.returncode == 2 and "$ fairseq-train" not in refused.stdout
    assert f"error: {checkpoints}: its dense step was run with other options: --lr 0.0001 (now 0.0003)" in \
        refused.stderr and "--redo" in refused.stderr, refused.stderr[-2000:]
    assert nested.read_bytes() == trained
    assert "dev accuracy: dense " in again and "(head ratio 0.500)" in again
    # the summary: each width's ONNX Runtime int8 export timed beside dense's, the pick marked
    rows = summary_rows(again)
    assert set(rows) == {"dense", *(f"width {w}" for w in WIDTHS)}
    assert all(len(values) == 5 and values[1] > 0 and values[3] > 0 for _, values in rows.values())
    assert rows["dense"][1][2] == rows["dense"][1][4] == 1.0  # the ratios' anchor
    within = [n for n, (_, v) in rows.items() if n != "dense" and v[0] >= rows["dense"][1][0] - 1.0]
    assert [n for n, (marked, _) in rows.items() if marked] == \
        ([min(within, key=lambda n: rows[n][1][1])] if within else [])
    assert all((checkpoints / "onnx" / n.replace(" ", "-") / "model.int8.onnx").is_file() for n in rows)
    assert "width_loss" in (checkpoints / "nested" / "train.log").read_text(), "the sandwich trained every width"
    order = json.loads((checkpoints / "order.json").read_text())
    importance = torch.tensor(json.loads((checkpoints / "importance.json").read_text()))
    assert all(sorted(layer) == list(range(4)) and importance[i, layer[0]] == importance[i].max()
               for i, layer in enumerate(order))

    router = [k for k in torch.load(nested, weights_only=True)["model"] if ".router." in k]
    assert router and all(".budget_proj." in k for k in router), "a budget predictor, no relevance"
    dialled = validate(nested, data, "--head-ratio", "0.4")  # between two calibrated ratios
    assert dialled["head_ratio"] == pytest.approx(0.4, abs=0.02) and dialled["bsz"] == 60
    fixed = validate(nested, data, "--head-ratio", "1,3")
    assert (fixed["heads_l0"], fixed["heads_l1"]) == (1, 3)

    script("export_pruned.py", nested, root / "export", "--head-ratio", "1,3")
    pruned = validate(root / "export" / "checkpoint_pruned.pt", data)
    assert (pruned["heads_l0"], pruned["heads_l1"]) == (1, 3)
    assert pruned["accuracy"] == fixed["accuracy"] and pruned["loss"] == pytest.approx(fixed["loss"], abs=2e-3)

    # the width dial: its allocation chosen on dev, run by fairseq-validate, exported
    allocation = json.loads((checkpoints / "nested" / "calibration.json").read_text())["allocation"]
    assert allocation["chosen"] in ("uniform", "importance") and sorted(allocation["widths"]) == ["importance",
                                                                                                  "uniform"]
    stored = torch.load(nested, weights_only=True)["model"]["head_priority"]
    assert (stored.numel() > 0) == (allocation["chosen"] == "importance")
    width = validate(nested, data, "--width", "0.5")
    chosen = allocation["widths"][allocation["chosen"]]["0.5"]["width"]  # heads:neurons per layer
    assert [width["heads_l0"], width["heads_l1"]] == [int(pair.split(":")[0]) for pair in chosen.split(",")]
    assert width["neurons"] == pytest.approx(sum(int(pair.split(":")[1]) for pair in chosen.split(",")) / 2, abs=0.1)
    assert width["model_flops_ratio"] < 0.7
    script("export_pruned.py", nested, root / "export-width", "--width", "0.5")
    cut = validate(root / "export-width" / "checkpoint_pruned.pt", data)
    assert (cut["heads_l0"], cut["heads_l1"], cut["neurons"]) == (width["heads_l0"], width["heads_l1"],
                                                                 width["neurons"])
    assert cut["accuracy"] == width["accuracy"] and cut["loss"] == pytest.approx(width["loss"], abs=2e-3)

    predictions = script("predict.py", "--checkpoint-dir", checkpoints / "nested", "--data", data,
                         "--head-ratio", "1,3", stdin="a great and moving film .\nthe plot was dull .\n")
    rows = [line.split("\t") for line in predictions.splitlines()[1:]]
    assert [row[3] for row in rows] == ["1,3", "1,3"]

    script("benchmark.py", "--checkpoint", nested, "--data", data, "--dial", "1", "0.5", "--repeats", 1,
           "--threads", 1, "--json", root / "dial.json", "--markdown", root / "dial.md")
    report = json.loads((root / "dial.json").read_text())["systems"]
    assert sorted(report) == ["dense", "fixed @ 0.5", "nested @ 0.5", "nested @ 1", "pruned @ 0.5"]
    assert report["nested @ 1"]["head_ratio"] == 1
    for key in ("heads_per_layer", "head_ratio", "model_flops"):  # the same budget, with and without the weights
        assert report["fixed @ 0.5"][key] == report["pruned @ 0.5"][key], key


@pytest.mark.slow
def test_no_router_trains_the_widths_alone_from_the_same_dense_step(quick, tmp_path):
    """budget-finetune --no-router on a copy of the demo's SAVE_DIR: refused as a change
    of the nested step; with --redo, the dense step and the order are kept, the nested
    step trains the fixed widths only (--no-router-pass) and the last step chooses the
    width dial's allocation without calibrating a head dial; the summary dials widths only."""
    _, root, _, checkpoints = quick
    save = tmp_path / "save"
    shutil.copytree(checkpoints, save, ignore=shutil.ignore_patterns("onnx", "exported"))
    record = save / "recipe.json"  # the steps' commands name their SAVE_DIR: the copy's
    record.write_text(record.read_text().replace(str(checkpoints), str(save)))
    dense = (save / "dense" / "checkpoint_best.pt").read_bytes()
    options = [root / "model", root / "QUICK-bin", save, "--min-heads", 1, "--epochs", 2, "--min-updates", 0, "--cpu", "--no-router",
               "--no-latency"]
    refused = subprocess.run(program_of([sys.executable, REPO / "scripts" / "finetune.py", *options]),
                             capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert refused.returncode == 2 and "its nested step was run with other options: --no-router-pass" in \
        refused.stderr, refused.stderr[-2000:]
    output = script("finetune.py", *options, "--redo")
    assert output.count("done before, with the same options") == 3  # dense, importance, reorder
    assert "each trains 3 fixed widths" in output and "the router's budgets" not in output
    assert "recipe 5/5: the width dial's allocation chosen on dev" in output
    assert "head ratio" not in output and "--head-ratio" not in output and "dev accuracy: nested --width" in output
    assert (save / "dense" / "checkpoint_best.pt").read_bytes() == dense
    command = json.loads((save / "nested" / "done.json").read_text())["command"]
    assert "--no-router-pass" in command
    record = json.loads((save / "nested" / "calibration.json").read_text())
    assert record["table"] is None and record["allocation"]["chosen"] in ("uniform", "importance")
    assert "dial_calibration" not in torch.load(save / "nested" / "checkpoint_best.pt", weights_only=True)


@pytest.mark.slow
def test_the_studys_baselines_are_the_demos_dense_model_cut_and_trained_alone(quick, monkeypatch):
    """examples/budgetformer/budget_research/per_width.py on the demo's SAVE_DIR: the model
    fine-tuned for width 0.5 alone starts from the reordered dense model cut to the nested
    model's shape at 0.5 and trains with the dense step's command; the layers' baseline
    keeps the first two thirds of the layers; both serve, and neither trains twice."""
    from budget_plugin.nested.export import export_width
    from budget_plugin.tools.checkpoints import model_options, read
    from budget_research import per_width

    _, root, _, checkpoints = quick
    found = per_width.train_baselines(checkpoints, ["0.5"], log=lambda _: None, threads=1)
    assert list(found) == ["width 0.5 alone", "4 of 6 layers"]
    cut = export_width(read(checkpoints / "nested" / "checkpoint_best.pt"), "0.5")
    alone = model_options(read(found["width 0.5 alone"]))
    assert (alone.head_selection, alone.fixed_heads, alone.ffn_neurons) == \
        ("pruned", ",".join(map(str, cut.heads)), ",".join(map(str, cut.neurons)))
    start = read(found["width 0.5 alone"].parent / "start.pt")["model"]
    reordered = read(checkpoints / "reordered.pt")["model"]
    for layer, neurons in enumerate(cut.neurons):  # the most important neurons: a prefix of the reordered model's
        key = f"encoder.sentence_encoder.layers.{layer}.fc1.weight"
        assert torch.equal(start[key], reordered[key][:neurons])
    dense_command = json.loads((checkpoints / "recipe.json").read_text())["dense"]
    for name, path in found.items():
        command = json.loads((path.parent / "done.json").read_text())["command"]
        for flag in ("--max-update", "--lr", "--seed", "--max-epoch"):
            assert command[command.index(flag) + 1] == dense_command[dense_command.index(flag) + 1], (name, flag)
    layers = read(found["4 of 6 layers"])
    assert model_options(layers).encoder_layers == 1  # the tiny model's 2 layers x 2/3
    assert {k.split(".")[3] for k in layers["model"] if ".layers." in k} == {"0"}
    trained = read(found["width 0.5 alone"])["model"]
    assert [trained[f"encoder.sentence_encoder.layers.{i}.fc1.weight"].size(0) for i in range(len(cut.heads))] == \
        list(cut.neurons)
    for path in found.values():  # fairseq-validate serves them
        assert validate(path, root / "QUICK-bin")["bsz"] == 60

    def trained_again(*args):
        raise AssertionError("a finished baseline was trained again")

    monkeypatch.setattr(per_width, "train_step", trained_again)
    assert per_width.train_baselines(checkpoints, ["0.5"], log=lambda _: None) == found
