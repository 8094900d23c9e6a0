"""Defaults that work on a pretrained encoder (issue 25): what fairseq-train builds with
nothing but --target-head-ratio, what a checkpoint saved before an option existed keeps
computing, options that do nothing in a mode refused by name, and baselines that build
only what they use."""

import argparse

import pytest
import torch
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from test_legacy_checkpoints import LEGACY

from budget_plugin.config import BudgetConfig
from conftest import build_model


def fairseq_train_model(*flags):
    """The model fairseq-train would build from this command line (no training)."""
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        str(LEGACY / "data"), "--user-dir", str(LEGACY.parents[2] / "budget_plugin"), "--arch", "budgetformer_tiny",
        "--task", "budget_sentence_prediction", "--criterion", "budget_sentence_prediction", "--num-classes", "2",
        "--max-positions", "64", "--cpu", *flags])
    cfg = convert_namespace_to_omegaconf(args)
    return tasks.setup_task(cfg.task).build_model(cfg.model)


@pytest.mark.parametrize("ratio, start", [(None, 2.0), ("0.25", 1.0), ("0.75", 3.0)])
def test_fairseq_train_starts_the_budget_at_the_target_with_the_studys_router_scale(ratio, start):
    model = fairseq_train_model(*(["--target-head-ratio", ratio] if ratio else []))
    assert model.args.router_scale == 10.0 and model.args.initial_budget == start  # saved with the checkpoint
    with torch.no_grad():
        _, extra = model.eval()(torch.tensor([[0, 5, 6, 7, 2]]), features_only=True)
    for layer in extra["budget"]:  # H = 4 heads: the budget starts at ratio x H
        assert layer["budget"].item() == pytest.approx(start, abs=5e-3)  # (at m: clamped inside the sigmoid)


def test_without_a_target_the_budget_starts_at_every_head():
    model = build_model(router_scale=10.0)  # no criterion options: e.g. a hydra config's model section
    with torch.no_grad():
        _, extra = model.eval()(torch.tensor([[0, 5, 6, 7, 2]]), features_only=True)
    assert [layer["heads"].item() for layer in extra["budget"]] == [4, 4]


def test_a_saved_command_line_without_router_scale_keeps_the_scale_it_was_trained_with():
    saved = argparse.Namespace(min_heads=1)  # a checkpoint's options from before --router-scale
    assert BudgetConfig.fill_args(saved).router_scale == 1.0 and saved.router_scale == 1.0
    assert BudgetConfig.fill_args(argparse.Namespace(router_scale=10.0)).router_scale == 10.0


@pytest.mark.parametrize("overrides, option", [
    (dict(exploration_noise=0.5), "--exploration-noise"),
    (dict(exploration_uniform=0.2), "--exploration-uniform"),
    (dict(exploration_schedule="cosine"), "--exploration-schedule"),
    (dict(temperature_start=3.0), "--temperature-start"),
    (dict(head_selection="static", fixed_heads="2", initial_budget=2.0), "--initial-budget"),
    (dict(head_selection="random", fixed_heads="2", budget_pooling="first"), "--budget-pooling"),
    (dict(head_selection="kept", kept_heads="0;1", exploration_updates=10, temperature_end=2.0),
     "--temperature-end"),
])
def test_options_that_do_nothing_in_a_mode_are_refused_by_name(overrides, option):
    with pytest.raises(ValueError, match=f"{option} does nothing with --head-selection"):
        build_model(**overrides)


def test_exploration_options_are_accepted_with_a_schedule():
    build_model(exploration_updates=10, exploration_noise=0.5, temperature_start=3.0)


@pytest.mark.parametrize("mode, params", [
    (dict(head_selection="static", fixed_heads="2"), ["static_logits"]),
    (dict(head_selection="random", fixed_heads="2"), []),
    (dict(head_selection="kept", kept_heads="0;1"), []),
    (dict(), ["relevance_proj.weight", "relevance_proj.bias", "budget_proj.weight", "budget_proj.bias"]),
])
def test_each_mode_builds_only_the_router_it_uses(mode, params):
    attention = next(build_model(**mode).budgeted_attentions())
    assert [name for name, _ in attention.router.named_parameters()] == params
