"""The baselines of the accuracy study, each building only the router it uses:
--head-selection static, random and kept (the pruning baseline), and the learned
router's --relevance-prior."""

import pytest
import torch

from budget_plugin.config import BudgetConfig
from budget_plugin.modules import BudgetedAttention
from helpers import assert_close, build_model, random_tokens

T, C, H = 10, 32, 8


def make_attention(mode, fixed_heads):
    return BudgetedAttention(C, H, BudgetConfig(head_selection=mode), fixed_heads=fixed_heads).eval()


def inputs(batch, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(T, batch, C, generator=generator)
    padding = torch.arange(T)[None, :] >= torch.randint(1, T + 1, (batch,), generator=generator)[:, None]
    return x, padding


def test_static_runs_one_head_subset_for_every_input():
    attention = make_attention("static", 3.0)
    with torch.no_grad():
        attention.router.static_logits.copy_(torch.tensor([0.0, 5, 0, 4, 0, 3, 0, 0]))
    route = attention.router(*inputs(64))
    assert route.heads.eq(3).all()
    assert route.selected.eq(route.selected[0]).all(), "every input runs the same heads"
    assert route.selected[0].nonzero().flatten().tolist() == [1, 3, 5], "the top-3 static logits"


def test_static_head_choice_is_learned_through_the_gate():
    attention = make_attention("static", 2.0).train()
    x, padding = inputs(4)
    out, _ = attention(x, key_padding_mask=padding)
    out.pow(2).sum().backward()
    assert attention.router.static_logits.grad is not None and attention.router.static_logits.grad.abs().sum() > 0
    # no per-input router: a baseline builds only what it uses
    assert [name for name, _ in attention.router.named_parameters()] == ["static_logits"]


@pytest.mark.parametrize("fixed_heads", [1.0, 2.5, 3.9, 8.0])
def test_random_meets_a_fractional_budget_on_average(fixed_heads):
    attention = make_attention("random", fixed_heads)
    route = attention.router(*inputs(4000))
    assert set(route.heads.unique().tolist()) <= {int(fixed_heads), -int(-fixed_heads // 1)}
    assert abs(route.heads.float().mean().item() - fixed_heads) < 0.05
    assert torch.equal(route.selected.sum(1), route.heads)
    # uniform over heads: each head is chosen by about k/H of the inputs
    usage = route.selected.float().mean(0)
    assert (usage - fixed_heads / H).abs().max().item() < 0.05


def test_random_heads_vary_per_input_and_replay_from_a_checkpoint():
    model = build_model(head_selection="random", fixed_heads="2").eval()
    tokens = random_tokens()
    with torch.no_grad():
        first = [layer["selected"] for layer in model(tokens)[1]["budget"]]
    assert len({tuple(s.tolist()) for s in first[0].int()}) > 1, "inputs draw different heads"
    assert not torch.equal(first[0], first[1]), "layers draw independently"
    # a fresh model with the same state dict (the seed is a buffer) draws the same heads
    again = build_model(head_selection="random", fixed_heads="2").eval()
    again.load_state_dict(model.state_dict())
    with torch.no_grad():
        replay = [layer["selected"] for layer in again(tokens)[1]["budget"]]
    assert all(torch.equal(a, b) for a, b in zip(first, replay))


@pytest.mark.parametrize("mode,fixed_heads", [("static", 3.0), ("random", 2.5)])
def test_fast_path_equals_reference_for_the_baselines(mode, fixed_heads):
    attention = make_attention(mode, fixed_heads)
    x, padding = inputs(16)
    with torch.no_grad():
        selected = attention.router(x, padding).selected
        fast = attention.attend_selected_heads(x, padding, selected)
        expected = attention.attend_all_heads(x, padding, selected.to(x.dtype))
    assert_close(fast, expected)


def test_fixed_heads_are_set_per_layer_and_reported():
    model = build_model(head_selection="static", fixed_heads="1,3").eval()
    with torch.no_grad():
        layers = model(random_tokens())[1]["budget"]
    assert [layer["heads"].unique().tolist() for layer in layers] == [[1], [3]]
    assert [layer["budget"].unique().tolist() for layer in layers] == [[1.0], [3.0]]


def test_heads_per_layer():
    assert BudgetConfig(head_selection="random", fixed_heads="3.5").heads_per_layer(3, 8) == [3.5, 3.5, 3.5]
    assert BudgetConfig(head_selection="static", fixed_heads="1,2.5,8").heads_per_layer(3, 8) == [1.0, 2.5, 8.0]
    assert BudgetConfig().heads_per_layer(2, 8) == [8.0, 8.0]


def test_kept_heads_run_for_every_input_and_nothing_else():
    """--head-selection kept (the pruning baseline): exactly the named heads, for every
    input, in training (with an exploration schedule) as in evaluation; the buffer is in
    the state dict."""
    model = build_model(head_selection="kept", kept_heads="3,0;1,2,3", exploration_updates=10)
    expected = [[True, False, False, True], [False, True, True, True]]
    for mode in (model.train(), model.eval()):
        _, extra = mode(random_tokens(), features_only=True)
        for layer, want in zip(extra["budget"], expected):
            assert layer["selected"].tolist() == [want] * 6
            assert layer["heads"].tolist() == [sum(want)] * 6
    assert "encoder.sentence_encoder.layers.1.self_attn.router.kept" in model.state_dict()


def test_relevance_prior_sets_the_first_choices_and_survives_fairseqs_init():
    """--relevance-prior (e.g. a dense model's head importance): each layer's relevance
    starts at its scores, standardised, so the best-scored heads run first for every
    input until the router learns otherwise; the router's bias holds it, so a trained
    checkpoint needs no prior to load."""
    model = build_model(relevance_prior="0,1,5,2;3,0,0,1", initial_budget=2.0, router_scale=10.0).eval()
    _, extra = model(random_tokens(), features_only=True)
    for layer, want in zip(extra["budget"], ([2, 3], [0, 3])):
        assert layer["heads"].eq(2).all()
        assert all(row.nonzero().flatten().tolist() == want for row in layer["selected"])
    router = next(model.budgeted_attentions()).router
    scores = torch.tensor([0.0, 1, 5, 2])
    assert_close(router.relevance_proj.bias * 10.0, (scores - scores.mean()) / scores.std())
    # the rest of the router as without a prior: an input-dependent part learned on top
    plain = next(build_model(initial_budget=2.0, router_scale=10.0).budgeted_attentions()).router
    assert router.relevance_proj.weight.std().item() == pytest.approx(plain.relevance_proj.weight.std().item(), rel=0.3)


@pytest.mark.parametrize("mode, params", [
    (dict(head_selection="static", fixed_heads="2"), ["static_logits"]),
    (dict(head_selection="random", fixed_heads="2"), []),
    (dict(head_selection="kept", kept_heads="0;1"), []),
    (dict(), ["relevance_proj.weight", "relevance_proj.bias", "budget_proj.weight", "budget_proj.bias"]),
])
def test_each_mode_builds_only_the_router_it_uses(mode, params):
    attention = next(build_model(**mode).budgeted_attentions())
    assert [name for name, _ in attention.router.named_parameters()] == params
