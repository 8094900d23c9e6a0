"""Serving on ONNX Runtime: the plain module equals fairseq's model (cut or whole, post- or
pre-norm, padded batches); its ONNX graph equals it at any batch and length; and end to
end on a WordPiece pair task: budget-export-onnx at a width (with int8) checked against
the dialled model, and budget-predict --onnx with torch and fairseq unimportable printing
what the fairseq path prints."""

import json
import os
import shutil
import subprocess
import sys
from collections import Counter

import pytest
import torch

from budget_plugin.nested.export import pruned_checkpoint
from budget_plugin.serving.onnx_export import export_graph, layers_flops_ratio
from budget_plugin.serving.plain_model import PlainClassifier
from budget_plugin.tools.checkpoints import as_budgetformer
from budget_serve.predictor import session
from helpers import (
    HEAD,
    PAIRS,
    REPO,
    assert_close,
    build_model,
    pair_task_training,
    program_of,
    random_tokens,
    run,
    wordpiece_pair_task,
)

# ONNX Runtime's kernels (fused, in their own order) against torch's, in float32
ONNX_RTOL = 1e-4


def checkpoint_state(model) -> dict:
    return {"model": model.state_dict(), "cfg": {"model": model.args}}


def cut_model(heads, neurons, **options):
    """A tiny nested BudgetFormer (2 layers, 4 heads, FFN 64) with random weights, cut
    physically to ``heads`` and ``neurons`` per layer, as the fairseq model it loads as."""
    model = build_model(num_classes=3, head_selection="nested", min_heads=1, **options)
    with torch.no_grad():  # LayerNorms and biases away from their initial 1 and 0: every weight matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return as_budgetformer(pruned_checkpoint(checkpoint_state(model), heads, neurons))


@pytest.mark.parametrize("options", [{}, {"encoder_normalize_before": True}, {"no_scale_embedding": False}])
@pytest.mark.parametrize("heads,neurons", [([4, 4], [64, 64]), ([3, 1], [40, 17])])
def test_the_plain_module_computes_what_fairseq_computes(heads, neurons, options):
    model = cut_model(heads, neurons, **options)
    plain = PlainClassifier(model, HEAD)
    assert plain.heads == heads and plain.neurons == neurons
    tokens = random_tokens()  # padded examples of 12, 9, 5, 12, 2 and 7 tokens
    with torch.no_grad():
        expected = model(tokens, classification_head_name=HEAD)[0]
        assert_close(plain(tokens), expected)
        # an example's logits do not depend on the padding around it
        assert_close(plain(tokens[4:5, :2]), expected[4:5])


def test_the_onnx_graph_equals_the_model_at_other_batches_and_lengths(tmp_path):
    model = cut_model([3, 2], [48, 33])
    plain = PlainClassifier(model, HEAD)
    export_graph(plain, random_tokens(batch=2, length=7, pad_lengths=(7, 4)), tmp_path / "model.onnx")
    runtime = session(tmp_path / "model.onnx", threads=1)
    for batch, length in ((6, 12), (1, 3), (3, 40)):
        tokens = random_tokens(batch=batch, length=length, pad_lengths=(length, 2, length // 2)[:batch])
        with torch.no_grad():
            expected = model(tokens, classification_head_name=HEAD)[0].numpy()
        found = runtime.run(None, {"tokens": tokens.numpy()})[0]
        assert_close(found, expected, rtol=ONNX_RTOL)


def optimized_ops(graph, out, **session_options) -> Counter:
    """The operators of ``graph`` once ONNX Runtime's CPU session has optimized it."""
    import onnx
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(out)
    options.intra_op_num_threads = 1
    if session_options:
        onnxruntime.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"], **session_options)
    else:
        session(graph, options=options)
    return Counter(node.op_type for node in onnx.load(str(out)).graph.node)


def test_the_served_graph_fuses_gelu_and_keeps_layer_norms_apart(tmp_path):
    """GELU is written in the order ONNX Runtime fuses into one op, and budget_serve's CPU
    session leaves each residual Add + LayerNormalization as written (the runtime's
    SkipLayerNormalization kernel is the slower on the CPU), which a plain session fuses."""
    plain = PlainClassifier(cut_model([3, 2], [48, 33]), HEAD)
    export_graph(plain, random_tokens(batch=2, length=7, pad_lengths=(7, 4)), tmp_path / "model.onnx")
    served = optimized_ops(tmp_path / "model.onnx", tmp_path / "served.onnx")
    assert served["Erf"] == 0 and served["BiasGelu"] + served["Gelu"] == len(plain.layers)
    assert served["SkipLayerNormalization"] == 0
    assert served["LayerNormalization"] == 1 + 2 * len(plain.layers)  # the embeddings', then two a layer
    fused = optimized_ops(tmp_path / "model.onnx", tmp_path / "fused.onnx", disabled_optimizers=[])
    assert fused["SkipLayerNormalization"] == 1 + 2 * len(plain.layers)  # each follows an Add


def test_the_flops_ratio_of_a_cut_counts_heads_and_neurons():
    args = build_model(num_classes=2).args
    H, F, C, T = args.encoder_attention_heads, args.encoder_ffn_embed_dim, args.encoder_embed_dim, 10.0
    assert layers_flops_ratio([H, H], [F, F], args, T) == pytest.approx(1.0)
    d = C // H
    head, neuron = 8 * T * C * d + 4 * T * T * d, 4 * T * C  # q/k/v/out and the scores; fc1 and fc2
    full = H * head + F * neuron
    assert layers_flops_ratio([2, 1], [32, 16], args, T) == pytest.approx(((2 * head + 32 * neuron) +
                                                                         (1 * head + 16 * neuron)) / (2 * full))


# end to end: a WordPiece pair task, a nested model trained with FFN widths, exported and served

@pytest.fixture(scope="module")
def pair_task(tmp_path_factory):
    """The WordPiece pair task, a RoBERTa fine-tuned on it (dense) and a BudgetFormer nested,
    heads and FFN neurons (helpers.py's tiny BERT, 2 epochs each)."""
    root = tmp_path_factory.mktemp("pairs")
    data, model = wordpiece_pair_task(root)
    run(pair_task_training(data, model, root / "dense", dense=True))
    # trained as a model served at fixed widths is (--no-router-pass); test_installed.py trains the router too
    run(pair_task_training(data, model, root / "nested", "--head-selection", "nested", "--min-heads", 1,
                           "--sandwich-widths", 3, "--min-ffn-ratio", 0.25, "--no-router-pass"))
    return data, root / "dense", root / "nested"


def served(env, *args):
    """scripts/serve_predict.py (budget-serve-predict) run with ``args`` in ``env``."""
    return subprocess.run([sys.executable, str(REPO / "scripts" / "serve_predict.py"), *map(str, args)], env=env,
                          capture_output=True, text=True)


def unimportable(tmp_path):
    """An environment in which ``import torch`` and ``import fairseq`` fail."""
    blocker = tmp_path / "blocked"
    for name in ("torch", "fairseq"):
        (blocker / name).mkdir(parents=True, exist_ok=True)
        (blocker / name / "__init__.py").write_text(f"raise ImportError('{name} is blocked in this test')\n")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocker), str(REPO), str(REPO / "serve")]))


@pytest.mark.slow
def test_export_onnx_at_a_width_checks_itself_and_serves_without_torch(pair_task, tmp_path):
    from budget_plugin import BudgetFormerModel

    data, _, save = pair_task
    out = tmp_path / "onnx"
    printed = run([sys.executable, REPO / "scripts" / "export_onnx.py", save / "checkpoint_best.pt", out,
                   "--data", data, "--width", "0.5", "--int8"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["heads"] == [2, 2] and manifest["neurons"] == [32, 32]
    assert manifest["model_flops_ratio"] == pytest.approx(0.5, abs=0.01)
    assert sorted(manifest["files"]) == ["fp32", "int8"]
    assert sorted(manifest["labels"]) == ["entailment", "not_entailment"]
    check = manifest["checked_on"]
    assert check["max_abs_logit_difference"]["fp32"] < 1e-4
    assert check["accuracy"]["fp32"] == check["accuracy"]["fairseq"]
    assert "int8" in printed and "valid accuracy, fp32" in printed

    # the graph against the dialled nested model itself (not the export's own check), on the prepared valid split
    hub = BudgetFormerModel.from_pretrained(str(save), "checkpoint_best.pt", str(data))
    hub.task.load_dataset("valid")
    runtime = session(out / "model.onnx")
    for i in range(len(PAIRS)):
        tokens = hub.task.dataset("valid")[i]["net_input.src_tokens"].unsqueeze(0)
        with torch.no_grad():
            expected = hub.predict(HEAD, tokens, return_logits=True, width="0.5").numpy()
        assert_close(runtime.run(None, {"tokens": tokens.numpy()})[0], expected, rtol=ONNX_RTOL)

    # budget-predict --onnx with torch and fairseq unimportable: what the fairseq path prints at --width 0.5
    texts = tmp_path / "pairs.txt"
    texts.write_text("".join(f"{a}\t{b}\n" for a, b in PAIRS), encoding="utf-8")
    predictions, dialled = tmp_path / "onnx.tsv", tmp_path / "fairseq.tsv"
    blocked = unimportable(tmp_path)
    probe = subprocess.run([sys.executable, "-c", "import torch"], env=blocked, capture_output=True, text=True)
    assert "torch is blocked" in probe.stderr
    proc = served(blocked, "--onnx", out, "--input", texts, "--output", predictions, "--batch-size", 2)
    assert proc.returncode == 0, proc.stderr
    run([sys.executable, REPO / "scripts" / "predict.py", "--checkpoint-dir", save, "--data", data, "--width", "0.5",
         "--input", texts, "--output", dialled])
    onnx_rows = [row.split("\t") for row in predictions.read_text().splitlines()]
    fairseq_rows = [row.split("\t") for row in dialled.read_text().splitlines()]
    assert onnx_rows[0] == fairseq_rows[0] and len(onnx_rows) == len(PAIRS) + 1
    for mine, theirs in zip(onnx_rows[1:], fairseq_rows[1:]):
        assert mine[:2] == theirs[:2] and mine[3:] == theirs[3:], (mine, theirs)
        assert float(mine[2]) == pytest.approx(float(theirs[2]), abs=2e-4)

    # the int8 copy serves too; a folder that is not an export is refused by name
    proc = served(blocked, "--onnx", out, "--int8", "--input", texts)
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == len(PAIRS) + 1, proc.stderr
    proc = served(blocked, "--onnx", tmp_path, "--input", texts)
    assert proc.returncode == 2 and f"{tmp_path}: no manifest.json" in proc.stderr
    proc = served(blocked, "--checkpoint-dir", save, "--data", data, "--input", texts)  # a checkpoint is not served
    assert proc.returncode == 2 and "the following arguments are required: --onnx" in proc.stderr

    # the checkpoint path's own command hands --onnx over; a broken folder is refused naming its file
    from budget_plugin.cli.predict import main as checkpoint_main
    from budget_serve.errors import DataError
    from budget_serve.predictor import Predictor

    assert checkpoint_main(["--onnx", str(out), "--input", str(texts), "--output", str(tmp_path / "again.tsv")]) == 0
    assert (tmp_path / "again.tsv").read_text() == predictions.read_text()
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    (broken / "tokenizer.json").unlink()
    with pytest.raises(DataError, match=f"{broken}: no tokenizer.json"):
        Predictor(broken)
    (broken / "manifest.json").write_text("{not json")
    with pytest.raises(DataError, match=f"{broken / 'manifest.json'}: not a manifest"):
        Predictor(broken)


@pytest.mark.slow
def test_a_dense_checkpoint_exports_whole_and_refuses_a_dial(pair_task, tmp_path):
    data, save, _ = pair_task
    out = tmp_path / "dense"
    run([sys.executable, REPO / "scripts" / "export_onnx.py", save / "checkpoint_best.pt", out, "--data", data])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["heads"] == [4, 4] and manifest["neurons"] == [64, 64] and manifest["model_flops_ratio"] == 1.0
    assert manifest["checked_on"]["max_abs_logit_difference"]["fp32"] < 1e-4 and list(manifest["files"]) == ["fp32"]
    proc = subprocess.run(program_of([sys.executable, REPO / "scripts" / "export_onnx.py", save / "checkpoint_best.pt",
                                      tmp_path / "refused", "--data", data, "--width", "0.5"]), capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "this one exports whole" in proc.stderr and not (tmp_path / "refused").exists()
    # an export replaces its folder whole: a folder that is not an export is refused, and kept
    from budget_plugin.serving.onnx_export import export_onnx
    from budget_plugin.tools.errors import DataError

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(DataError, match=f"{mine}: a folder that is not an export"):
        export_onnx(save / "checkpoint_best.pt", data, mine)
    assert (mine / "notes.txt").read_text() == "keep me"


def test_a_model_that_chooses_heads_per_input_is_refused_by_name(tmp_path):
    from budget_plugin.serving.onnx_export import exportable
    from budget_plugin.tools.errors import DataError

    learned = build_model(num_classes=2)  # --head-selection learned: per-input subsets, no fixed graph
    with pytest.raises(DataError, match="a --head-selection learned model chooses its heads per input"):
        exportable(checkpoint_state(learned), tmp_path / "x.pt", None, None, tmp_path)
    nested = build_model(num_classes=2, head_selection="nested", min_heads=1)
    cut = exportable(checkpoint_state(nested), tmp_path / "x.pt", None, "1:16,4:64", tmp_path)
    assert PlainClassifier(cut, HEAD).heads == [1, 4] and PlainClassifier(cut, HEAD).neurons == [16, 64]
