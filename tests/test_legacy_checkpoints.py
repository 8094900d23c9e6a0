"""Checkpoints written before the plugin's refactor (issue 16) load and score the same.

tests/fixtures/legacy/ holds three tiny BudgetFormers (learned budget trained with
exploration, static and random baselines) trained by the code of commit 2f6b17b, and
what that code computed on them (make.py wrote them). Their router parameters sit on
the attention module (``self_attn.budget_proj.weight``) and their exploration options
in the task's config: both must be upgraded on load. A command line saved before an
option existed keeps computing what it computed."""

import argparse
import json

import pytest
import torch
from fairseq import checkpoint_utils

from budget_plugin.config import BudgetConfig
from helpers import LEGACY, PLUGIN_DIR, assert_close, parse_metrics, run

SYSTEMS = ("learned", "static", "random")


@pytest.fixture(scope="module")
def expected():
    return torch.load(LEGACY / "expected.pt", weights_only=True)


@pytest.mark.parametrize("system", SYSTEMS)
def test_legacy_checkpoint_computes_what_it_computed(system, expected):
    state = torch.load(LEGACY / f"{system}.pt", weights_only=True)
    assert any(".self_attn.budget_proj." in k for k in state["model"]), "the fixture has the old keys"
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(LEGACY / f"{system}.pt")], arg_overrides={"data": str(LEGACY / "data")}
    )
    model = models[0].eval()
    with torch.no_grad():
        logits, extra = model(expected["tokens"], features_only=True,
                              classification_head_name="sentence_classification_head")
    # the same function; the fast path groups its products differently since issue 18,
    # so the last bits of the floats may differ
    assert_close(logits, expected[f"{system}.logits"])
    for i, layer in enumerate(extra["budget"]):
        assert torch.equal(layer["selected"], expected[f"{system}.selected.{i}"])


@pytest.mark.slow
@pytest.mark.parametrize("system", SYSTEMS)
def test_legacy_checkpoint_validates_the_same(system):
    output = run(["fairseq-validate", LEGACY / "data", "--user-dir", PLUGIN_DIR, "--path", LEGACY / f"{system}.pt",
                  "--task", "budget_sentence_prediction", "--criterion", "budget_sentence_prediction",
                  "--batch-size", 16, "--cpu", "--num-workers", 0])
    line = [l for l in output.splitlines() if "valid on 'valid' subset" in l][-1]
    found = {k: v for k, v in parse_metrics(line).items() if k not in ("wps", "wpb", "wall")}
    before = json.loads((LEGACY / "expected_validate.json").read_text())[system]
    # printed since the FFN has widths: every neuron runs (the FFN of budgetformer_tiny, 128)
    added = {"model_flops_ratio", "neurons"}
    assert {k: v for k, v in found.items() if k not in added} == before
    assert found["neurons"] == 128 and before["flops_ratio"] < found["model_flops_ratio"] < 1


def test_a_saved_command_line_without_router_scale_keeps_the_scale_it_was_trained_with():
    saved = argparse.Namespace(min_heads=1)  # a checkpoint's options from before --router-scale
    assert BudgetConfig.fill_args(saved).router_scale == 1.0 and saved.router_scale == 1.0
    assert BudgetConfig.fill_args(argparse.Namespace(router_scale=10.0)).router_scale == 10.0
