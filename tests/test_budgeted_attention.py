"""The attention math: budgets, masks, exact zeros, equivalence, gradients."""

import argparse
import math

import pytest
import torch
from fairseq.models.transformer import TransformerConfig
from fairseq.modules import MultiheadAttention
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase

from budget_plugin.config import BudgetConfig
from budget_plugin.dial.settings import LayerDial
from budget_plugin.modules import BudgetedAttention, BudgetedEncoderLayer, LearnedRouter
from budget_plugin.modules.flops import attention_flops
from budget_plugin.modules.router import summarize
from helpers import assert_close

T, B, C, H = 10, 6, 32, 4


def make_attention(min_heads=1, spread=4.0, **budget):
    """Random attention whose budget predictor gives different budgets per example."""
    attention = BudgetedAttention(C, H, BudgetConfig(min_heads=min_heads, **budget), fixed_heads=H)
    with torch.no_grad():
        attention.router.budget_proj.weight.normal_(std=spread / C**0.5)
        attention.router.budget_proj.bias.zero_()
        attention.router.relevance_proj.weight.normal_(std=1.0)
    return attention.eval()


def make_inputs(lengths=(10, 7, 3, 10, 1, 5)):
    x = torch.randn(T, B, C)
    padding = torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None]  # B x T
    return x, padding


def test_routes_have_per_example_budgets_within_bounds():
    attention, (x, padding) = make_attention(min_heads=2), make_inputs()
    route = attention.router(x, padding)
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
    dial = LayerDial(heads=2)
    with torch.no_grad():
        route = attention.router(x, padding, dial=dial)
        before, _ = attention(x, key_padding_mask=padding, dial=dial)
        d = attention.head_dim
        for h in range(H):  # wreck every head that example 0 did not select
            if not route.selected[0, h]:
                rows = slice(h * d, (h + 1) * d)
                for proj in (attention.q_proj, attention.k_proj, attention.v_proj):
                    proj.weight[rows] = 1e3
                attention.out_proj.weight[:, rows] = 1e3
        after, _ = attention(x, key_padding_mask=padding, dial=dial)
    assert torch.equal(before[:, 0], after[:, 0])


def test_fairseqs_call_is_budgeted():
    """``self_attn(x, x, x, key_padding_mask=...)``, as fairseq calls attention, runs the
    budget: with one dialled head it differs from fairseq's all-heads attention."""
    attention, (x, padding) = make_attention(), make_inputs()
    with torch.no_grad():
        called, stats = attention(x, x, x, key_padding_mask=padding, dial=LayerDial(heads=1))
        reference = attention.attend_all_heads(x, padding, stats["selected"].float())
        every_head = MultiheadAttention.forward(attention, x, x, x, key_padding_mask=padding, need_weights=False)[0]
    assert (stats["heads"] == 1).all()
    assert_close(called, reference)
    assert (called - every_head).abs().max() > 1e-2


@pytest.mark.parametrize("kwargs,named", [
    (dict(attn_mask=torch.zeros(T, T)), "attn_mask"),
    (dict(incremental_state={}), "incremental_state"),
    (dict(need_weights=True), "need_weights"),
    (dict(need_head_weights=True), "need_head_weights"),
    (dict(static_kv=True), "static_kv"),
    (dict(key=torch.randn(T, B, C)), "key or value other than the query"),
])
def test_calls_it_cannot_honour_are_refused(kwargs, named):
    attention, (x, padding) = make_attention(), make_inputs()
    with pytest.raises(ValueError, match=named):
        attention(x, key_padding_mask=padding, **kwargs)


def stock_and_budgeted_layers(dropout=0.0):
    args = argparse.Namespace(
        encoder_embed_dim=C, encoder_ffn_embed_dim=64, encoder_attention_heads=H,
        dropout=dropout, attention_dropout=dropout, activation_dropout=0.0, activation_fn="gelu",
    )
    cfg = TransformerConfig.from_namespace(args)
    stock = TransformerEncoderLayerBase(cfg)
    budgeted = BudgetedEncoderLayer(cfg, BudgetConfig(), index=0, fixed_heads=H)
    missing, unexpected = budgeted.load_state_dict(stock.state_dict(), strict=False)
    assert not unexpected and all(".router." in k for k in missing)
    return stock, budgeted


@pytest.mark.parametrize("mode", ["eval_fast", "eval_reference", "train"])
def test_full_budget_equals_fairseq_encoder_layer(mode):
    stock, budgeted = stock_and_budgeted_layers()
    budgeted.self_attn.fast_path = mode == "eval_fast"
    for layer in (stock, budgeted):
        layer.train(mode == "train")
    x, padding = make_inputs()
    expected = stock(x, padding)
    actual, stats = budgeted(x, padding, dial=LayerDial(heads=H))
    assert (stats["heads"] == H).all() and stats["layer"] == 0
    assert_close(actual, expected)


def test_default_initial_budget_is_all_heads():
    stock, budgeted = stock_and_budgeted_layers()
    x, padding = make_inputs()
    stock.eval(), budgeted.eval()
    actual, stats = budgeted(x, padding)
    assert (stats["heads"] == H).all()
    assert_close(actual, stock(x, padding))


@pytest.mark.parametrize("heads", [None, 1, 2, 3])
def test_fast_path_equals_reference_path(heads):
    attention, (x, padding) = make_attention(), make_inputs()
    dial = LayerDial(heads=heads)  # None: the router's budgets
    with torch.no_grad():
        attention.fast_path = True
        fast, stats = attention(x, key_padding_mask=padding, dial=dial)
        attention.fast_path = False
        reference, _ = attention(x, key_padding_mask=padding, dial=dial)
    assert_close(fast, reference)
    assert heads is not None or len(set(stats["heads"].tolist())) > 1


@pytest.mark.parametrize("training", [False, True])
def test_a_dials_heads_hold_for_its_call_only(training):
    """The count is an argument of the call, in training as at evaluation: the next call
    without it runs the router's own budgets; a count outside [1, H] is refused."""
    attention, (x, padding) = make_attention(), make_inputs()
    attention.train(training)
    _, dialled = attention(x, key_padding_mask=padding, dial=LayerDial(heads=1))
    _, own = attention(x, key_padding_mask=padding)
    assert (dialled["heads"] == 1).all() and len(set(own["heads"].tolist())) > 1
    for heads in (0, H + 1):
        with pytest.raises(ValueError, match=rf"a dial's heads must be in \[1, {H}\], got {heads}"):
            attention(x, key_padding_mask=padding, dial=LayerDial(heads=heads))


def sigmoid(z):
    return 1 / (1 + math.exp(-z))


def test_straight_through_gradients_have_the_values_worked_out_by_hand():
    """One example, H = 4, m = 1, t = 0.5, temperature 1. The router reads a summary s
    whose projections are zero, so b = 1 + 3 sigmoid(z) with z = budget bias, and
    p = softmax(relevance bias). With loss L = sum_h c_h gate_h:
      dL/dz        = (H - m) sigmoid'(z) * sum_h c_h s_h (1 - s_h) / t,
                     s_h = sigmoid((b - rank_h - 0.5) / t)
      dL/dbias_r_j = H p_j (c_j - sum_h p_h c_h)    (d(H p_h)/dlogit_j, temperature 1)"""
    cfg = BudgetConfig(min_heads=1, budget_mask_temperature=0.5, router_scale=1.0)  # the plain parametrization
    router = LearnedRouter(C, H, cfg, fixed_heads=H).train()
    z, logits, c = 0.3, [2.0, 1.0, 0.0, -1.0], [0.5, -1.0, 2.0, 0.25]
    with torch.no_grad():
        router.relevance_proj.weight.zero_()
        router.relevance_proj.bias.copy_(torch.tensor(logits))
        router.budget_proj.bias.fill_(z)
    route = router(torch.randn(T, 1, C), None)
    (route.gate[0] * torch.tensor(c)).sum().backward()

    b = 1 + 3 * sigmoid(z)  # 2.72: rounds to 3 heads
    soft = [sigmoid((b - rank - 0.5) / 0.5) for rank in range(H)]  # rank h == head h here
    dz = 3 * sigmoid(z) * (1 - sigmoid(z)) * sum(ch * s * (1 - s) / 0.5 for ch, s in zip(c, soft))
    p = [math.exp(v) / sum(math.exp(u) for u in logits) for v in logits]
    mean_c = sum(ph * ch for ph, ch in zip(p, c))
    dlogits = [H * pj * (cj - mean_c) for pj, cj in zip(p, c)]
    assert route.selected[0].tolist() == [True, True, True, False]
    assert_close(router.budget_proj.bias.grad, dz)
    assert_close(router.relevance_proj.bias.grad, dlogits)


def test_gradients_reach_relevance_scorer_and_budget_predictor():
    attention, (x, padding) = make_attention(exploration_updates=10), make_inputs()
    attention.train()
    out, _ = attention(x.requires_grad_(), key_padding_mask=padding)
    (out**2).sum().backward()
    router = attention.router
    for param in (router.relevance_proj.weight, router.budget_proj.weight, router.budget_proj.bias):
        assert param.grad is not None and param.grad.abs().sum() > 0


def test_budget_term_gradient_lowers_budget():
    attention, (x, padding) = make_attention(), make_inputs()
    attention.train()
    _, stats = attention(x, key_padding_mask=padding)
    stats["budget"].mean().backward()
    assert attention.router.budget_proj.bias.grad > 0  # descending it lowers the budget


def test_exploration_follows_the_update_number_and_is_off_in_eval_mode():
    attention = make_attention(exploration_updates=100, exploration_noise=5.0, exploration_uniform=1.0)
    x, padding = make_inputs()
    with torch.no_grad():
        first, s1 = attention(x, key_padding_mask=padding)
        second, s2 = attention(x, key_padding_mask=padding)
    assert torch.equal(first, second) and torch.equal(s1["selected"], s2["selected"])
    attention.train()
    picks = {tuple(attention.router(x, padding).selected.flatten().tolist()) for _ in range(5)}
    assert len(picks) > 1, "training at update 0 explores: different heads each call"
    attention.router.set_num_updates(100)  # the schedule has ended: top-k again
    picks = {tuple(attention.router(x, padding).selected.flatten().tolist()) for _ in range(5)}
    assert len(picks) == 1


@pytest.mark.parametrize("pooling", ["mean", "first"])
def test_padding_does_not_change_the_summary(pooling):
    x = torch.randn(4, 1, C)
    padded = torch.cat([x, torch.randn(3, 1, C) * 100], dim=0)
    mask = torch.tensor([[False] * 4 + [True] * 3])
    assert_close(summarize(x, None, pooling), summarize(padded, mask, pooling))


def test_flops_scale_with_heads():
    used_half, full = attention_flops(128, torch.full((8,), H // 2), C, H)
    used_all, _ = attention_flops(128, torch.full((8,), H), C, H)
    assert used_all > full  # the router costs a little on top of all heads
    assert abs(used_half.item() / full.item() - 0.5) < 0.01
    per_head = 8.0 * 128 * C * (C // H) + 4.0 * 128 * 128 * (C // H)  # projections + scores/values
    assert full.item() == 8 * H * per_head


def test_fast_path_runs_with_autograd_enabled():
    """Inference without torch.no_grad() (as hub users call it) takes the fast path too."""
    attention, (x, padding) = make_attention(), make_inputs()
    dial = LayerDial(heads=3)
    fast, _ = attention(x, key_padding_mask=padding, dial=dial)
    attention.fast_path = False
    reference, _ = attention(x, key_padding_mask=padding, dial=dial)
    assert_close(fast, reference)


def test_router_scale_starts_at_the_same_budget_and_moves_it_faster():
    """--router-scale s multiplies the router's logits: the same initial budget for any s,
    and one Adam step moves the budget about s times as far."""
    x = torch.randn(T, B, C)
    moved = {}
    for scale in (1.0, 10.0):
        torch.manual_seed(0)
        router = LearnedRouter(C, H, BudgetConfig(router_scale=scale), fixed_heads=H).train()
        before = router(x, None).budget
        assert_close(before, H - 0.25)
        optimizer = torch.optim.Adam(router.parameters(), lr=1e-3)
        before.mean().backward()
        optimizer.step()
        moved[scale] = (before - router(x, None).budget).mean().item()
    assert moved[1.0] > 0 and 5 < moved[10.0] / moved[1.0] < 20
