"""What users touch after training: the hub interface and scripts/predict.py, and warm
starts from RoBERTa (the pictures of a checkpoint's heads: studies/test_plot_heads.py)."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from fairseq import checkpoint_utils
from fairseq.data.data_utils import collate_tokens

from budget_plugin import BudgetFormerModel
from budget_plugin.dial.settings import Dial
from helpers import (REPO, assert_close, make_classification_data, run, train_args, trained_sst_like,
                     without_option)

TINY_ROBERTA = ["--arch", "roberta", "--encoder-layers", 2, "--encoder-embed-dim", 64,
                "--encoder-ffn-embed-dim", 128, "--encoder-attention-heads", 4]

pytestmark = pytest.mark.slow  # every test here runs the fairseq tools


@pytest.fixture(scope="module")
def trained_sst(tmp_path_factory):
    return trained_sst_like(tmp_path_factory)


def test_from_pretrained_encode_predict_head_usage(trained_sst):
    sst_like, save = trained_sst
    hub = BudgetFormerModel.from_pretrained(str(save), "checkpoint_best.pt", str(sst_like))
    tokens = hub.encode("a good film")
    assert tokens[0] == 0 and tokens[-1] == 2  # <s> ... </s>
    assert hub.decode(tokens) == "a good film"
    probs = hub.predict("sentence_classification_head", tokens).exp()
    assert probs.shape == (1, 2)
    assert_close(probs.sum(), 1.0)
    features = hub.extract_features(tokens)
    assert features.shape == (1, len(tokens), 64)
    usage = hub.head_usage(tokens)
    assert len(usage) == 2  # one entry per layer
    assert all(layer["num_heads"] == len(layer["heads"]) for layer in usage)
    # a padded batch: each input runs the heads it runs alone, at the same budget
    inputs = [tokens, hub.encode("boring plot and weak actors , dull"), hub.encode("superb")]
    batch = hub.head_usage(collate_tokens(inputs, pad_idx=1))
    assert len(batch) == 3
    for alone, together in zip(map(hub.head_usage, inputs), batch):
        assert [layer["heads"] for layer in alone] == [layer["heads"] for layer in together]
        assert_close([layer["budget"] for layer in alone], [layer["budget"] for layer in together])
    pair = hub.encode("good", "bad plot")
    assert (pair == 2).sum() == 3  # <s> a </s> </s> b </s>, as the task builds pairs
    # the budget dial for one call: fixed counts per layer, then the router's own budgets again
    dialled = hub.predict("sentence_classification_head", tokens, head_ratio="1,2")
    with torch.no_grad():
        logits, _ = hub.model(tokens.unsqueeze(0), classification_head_name="sentence_classification_head",
                              dial=Dial(counts=(1, 2)))
    assert torch.equal(dialled, F.log_softmax(logits, dim=-1))
    assert [layer["num_heads"] for layer in hub.head_usage(tokens, head_ratio="1,2")] == [1, 2]
    assert hub.head_usage(tokens) == usage


def test_predict_script(trained_sst, tmp_path):
    data, save = trained_sst
    texts = tmp_path / "texts.txt"
    texts.write_text("a good film\nboring plot and weak actors\nsuperb\n")
    out = tmp_path / "preds.tsv"
    run([sys.executable, REPO / "scripts" / "predict.py", "--checkpoint-dir", save, "--data", data,
         "--input", texts, "--output", out, "--batch-size", 2])
    header, *rows = out.read_text().splitlines()
    assert header.split("\t") == ["line", "label", "probability", "heads_per_layer", "selected_heads"]
    assert len(rows) == 3
    for row in rows:
        line, label, prob, heads, selected = row.split("\t")
        assert label in ("0", "1") and 0.5 <= float(prob) <= 1
        assert [len(s.split(".")) for s in selected.split("|")] == list(map(int, heads.split(",")))
    texts.write_text("fine\n\nbad\n")
    with pytest.raises(AssertionError, match="texts.txt:2"):
        run([sys.executable, REPO / "scripts" / "predict.py", "--checkpoint-dir", save, "--data", data, "--input", texts])


@pytest.fixture(scope="module")
def roberta_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("roberta")
    data = make_classification_data(root, n_train=96, n_valid=32)
    args = train_args(data, root / "ckpt", epochs=1)
    args[args.index("--arch"):args.index("--arch") + 2] = TINY_ROBERTA
    task = args.index("budget_sentence_prediction")
    args[task] = args[task + 2] = "sentence_prediction"
    run(without_option(args, "--exploration-updates"))
    return data, root / "ckpt" / "checkpoint_best.pt"


def features(path, data, tokens):
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(path)], arg_overrides={"data": str(data)})
    model = models[0].eval()
    with torch.no_grad():
        out, _ = model(tokens, features_only=True)
        logits, _ = model(tokens, classification_head_name="sentence_classification_head")
    return model, out, logits


def test_converted_roberta_equals_roberta_at_full_budget(roberta_checkpoint, tmp_path):
    data, roberta = roberta_checkpoint
    converted = tmp_path / "budgetformer.pt"
    output = run([sys.executable, REPO / "scripts" / "convert_roberta.py", roberta, converted])
    assert "new (router, full budget): 8" in output and "dropped: none" in output
    bad = subprocess.run([sys.executable, REPO / "scripts" / "convert_roberta.py", data / "label" / "dict.txt",
                          tmp_path / "bad.pt"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: checkpoint ") and "cannot be read" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and not (tmp_path / "bad.pt").exists()
    tokens = torch.randint(4, 30, (5, 11))
    tokens[:, 0] = 0
    tokens[2, 6:] = 1
    stock, want, want_logits = features(roberta, data, tokens)
    budget, got, got_logits = features(converted, data, tokens)
    assert type(stock).__name__ == "RobertaModel" and type(budget).__name__ == "BudgetFormerModel"
    assert_close(got, want)
    assert_close(got_logits, want_logits)


@pytest.mark.parametrize("selection,new", [
    ([], 8),  # relevance_proj and budget_proj (weight, bias) of 2 layers
    # the baselines build only what they use (issue 25): static_logits, the random_seed buffer
    (["--head-selection", "static", "--fixed-heads", "2"], 2),
    (["--head-selection", "random", "--fixed-heads", "2"], 2),
])
def test_restore_file_warm_starts_from_roberta(roberta_checkpoint, tmp_path, selection, new):
    data, roberta = roberta_checkpoint
    output = run(train_args(data, tmp_path, "--restore-file", roberta, "--reset-optimizer",
                            "--reset-dataloader", "--reset-meters", *selection, epochs=1))
    assert f"warm start from a checkpoint without head routers: {new} new router parameters" in output
    assert "Loaded checkpoint" in output
