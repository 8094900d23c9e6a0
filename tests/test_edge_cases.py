"""Bad settings fail before training; numerical edge cases train without NaN or inf.

Each edge case trains a few updates in this process (the real model, criterion and Adam,
exploration on, then off) and checks, at every update, a finite loss and finite
gradients, and at the end, in evaluation (the fast path), finite outputs and budgets and
head counts within ``[--min-heads, H]``."""

import subprocess
from types import SimpleNamespace

import pytest
import torch
from fairseq.data import Dictionary

from budget_plugin.criterions.budget_sentence_prediction import (
    BudgetSentencePredictionConfig,
    BudgetSentencePredictionCriterion,
)
from conftest import BIN, build_model, train_args

H = 4  # budgetformer_tiny
MAX_POSITIONS = 64  # conftest.build_model
EXPLORATION = 3  # updates: exploration anneals over the first half of train()'s six


def tiny(**overrides):
    return build_model(num_classes=2, exploration_updates=EXPLORATION, **overrides)


@pytest.mark.slow
def test_bad_setting_fails_in_fairseq_train_before_any_checkpoint(tmp_path):
    data = tmp_path / "data"  # fairseq builds the model before it reads any data
    (data / "input0").mkdir(parents=True)
    (data / "label").mkdir()
    (data / "input0" / "dict.txt").write_text("".join(f"w{i} 1\n" for i in range(30)))
    (data / "label" / "dict.txt").write_text("pos 1\nneg 1\n")
    save = tmp_path / "ckpt"
    cmd = train_args(data, save, "--min-heads", 9)
    proc = subprocess.run([str(BIN / cmd[0]), *map(str, cmd[1:])], capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    # one line, no traceback (config.OptionError)
    assert "\nerror: --min-heads must be in [1, 4] (--encoder-attention-heads), got 9\n" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "| train_inner |" not in output and "num_updates" not in output
    assert not list(tmp_path.rglob("*.pt"))


def sample(tokens, labels=None):
    labels = torch.arange(len(tokens)) % 2 if labels is None else labels
    return {"net_input": {"src_tokens": tokens, "src_lengths": tokens.ne(1).sum(1)},
            "target": labels, "ntokens": int(tokens.ne(1).sum())}


def train(model, batches, updates=6, lr=1e-3, **criterion_cfg):
    """A few Adam updates through the real criterion; every loss and gradient finite.
    Returns every layer's statistics on the last batch in evaluation (fast path)."""
    criterion = BudgetSentencePredictionCriterion(
        BudgetSentencePredictionConfig(**criterion_cfg), SimpleNamespace(label_dictionary=Dictionary()))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for update in range(updates):
        model.train()
        model.set_num_updates(update)  # as fairseq's train_step does
        loss, _, logs = criterion(model, batches[update % len(batches)])
        assert torch.isfinite(loss), (update, loss)
        assert all(torch.isfinite(torch.as_tensor(v)).all() for v in logs.values()), logs
        optimizer.zero_grad()
        loss.backward()
        for name, p in model.named_parameters():
            assert p.grad is None or torch.isfinite(p.grad).all(), (update, name)
        optimizer.step()
    model.eval()
    tokens = batches[-1]["net_input"]["src_tokens"]
    with torch.no_grad():
        logits, extra = model(tokens, classification_head_name="sentence_classification_head")
    assert torch.isfinite(logits).all()
    m = model.budget.min_heads
    for stats in extra["budget"]:
        assert torch.isfinite(stats["budget"]).all()
        assert ((m <= stats["budget"]) & (stats["budget"] <= H)).all(), stats["budget"]
        assert ((m <= stats["heads"]) & (stats["heads"] <= H)).all(), stats["heads"]
        assert torch.equal(stats["selected"].sum(1), stats["heads"])
    return extra["budget"]


def random_batch(batch, length, vocab=50):
    tokens = torch.randint(4, vocab, (batch, length))
    tokens[:, 0] = 0
    tokens[:, -1] = 2
    return tokens


def test_length_one_inputs():
    only_bos = torch.zeros(4, 1, dtype=torch.long)  # "<s>": one token, nothing to pool but it
    one_word = torch.tensor([[0, 7, 2], [0, 12, 2], [0, 30, 2], [0, 44, 2]])  # "<s> w </s>"
    mixed = torch.tensor([[0, 1, 1], [0, 9, 2], [0, 1, 1], [0, 21, 2]])  # "<s>" padded among them
    for pooling in ("mean", "first"):
        model = tiny(budget_pooling=pooling)
        train(model, [sample(only_bos), sample(one_word), sample(mixed)])


def test_inputs_at_max_positions():
    model = tiny()
    full = random_batch(4, MAX_POSITIONS)
    train(model, [sample(full)])
    with pytest.raises(IndexError):  # one token more is out of the position table
        model(random_batch(1, MAX_POSITIONS + 1), features_only=True)


def test_one_example_almost_all_padding():
    tokens = random_batch(4, MAX_POSITIONS)
    tokens[2, 1:] = 1  # "<s>" and 63 pads
    tokens[3, 2:] = 1
    tokens[3, 1] = 2
    model = tiny()
    stats = train(model, [sample(tokens)])
    # padding cannot change the choice: the padded example alone gets what it got in the batch
    with torch.no_grad():
        _, alone = model(tokens[2:3, :1], features_only=True)
    for batched, single in zip(stats, alone["budget"]):
        assert torch.allclose(batched["budget"][2], single["budget"][0], atol=1e-5)
        assert torch.equal(batched["selected"][2], single["selected"][0])


def test_min_heads_one_and_a_huge_budget_weight_ends_at_one_head():
    model = tiny(min_heads=1)
    batches = [sample(random_batch(8, 12)), sample(random_batch(8, 20))]
    stats = train(model, batches, updates=16, lr=1e-2, budget_weight=1e4, target_head_ratio=None)
    for layer in stats:
        assert (layer["heads"] == 1).all(), layer["heads"]
        assert (layer["budget"] < 1.5).all()


def test_min_heads_equal_to_the_number_of_heads():
    model = tiny(min_heads=H)
    stats = train(model, [sample(random_batch(6, 10))], budget_weight=10.0)
    for layer in stats:
        assert (layer["heads"] == H).all() and (layer["budget"] == H).all()
        assert layer["selected"].all()
