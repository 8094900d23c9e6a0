"""Nested budgets at serving time and in training: the --head-ratio dial (a calibrated
shift of the budget logits, or fixed counts), its calibration, the physically pruned
export, and the criterion's sandwich of widths."""

import argparse
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from test_model import make_criterion, make_sample

from budget_plugin.dial.calibration import calibration_ratios
from budget_plugin.dial.parsing import parse_head_ratio
from budget_plugin.dial.settings import Dial, HeadRatio
from budget_plugin.dial.calibration import calibrate, mean_ratio
from budget_plugin.nested.export import pruned_checkpoint, whole_counts
from budget_plugin.tasks.budget_sentence_prediction import BudgetSentencePredictionTask
from conftest import build_model, random_tokens

HEAD = "sentence_classification_head"


def nested_model(**options):
    """A tiny nested BudgetFormer (2 layers of 4 heads) whose budgets vary with the input."""
    model = build_model(num_classes=2, head_selection="nested", **options)
    with torch.no_grad():
        for attention in model.budgeted_attentions():
            attention.router.budget_proj.weight.normal_(std=0.5)
            attention.router.budget_proj.bias.zero_()
    return model.eval()


def batches(n=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [{"net_input": {"src_tokens": random_tokens(batch=8, length=10)[torch.randperm(8, generator=generator)]}}
            for _ in range(n)]


@pytest.mark.parametrize("value, expected", [
    (None, None),
    ("0.3", HeadRatio(0.3, None)),
    (0.5, HeadRatio(0.5, None)),
    ("1", HeadRatio(None, [4, 4])),  # every head, no router
    ("2,3", HeadRatio(None, [2, 3])),
])
def test_head_ratio_takes_a_ratio_or_a_count_per_layer(value, expected):
    assert parse_head_ratio(value, num_layers=2, num_heads=4) == expected


@pytest.mark.parametrize("value, message", [
    ("0", r"--head-ratio must be a ratio in \[--min-heads / H, 1\] = \[0.250, 1\]"),
    ("1.5", "a ratio in"),
    ("2,3,4", "one ratio in \\(0, 1\\], or 2 comma-separated whole head counts"),
    ("2,5", "whole head counts"),
    ("2.5,3", "whole head counts"),
    ("half", "whole head counts"),
])
def test_bad_head_ratios_are_refused_by_name(value, message):
    with pytest.raises(ValueError, match=message):
        parse_head_ratio(value, num_layers=2, num_heads=4)


def test_counts_dial_runs_those_heads_with_no_router():
    model = nested_model()
    tokens = random_tokens()
    with torch.no_grad(), model.dialled("2,3"):
        dialled, extra = model(tokens, classification_head_name=HEAD)
    with torch.no_grad(), model.forced_heads([2, 3]):
        forced, _ = model(tokens, classification_head_name=HEAD)
    assert [layer["heads"].tolist() for layer in extra["budget"]] == [[2] * 6, [3] * 6]
    assert torch.equal(dialled, forced)
    with torch.no_grad():
        _, extra = model(tokens, classification_head_name=HEAD)
    assert len(set(torch.cat([layer["heads"] for layer in extra["budget"]]).tolist())) > 1, "the router's again"


def test_a_ratio_needs_the_calibration():
    with pytest.raises(ValueError, match="needs the budget dial's calibration.*budget-calibrate"):
        with nested_model().dialled("0.5"):
            pass


def test_the_dial_is_for_evaluation_only():
    """Training ignores the dial: the budget predictor is trained as it predicts."""
    model = nested_model()
    tokens = random_tokens()
    model.train()
    torch.manual_seed(0)  # the same dropout
    with model.dialled("2,3"):
        _, dialled = model(tokens)
    torch.manual_seed(0)
    _, plain = model(tokens)
    assert torch.equal(torch.stack([l["budget"] for l in dialled["budget"]]),
                       torch.stack([l["budget"] for l in plain["budget"]]))


def test_calibration_makes_every_dialled_ratio_the_mean_on_its_split():
    model = nested_model()
    data = batches()
    table = calibrate(model, data)
    assert table[0, 0].item() == pytest.approx(0.25) and table[-1, 0].item() == 1  # the range the dial accepts
    assert all(any(r == pytest.approx(aim) for r in table[:, 0].tolist()) for aim in calibration_ratios(1, 4))
    assert torch.all(table[1:, 0] > table[:-1, 0]) and torch.all(table[1:, 1] >= table[:-1, 1]), \
        "a larger ratio takes a larger shift"
    model.store_dial(table)
    achieved = {}
    for ratio in (0.3, 0.5, 0.75):
        with model.dialled(str(ratio)):
            achieved[ratio] = mean_ratio(model, data)
    assert achieved == {r: pytest.approx(r, abs=0.02) for r in achieved}
    # between two calibrated ratios, interpolated: the mean lands between theirs
    with model.dialled("0.45"):
        assert 0.4 - 0.02 <= mean_ratio(model, data) <= 0.5 + 0.02
    assert model.head_ratio is None and model.dial_setting == Dial(), "the model's own setting again"


def test_a_calibrated_checkpoint_dials_when_loaded():
    """--head-ratio reaches the model as its option; the shift is applied once the
    calibration is loaded with the weights."""
    model, data = nested_model(), batches()
    model.store_dial(calibrate(model, data))
    dialled = build_model(num_classes=2, head_selection="nested", head_ratio="0.3").eval()
    dialled.load_state_dict(model.state_dict())
    assert mean_ratio(dialled, data) == pytest.approx(0.3, abs=0.02)


def checkpoint_of(model) -> dict:
    return {"cfg": {"model": argparse.Namespace(**vars(model.args))}, "model": model.state_dict(),
            "optimizer_history": [], "extra_state": {}}


@pytest.mark.parametrize("counts", [[2, 3], [2, 2], [4, 4]])
def test_the_pruned_export_computes_the_dialled_model_with_fewer_weights(counts):
    from budget_plugin.tools.checkpoints import as_budgetformer

    model = nested_model()
    state = checkpoint_of(model)
    pruned = as_budgetformer(pruned_checkpoint(state, counts))
    tokens = random_tokens()
    with torch.no_grad(), model.forced_heads(counts):
        expected, _ = model(tokens, classification_head_name=HEAD)
    with torch.no_grad():
        found, extra = pruned(tokens, classification_head_name=HEAD)
    assert torch.allclose(found, expected, atol=1e-6)
    assert [layer["heads"].tolist() for layer in extra["budget"]] == [[c] * 6 for c in counts]
    sizes = {name: sum(p.numel() for p in m.parameters()) for name, m in (("nested", model), ("pruned", pruned))}
    d = model.args.encoder_embed_dim // 4
    dropped = sum(4 * (4 - c) * d * model.args.encoder_embed_dim + 3 * (4 - c) * d for c in counts)
    router = sum(p.numel() for a in model.budgeted_attentions() for p in a.router.parameters())
    assert sizes["nested"] - sizes["pruned"] == dropped + router
    assert not any(".router." in k for k in pruned.state_dict())
    for module in pruned.modules():  # its gated (training) path holds only the kept heads too
        if hasattr(module, "p") and isinstance(module.p, float):
            module.p = 0.0
    pruned.train()
    gated, _ = pruned(tokens, classification_head_name=HEAD)
    assert torch.allclose(gated, expected, atol=1e-5)


def test_only_a_nested_checkpoint_exports():
    from budget_plugin.tools.errors import DataError

    learned = build_model(num_classes=2)
    with pytest.raises(DataError, match="export needs a --head-selection nested checkpoint"):
        pruned_checkpoint(checkpoint_of(learned), [2, 2])


def without_dropout(model):
    """``model`` with every dropout off: forward passes repeat exactly."""
    model.args.dropout = 0.0
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout) or type(module).__name__ == "FairseqDropout":
            module.p = 0.0
    return model


def test_the_sandwich_adds_every_width_distilled_from_the_full_one():
    """--sandwich-widths 3: the loss is the full width's task loss + the smallest's and
    one random width's losses mixed with the full width's distillation + the router
    pass's (mixed the same way); computed here by hand from forced runs under the same
    seed, in the criterion's order (full, smallest, random, router)."""
    model = without_dropout(nested_model(min_heads=1).train())
    sample = make_sample()
    criterion = make_criterion(sandwich_widths=3, distill_weight=0.5, distill_temperature=2.0,
                               budget_weight=0.0, exploration_weight=0.0)
    torch.manual_seed(5)
    loss, size, logs = criterion(model, sample)
    torch.manual_seed(5)
    full, _ = criterion.width_forward(model, sample, None)
    random_width = torch.randint(1, 5, (2,)).tolist()
    target = sample["target"]

    def mixed(z):
        kl = F.kl_div(F.log_softmax(z / 2, -1), F.log_softmax(full.detach() / 2, -1), reduction="sum",
                      log_target=True)
        return 0.5 * F.cross_entropy(z, target, reduction="sum") + 0.5 * 4 * kl

    with model.forced_heads([1, 1]):
        smallest = model(**sample["net_input"], features_only=True, classification_head_name=HEAD)[0]
    with model.forced_heads(random_width):
        drawn = model(**sample["net_input"], features_only=True, classification_head_name=HEAD)[0]
    logits, _ = model(**sample["net_input"], features_only=True, classification_head_name=HEAD)
    widths = F.cross_entropy(full, target, reduction="sum") + mixed(smallest) + mixed(drawn)
    assert logs["width_loss"].item() == pytest.approx(widths.item(), rel=1e-5)
    assert loss.item() == pytest.approx((mixed(logits) + widths).item(), rel=1e-5)
    loss.backward()
    budget = model.encoder.sentence_encoder.layers[0].self_attn.router.budget_proj.weight
    assert budget.grad is not None and budget.grad.abs().sum() > 0, "the router's pass trains the budget"


@pytest.mark.parametrize("min_ffn_ratio", [0.0, 0.25])
def test_train_step_backpropagates_each_width_as_it_comes_to_the_same_gradient(min_ffn_ratio):
    """The task's train_step hands the criterion its optimizer's backward: every pass of
    the sandwich is backpropagated as soon as it is computed (one graph alive at a time),
    and the gradient is the one of the summed loss, with dropout on (same seed)."""
    task = SimpleNamespace(label_dictionary=None)
    criterion = make_criterion(sandwich_widths=4, min_ffn_ratio=min_ffn_ratio, distill_weight=0.5)
    model = nested_model(min_heads=1, encoder_ffn_embed_dim=32).train()
    sample = make_sample()
    calls = []

    class Optimizer:  # what train_step uses of fairseq's optimizer
        def backward(self, loss):
            calls.append(loss.item())
            loss.backward()

    torch.manual_seed(3)
    loss, size, logs = BudgetSentencePredictionTask.train_step(task, sample, model, criterion, Optimizer(), 0)
    by_pass = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    torch.manual_seed(3)
    summed, _, summed_logs = criterion(model, sample)
    summed.backward()
    at_once = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    assert len(calls) == 5, "the full width, the smallest, two random ones, the router's pass"
    assert not loss.requires_grad and loss.item() == pytest.approx(sum(calls), rel=1e-6)
    assert loss.item() == pytest.approx(summed.item(), rel=1e-6)
    assert logs["width_loss"].item() == pytest.approx(summed_logs["width_loss"].item(), rel=1e-6)
    assert len(by_pass) == len(at_once)
    for a, b in zip(by_pass, at_once):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_no_sandwich_in_evaluation():
    model = nested_model()
    sample = make_sample()
    _, _, logs = make_criterion(sandwich_widths=3)(model, sample)
    assert "width_loss" not in logs


@pytest.mark.parametrize("means, counts", [
    ([3.6] * 6, None),  # 21.6 heads: 22 (any four layers at 4), not the 24 that rounding each layer gives
    ([3.76, 3.61, 3.18, 4.0, 3.01, 4.0], [4, 4, 3, 4, 3, 4]),  # 21.56: the largest remainders get the heads
    ([2.0, 3.0], [2, 3]),
    ([2.5, 2.5], None),  # 5: one layer at 3
])
def test_fixed_counts_keep_the_total_of_the_means(means, counts):
    found = whole_counts(means)
    assert sum(found) == round(sum(means))
    assert all(abs(c - m) < 1 for c, m in zip(found, means))
    assert counts is None or found == counts
