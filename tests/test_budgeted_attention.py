"""The attention math: budgets, masks, exact zeros, equivalence, gradients."""

import argparse

import pytest
import torch

from budget_plugin.modules import BudgetConfig, BudgetedAttention, BudgetedEncoderLayer, Exploration
from fairseq.models.transformer import TransformerConfig
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase

T, B, C, H = 10, 6, 32, 4


def make_attention(min_heads=1, spread=4.0, **budget):
    """Random attention whose budget predictor gives different budgets per example."""
    attention = BudgetedAttention(C, H, BudgetConfig(min_heads=min_heads, **budget))
    with torch.no_grad():
        attention.budget_proj.weight.normal_(std=spread / C**0.5)
        attention.budget_proj.bias.zero_()
        attention.relevance_proj.weight.normal_(std=1.0)
    return attention.eval()


def make_inputs(lengths=(10, 7, 3, 10, 1, 5)):
    x = torch.randn(T, B, C)
    padding = torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None]  # B x T
    return x, padding


def test_routes_have_per_example_budgets_within_bounds():
    attention, (x, padding) = make_attention(min_heads=2), make_inputs()
    route = attention.route(x, padding)
    assert route.heads.shape == (B,) and route.selected.shape == (B, H)
    assert route.heads.min() >= 2 and route.heads.max() <= H
    assert torch.equal(route.selected.sum(dim=1), route.heads)
    assert len(set(route.heads.tolist())) > 1, "the fixture should give examples different k"
    assert torch.equal(route.gate, route.selected.float()), "forward value of the gate is the hard mask"
    # the selected heads are the top-k by relevance
    for b in range(B):
        top = route.relevance[b].topk(int(route.heads[b])).indices
        assert set(top.tolist()) == set(route.selected[b].nonzero().flatten().tolist())


@pytest.mark.parametrize("path", ["fast", "reference"])
def test_unselected_heads_contribute_exactly_zero(path):
    attention, (x, padding) = make_attention(attention_path=path), make_inputs()
    attention.forced_heads = 2
    with torch.no_grad():
        route = attention.route(x, padding)
        before, _ = attention.forward_budgeted(x, padding)
        d = attention.head_dim
        for h in range(H):  # wreck every head that example 0 did not select
            if not route.selected[0, h]:
                rows = slice(h * d, (h + 1) * d)
                for proj in (attention.q_proj, attention.k_proj, attention.v_proj):
                    proj.weight[rows] = 1e3
                attention.out_proj.weight[:, rows] = 1e3
        after, _ = attention.forward_budgeted(x, padding)
    assert torch.equal(before[:, 0], after[:, 0])


def stock_and_budgeted_layers(dropout=0.0):
    args = argparse.Namespace(
        encoder_embed_dim=C, encoder_ffn_embed_dim=64, encoder_attention_heads=H,
        dropout=dropout, attention_dropout=dropout, activation_dropout=0.0, activation_fn="gelu",
    )
    cfg = TransformerConfig.from_namespace(args)
    stock = TransformerEncoderLayerBase(cfg)
    budgeted = BudgetedEncoderLayer(cfg, BudgetConfig())
    missing, unexpected = budgeted.load_state_dict(stock.state_dict(), strict=False)
    assert not unexpected and all("relevance_proj" in k or "budget_proj" in k for k in missing)
    return stock, budgeted


@pytest.mark.parametrize("mode", ["eval_fast", "eval_reference", "train"])
def test_full_budget_equals_fairseq_encoder_layer(mode):
    stock, budgeted = stock_and_budgeted_layers()
    budgeted.self_attn.fast_path = mode == "eval_fast"
    budgeted.self_attn.forced_heads = H
    for layer in (stock, budgeted):
        layer.train(mode == "train")
    x, padding = make_inputs()
    expected = stock(x, padding)
    actual, stats = budgeted(x, padding)
    assert (stats["heads"] == H).all()
    assert (actual - expected).abs().max().item() <= 1e-5


def test_default_initial_budget_is_all_heads():
    stock, budgeted = stock_and_budgeted_layers()
    x, padding = make_inputs()
    stock.eval(), budgeted.eval()
    actual, stats = budgeted(x, padding)
    assert (stats["heads"] == H).all()
    assert (actual - stock(x, padding)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("forced", [None, 1, 2, 3])
def test_fast_path_equals_reference_path(forced):
    attention, (x, padding) = make_attention(), make_inputs()
    attention.forced_heads = forced
    with torch.no_grad():
        attention.fast_path = True
        fast, stats = attention.forward_budgeted(x, padding)
        attention.fast_path = False
        reference, _ = attention.forward_budgeted(x, padding)
    assert (fast - reference).abs().max().item() <= 1e-5
    heads = stats["heads"]
    assert forced is not None or len(set(heads.tolist())) > 1


def test_fast_path_groups_by_head_and_by_head_set():
    """Both grouping strategies are exercised and agree with the reference."""
    torch.manual_seed(3)
    attention = make_attention()
    x = torch.randn(T, 32, C)  # many examples: many distinct head sets -> grouped by head
    padding = torch.arange(T)[None, :] >= torch.randint(1, T + 1, (32, 1))
    with torch.no_grad():
        route = attention.route(x, padding)
        assert len(torch.unique(route.selected, dim=0)) > H
        fast, _ = attention.forward_budgeted(x, padding)
        attention.fast_path = False
        reference, _ = attention.forward_budgeted(x, padding)
        assert (fast - reference).abs().max().item() <= 1e-5
        # a batch of one distinct head set -> one gathered product
        attention.fast_path = True
        same = x[:, :1].expand(T, 5, C).contiguous()
        fast1, stats = attention.forward_budgeted(same, None)
        attention.fast_path = False
        ref1, _ = attention.forward_budgeted(same, None)
    assert len(torch.unique(stats["selected"], dim=0)) == 1
    assert (fast1 - ref1).abs().max().item() <= 1e-5


def test_gradients_reach_relevance_scorer_and_budget_predictor():
    attention, (x, padding) = make_attention(), make_inputs()
    attention.train()
    attention.exploration = Exploration(rate=1.0, noise=1.0, uniform=0.1, temperature=2.0)
    out, stats = attention.forward_budgeted(x.requires_grad_(), padding)
    (out**2).sum().backward()
    for param in (attention.relevance_proj.weight, attention.budget_proj.weight, attention.budget_proj.bias):
        assert param.grad is not None and param.grad.abs().sum() > 0


def test_budget_term_gradient_lowers_budget():
    attention, (x, padding) = make_attention(), make_inputs()
    attention.train()
    _, stats = attention.forward_budgeted(x, padding)
    stats["budget"].mean().backward()
    assert attention.budget_proj.bias.grad > 0  # descending it lowers the budget


def test_exploration_is_off_in_eval_mode():
    attention, (x, padding) = make_attention(), make_inputs()
    attention.exploration = Exploration(rate=1.0, noise=5.0, uniform=1.0, temperature=2.0)
    with torch.no_grad():
        first, s1 = attention.forward_budgeted(x, padding)
        second, s2 = attention.forward_budgeted(x, padding)
    assert torch.equal(first, second) and torch.equal(s1["selected"], s2["selected"])
    attention.train()
    picks = {tuple(attention.route(x, padding).selected.flatten().tolist()) for _ in range(5)}
    assert len(picks) > 1, "training with exploration samples different heads"


@pytest.mark.parametrize("pooling", ["mean", "first"])
def test_padding_does_not_change_the_summary(pooling):
    attention = make_attention(budget_pooling=pooling)
    x = torch.randn(4, 1, C)
    padded = torch.cat([x, torch.randn(3, 1, C) * 100], dim=0)
    mask = torch.tensor([[False] * 4 + [True] * 3])
    assert torch.allclose(attention.summarize(x, None), attention.summarize(padded, mask), atol=1e-6)


def test_flops_scale_with_heads():
    attention = make_attention()
    used_half, full = attention.flops(128, torch.full((8,), H // 2))
    used_all, _ = attention.flops(128, torch.full((8,), H))
    assert used_all > full  # the router costs a little on top of all heads
    assert abs(used_half.item() / full.item() - 0.5) < 0.01


@pytest.mark.parametrize("min_heads", [0, H + 1])
def test_min_heads_out_of_range_is_refused(min_heads):
    with pytest.raises(ValueError, match="min-heads"):
        BudgetedAttention(C, H, BudgetConfig(min_heads=min_heads))


def test_fast_path_runs_with_autograd_enabled():
    """Inference without torch.no_grad() (as hub users call it) takes the fast path too."""
    attention, (x, padding) = make_attention(), make_inputs()
    attention.forced_heads = 3
    fast, _ = attention.forward_budgeted(x, padding)
    attention.fast_path = False
    reference, _ = attention.forward_budgeted(x, padding)
    assert (fast - reference).abs().max().item() <= 1e-5
