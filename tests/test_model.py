"""Model wiring, the task's schedule, the criterion's terms, and clear errors for bad settings."""

import argparse
import math
from types import SimpleNamespace

import pytest
import torch

from budget_plugin.criterions.budget_sentence_prediction import (
    BudgetSentencePredictionConfig,
    BudgetSentencePredictionCriterion,
)
from budget_plugin.tasks.budget_sentence_prediction import (
    BudgetSentencePredictionTask,
    BudgetSentencePredictionTaskConfig,
)
from conftest import build_model, random_tokens
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY


@pytest.mark.parametrize(
    "arch, layers, dim, heads",
    [
        ("budgetformer", 12, 768, 12),
        ("budgetformer_base", 12, 768, 12),
        ("budgetformer_large", 24, 1024, 16),
        ("budgetformer_small", 4, 256, 8),
        ("budgetformer_tiny", 2, 64, 4),
    ],
)
def test_architectures(arch, layers, dim, heads):
    assert ARCH_MODEL_REGISTRY[arch].__name__ == "BudgetFormerModel"
    args = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[arch](args)
    assert (args.encoder_layers, args.encoder_embed_dim, args.encoder_attention_heads) == (layers, dim, heads)
    assert args.min_heads == 1 and args.budget_pooling == "mean"


def test_extra_holds_one_stats_dict_per_layer():
    model = build_model().eval()
    tokens = random_tokens()
    logits, extra = model(tokens, classification_head_name="sentence_classification_head")
    assert logits.shape == (6, 3)
    assert len(extra["budget"]) == 2
    for stats in extra["budget"]:
        assert stats["selected"].shape == (6, 4)
        assert torch.equal(stats["selected"].sum(1), stats["heads"])


@pytest.mark.parametrize("arch, heads", [("budgetformer_tiny", 4), ("budgetformer_small", 8)])
def test_router_starts_at_full_budget_after_init_bert_params(arch, heads):
    model = build_model(arch).eval()
    for attention in model.budgeted_attentions():
        assert torch.all(attention.budget_proj.weight == 0)  # not init_bert_params' normal init
    _, extra = model(random_tokens(), features_only=True)
    for stats in extra["budget"]:
        assert torch.allclose(stats["budget"], torch.full((6,), heads - 0.25))
        assert (stats["heads"] == heads).all()


@pytest.mark.parametrize("heads, min_heads", [(12, 1), (16, 1), (16, 4), (12, 12)])
def test_initial_budget_rounds_to_all_heads_for_any_size(heads, min_heads):
    from budget_plugin.modules import BudgetConfig, BudgetedAttention

    attention = BudgetedAttention(heads * 8, heads, BudgetConfig(min_heads=min_heads)).eval()
    route = attention.route(torch.randn(5, 3, heads * 8), None)
    assert (route.heads == heads).all()


def test_force_heads():
    model = build_model().eval()
    model.force_heads(1)
    _, extra = model(random_tokens(), features_only=True)
    assert all((s["heads"] == 1).all() for s in extra["budget"])
    with pytest.raises(ValueError, match="forced heads"):
        model.force_heads(5)


def test_padding_does_not_change_predictions():
    model = build_model().eval()
    tokens = random_tokens(batch=2, length=12, pad_lengths=(12, 6))
    alone = model(tokens[1:, :6], classification_head_name="sentence_classification_head")[0]
    batched = model(tokens, classification_head_name="sentence_classification_head")[0]
    assert (alone[0] - batched[1]).abs().max() < 1e-5


def make_task(**cfg):
    dictionary = Dictionary()
    return BudgetSentencePredictionTask(BudgetSentencePredictionTaskConfig(data="unused", num_classes=2, **cfg), dictionary, dictionary)


def test_schedule_anneals_exploration_and_temperature():
    task = make_task(exploration_updates=100, temperature_start=2.0, temperature_end=1.0, exploration_uniform=0.2)
    start, middle, end, late = (task.exploration_at(n) for n in (0, 50, 100, 10_000))
    assert (start.rate, start.noise, start.uniform, start.temperature) == (1.0, 1.0, 0.2, 2.0)
    assert middle.rate == pytest.approx(0.5) and middle.temperature == pytest.approx(1.5)
    assert end == late and end.rate == 0.0 and end.temperature == 1.0 and end.noise == 0
    cosine = make_task(exploration_updates=100, exploration_schedule="cosine")
    assert cosine.exploration_at(25).rate == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert make_task(exploration_updates=0).exploration_at(0).rate == 0.0


def make_criterion(**cfg):
    return BudgetSentencePredictionCriterion(BudgetSentencePredictionConfig(**cfg), SimpleNamespace(label_dictionary=Dictionary()))


def layer_stats(budgets, heads=4):
    budgets = torch.tensor(budgets)
    return {"budget": budgets, "selected": torch.zeros(len(budgets), heads, dtype=torch.bool)}


def test_budget_term_linear_and_towards_target():
    layers = [layer_stats([4.0, 2.0]), layer_stats([1.0, 1.0])]
    linear = make_criterion(target_head_ratio=None).budget_term(layers)
    assert linear.item() == pytest.approx((1.0 + 0.5 + 0.25 + 0.25) / 4)
    towards = make_criterion(target_head_ratio=0.5).budget_term(layers)
    assert towards.item() == pytest.approx(((0.75 - 0.5) ** 2 + (0.25 - 0.5) ** 2) / 2)


def test_criterion_loss_adds_the_terms():
    model = build_model(num_classes=2).train()
    sample = {
        "net_input": {"src_tokens": random_tokens(), "src_lengths": torch.full((6,), 12)},
        "target": torch.tensor([0, 1, 0, 1, 1, 0]),
        "ntokens": 72,
    }
    from budget_plugin.modules import Exploration

    model.set_exploration(Exploration(rate=1.0))
    torch.manual_seed(0)
    plain, n, _ = make_criterion(budget_weight=0.0, exploration_weight=0.0)(model, sample)
    torch.manual_seed(0)
    loss, _, logs = make_criterion(budget_weight=2.0, exploration_weight=0.5)(model, sample)
    expected = plain + n * (2.0 * logs["budget_term"] / n) + n * 0.5 * (logs["exploration_term"] / n)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert logs["task_loss"].item() == pytest.approx(plain.item(), rel=1e-6)
    assert logs["head_slots"] == 2 * 4 * 6 and "heads_l1" in logs
    loss.backward()
    router = model.encoder.sentence_encoder.layers[0].self_attn
    assert router.budget_proj.weight.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "make, kwargs, option",
    [
        (make_criterion, {"budget_weight": -1.0}, "--budget-weight"),
        (make_criterion, {"exploration_weight": -0.1}, "--exploration-weight"),
        (make_criterion, {"target_head_ratio": 1.5}, "--target-head-ratio"),
        (make_criterion, {"target_head_ratio": -0.5}, "--target-head-ratio"),
        (make_task, {"exploration_uniform": 1.5}, "--exploration-uniform"),
        (make_task, {"exploration_updates": -1}, "--exploration-updates"),
        (make_task, {"temperature_start": 0.0}, "--temperature-start"),
        (make_task, {"temperature_end": -1.0}, "--temperature-end"),
        (make_task, {"exploration_noise": -1.0}, "--exploration-noise"),
        (make_task, {"exploration_schedule": "step"}, "--exploration-schedule"),
        (build_model, {"min_heads": 0}, "--min-heads"),
        (build_model, {"min_heads": 5}, "--min-heads"),
        (build_model, {"encoder_embed_dim": 66}, "--encoder-embed-dim"),
        (build_model, {"budget_pooling": "max"}, "--budget-pooling"),
        (build_model, {"budget_mask_temperature": 0.0}, "--budget-mask-temperature"),
        (build_model, {"initial_budget": 4.5}, "--initial-budget"),
        (build_model, {"attention_path": "sparse"}, "--attention-path"),
    ],
)
def test_bad_settings_fail_when_built_naming_the_option(make, kwargs, option):
    with pytest.raises(ValueError, match=option):
        make(**kwargs)
