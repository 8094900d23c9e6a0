"""--head-selection nested: a per-input count of the first heads of every layer; the
prefix fast path on views of fairseq's own weights; the budget options it takes (those
it refuses: test_bad_input.py)."""

import argparse
import math

import pytest
import torch
from fairseq.models.transformer import TransformerConfig
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase

from budget_plugin.config import BudgetConfig
from budget_plugin.dial.settings import LayerDial
from budget_plugin.modules import BudgetedAttention, BudgetedEncoderLayer, NestedRouter, prefix_heads
from budget_plugin.modules.flops import attention_flops, flop_counter
from helpers import WeightCopies, assert_close, build_model, cuda_layout, random_tokens

T, C, H = 12, 48, 6
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}  # relative to the output's scale


def nested_attention(dtype=torch.float32, **options):
    """Nested attention in eval mode whose budget moves with the input."""
    attention = BudgetedAttention(C, H, BudgetConfig(head_selection="nested", **options), fixed_heads=H)
    with torch.no_grad():
        attention.router.budget_proj.weight.normal_(std=0.4 / C**0.5)
        attention.router.budget_proj.bias.zero_()
    return attention.eval().to(dtype)


def inputs(batch, padding=True, seed=0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(T, batch, C, generator=generator).to(dtype)
    if not padding:
        return x, None
    lengths = torch.randint(1, T + 1, (batch,), generator=generator)
    lengths[0] = T
    return x, torch.arange(T)[None, :] >= lengths[:, None]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("padding", [True, False])
@pytest.mark.parametrize("batch", [1, 7])
def test_prefix_path_equals_the_gated_reference(dtype, padding, batch):
    """Every count from 1 to H forced (one count for the batch), and the router's own
    per-input counts (mixed at batch 7), in every dtype the CPU runs."""
    attention = nested_attention(dtype)
    x, mask = inputs(batch, padding, dtype=dtype)
    for heads in [None, *range(1, H + 1)]:
        with torch.no_grad():
            fast, stats = attention(x, key_padding_mask=mask, dial=LayerDial(heads=heads))  # None: the router's counts
            expected = attention.attend_all_heads(x, mask, stats["selected"].to(dtype))
        assert fast.shape == x.shape and fast.dtype == dtype and fast.is_contiguous()
        assert_close(fast, expected, rtol=TOLERANCE[dtype], msg=f"heads {heads}")
        if heads is None and batch == 7:
            assert len(set(stats["heads"].tolist())) > 2, "the fixture should give examples different counts"


@pytest.mark.parametrize("heads", [None, 2])
def test_prefix_path_takes_any_layout_of_the_attention_output(heads, monkeypatch):
    """CUDA's flash kernel returns B x g x T x d laid out B x T x g x d: emulated on CPU."""
    attention = nested_attention()
    x, mask = inputs(5, seed=3)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        cuda_layout(torch.nn.functional.scaled_dot_product_attention))
    with torch.no_grad():
        fast, stats = attention(x, key_padding_mask=mask, dial=LayerDial(heads=heads))
        expected = attention.attend_all_heads(x, mask, stats["selected"].float())
    assert_close(fast, expected)


@pytest.mark.parametrize("batch", [1, 7])
def test_prefixes_run_on_views_of_fairseqs_weights(batch):
    """No op reads a projection's weights except views and products: no gather, no
    head-major copy, for one count and for mixed counts alike."""
    attention = nested_attention()
    x, mask = inputs(batch)
    weights = [p.weight for p in (attention.q_proj, attention.k_proj, attention.v_proj, attention.out_proj)]
    with torch.no_grad():
        heads = attention.router(x, mask).heads
        assert batch == 1 or len(set(heads.tolist())) > 1
        with WeightCopies(weights) as recorder:
            attention.attend_prefix(x, mask, heads)
    assert recorder.copies == []
    assert attention._head_major is None, "no head-major cache was built"


def test_out_proj_product_reads_the_column_slice_in_place():
    """F.linear/addmm on out_proj's first k*d columns: the BLAS call takes the row
    stride, so no copy of the slice is made below the dispatcher either (the profiler
    sees every op, nested ones included)."""
    attention = nested_attention()
    x, mask = inputs(5)
    width = 2 * (C // H)
    with torch.no_grad(), torch.profiler.profile(record_shapes=True) as profile:
        attention(x, key_padding_mask=mask, dial=LayerDial(heads=2))
    copies = [e for e in profile.events() if e.name in ("aten::copy_", "aten::clone", "aten::contiguous")]
    assert not [e for e in copies if [C, width] in e.input_shapes or [width, C] in e.input_shapes]
    assert any(e.name == "aten::addmm" and [width, C] in e.input_shapes for e in profile.events())


def test_the_prefix_path_computes_only_the_heads_each_example_runs():
    """Measured FLOPs of the mixed-count path (torch's counter) are the analytic FLOPs
    of exactly the heads the examples run, router excluded."""
    attention = nested_attention()
    x, mask = inputs(9, padding=False)
    with torch.no_grad():
        heads = attention.router(x, mask).heads
        with flop_counter() as counter:
            attention.attend_prefix(x, mask, heads)
    used, full = attention_flops(T, heads, C, H, router_outputs=0)
    assert len(set(heads.tolist())) > 2 and used < full
    assert counter.get_total_flops() == int(used.item())


def test_full_count_is_fairseqs_own_attention():
    """k = H anywhere in the batch is not enough: every example must run H heads; then
    the layer equals fairseq's encoder layer (fast path, reference path, training)."""
    args = argparse.Namespace(encoder_embed_dim=C, encoder_ffn_embed_dim=64, encoder_attention_heads=H,
                              dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, activation_fn="gelu")
    cfg = TransformerConfig.from_namespace(args)
    stock = TransformerEncoderLayerBase(cfg)
    budgeted = BudgetedEncoderLayer(cfg, BudgetConfig(head_selection="nested"), index=0, fixed_heads=H)
    missing, unexpected = budgeted.load_state_dict(stock.state_dict(), strict=False)
    assert not unexpected and sorted(missing) == ["self_attn.router.budget_proj.bias", "self_attn.router.budget_proj.weight"]
    x, mask = inputs(6)
    for mode in ("fast", "reference", "train"):
        budgeted.self_attn.fast_path = mode == "fast"
        stock.train(mode == "train"), budgeted.train(mode == "train")
        actual, stats = budgeted(x, mask, dial=LayerDial(heads=H))
        assert (stats["heads"] == H).all()
        assert_close(actual, stock(x, mask), msg=mode)


def test_the_router_predicts_a_count_and_runs_a_prefix():
    attention = nested_attention(min_heads=2)
    router = attention.router
    assert not hasattr(router, "relevance_proj") and router.outputs == 1
    x, mask = inputs(16)
    route = router(x, mask)
    assert torch.equal(route.heads, route.budget.round().clamp(2, H).long())
    assert len(set(route.heads.tolist())) > 2
    assert torch.equal(route.selected, torch.arange(H) < route.heads[:, None])
    assert torch.equal(route.gate, route.selected.float()), "forward value of the gate is the hard prefix"
    # the relevance is a statistic: uniform over the heads run, so top-k is still the selection
    assert_close(route.relevance, route.selected / route.heads[:, None].float())
    assert_close(route.relevance.sum(-1), torch.ones(16))
    assert not route.relevance.requires_grad
    assert router(x, mask, dial=LayerDial(heads=3)).selected.tolist() == [[True] * 3 + [False] * 3] * 16


def sigmoid(z):
    return 1 / (1 + math.exp(-z))


def test_straight_through_gradient_of_the_budget_by_hand():
    """One example, H = 4, m = 1, t = 0.5, router scale s = 10, budget projection zero
    but for its bias z: b = 1 + 3 sigmoid(s z). With L = sum_h c_h gate_h and
    gate_h = [h < round(b)] + ST(sigmoid((b - h - 0.5) / t)) (the rank of head h is h):
      dL/dz = s (H - m) sigmoid'(s z) * sum_h c_h u_h (1 - u_h) / t,  u_h = sigmoid((b - h - 0.5) / t)
    and nothing else of the router has a gradient (it has nothing else)."""
    router = NestedRouter(C, 4, BudgetConfig(head_selection="nested", budget_mask_temperature=0.5), fixed_heads=4).train()
    z, c, s = 0.03, [0.5, -1.0, 2.0, 0.25], 10.0
    with torch.no_grad():
        router.budget_proj.weight.zero_()
        router.budget_proj.bias.fill_(z)
    route = router(torch.randn(T, 1, C), None)
    (route.gate[0] * torch.tensor(c)).sum().backward()

    b = 1 + 3 * sigmoid(s * z)  # 2.72: rounds to 3 heads
    u = [sigmoid((b - h - 0.5) / 0.5) for h in range(4)]
    dz = s * 3 * sigmoid(s * z) * (1 - sigmoid(s * z)) * sum(ch * uh * (1 - uh) / 0.5 for ch, uh in zip(c, u))
    assert_close(route.budget, b)
    assert route.selected[0].tolist() == [True, True, True, False]
    assert route.gate[0].tolist() == [1.0, 1.0, 1.0, 0.0]
    assert_close(router.budget_proj.bias.grad, dz)
    assert [name for name, _ in router.named_parameters()] == ["budget_proj.weight", "budget_proj.bias"]


def test_training_gates_every_head_and_the_budget_learns_from_the_task():
    attention = nested_attention().train()
    x, mask = inputs(6)
    out, stats = attention(x.requires_grad_(), key_padding_mask=mask)
    out.square().sum().backward()
    assert attention.router.budget_proj.weight.grad.abs().sum() > 0
    assert attention.q_proj.weight.grad[:C // H].abs().sum() > 0, "head 0 always runs"
    assert torch.equal(stats["selected"], torch.arange(H) < stats["heads"][:, None])


@pytest.mark.parametrize("count", [1, 4, H])
def test_training_at_a_forced_count_computes_that_prefix_with_the_gated_paths_gradients(count):
    """The sandwich's fixed widths train on the first ``count`` heads alone (less time
    and memory): the output and every gradient are those of every head computed and
    gated (the others' gates are 0, with no gradient to the budget)."""
    attention = nested_attention().train()
    attention.dropout_module.p = 0.0
    x, mask = inputs(5)

    def run(prefix: bool):
        attention.zero_grad()
        source = x.clone().requires_grad_()
        route = attention.router(source, mask, dial=LayerDial(heads=count))
        out = attention.attend_all_heads(source, mask, route.gate, count if prefix else None)
        (out * torch.linspace(-1, 1, C)).sum().backward()
        return out, source.grad, {n: p.grad.clone() for n, p in attention.named_parameters() if p.grad is not None}

    (out, dx, grads), (full, dx_full, grads_full) = run(prefix=True), run(prefix=False)
    assert_close(out, full)
    assert_close(dx, dx_full)
    assert sorted(grads) == sorted(grads_full)
    # each parameter's gradient relative to the whole gradient's magnitude: k_proj.bias's is
    # 0 but for rounding (the softmax ignores a bias shared by every key)
    scale = max(grad.abs().max().item() for grad in grads_full.values())
    for name, grad in grads.items():
        assert_close(grad, grads_full[name], scale=scale, msg=name)
    rows = count * C // H
    assert grads["q_proj.weight"][rows:].abs().sum() == 0 and grads["q_proj.weight"][:rows].abs().sum() > 0
    # the module's own forward takes the prefix at a fixed count
    assert_close(attention(x, key_padding_mask=mask, dial=LayerDial(heads=count))[0], full)


def test_the_budget_options_apply_to_nested():
    model = build_model(head_selection="nested", initial_budget=3.0, budget_pooling="first",
                        budget_mask_temperature=0.3, min_heads=2).eval()
    assert BudgetConfig(head_selection="nested", initial_budget=2.0).inert_options() == []
    with torch.no_grad():
        _, extra = model(random_tokens(), features_only=True)
    for layer in extra["budget"]:
        assert layer["heads"].eq(3).all()
        assert_close(layer["budget"], 3.0)
        # the analytic FLOPs count a router of one output (the budget)
        used, _ = attention_flops(12, layer["heads"], 64, 4, router_outputs=1)
        assert layer["attn_flops"].item() == pytest.approx(used.item())


def test_loading_a_checkpoint_keeps_the_nested_budget_predictor():
    """Loading drops the predictor parts a router does not hold (baselines saved before
    issue 25): for nested, relevance_proj, never its budget_proj."""
    model = build_model(head_selection="nested")
    with torch.no_grad():
        for attention in model.budgeted_attentions():
            attention.router.budget_proj.bias.fill_(0.123)
    state = model.state_dict()
    prefix = "encoder.sentence_encoder.layers.0.self_attn.router."
    state[prefix + "relevance_proj.weight"] = torch.zeros(4, 64)  # a learned model's
    model.upgrade_state_dict_named(state, "")
    assert prefix + "relevance_proj.weight" not in state
    fresh = build_model(head_selection="nested")
    fresh.load_state_dict(state)
    assert fresh.encoder.sentence_encoder.layers[0].self_attn.router.budget_proj.bias.item() == pytest.approx(0.123)


def test_prefix_counts_group_into_ranges():
    """Mixed counts given as a list run example by example as the gated reference does
    (the grouping logic, without the router)."""
    attention = nested_attention()
    x, mask = inputs(8, seed=4)
    counts = [3, 1, 6, 3, 2, 6, 1, 3]
    selected = torch.arange(H) < torch.tensor(counts)[:, None]
    with torch.no_grad():
        fast = prefix_heads.attend_prefix(x, mask, counts, attention.q_proj, attention.k_proj, attention.v_proj,
                                          attention.out_proj, H)
        expected = attention.attend_all_heads(x, mask, selected.float())
    assert_close(fast, expected)


def test_fast_path_statistics_are_the_reference_paths_computed_when_read(monkeypatch):
    """On the fast path the selection, relevance and FLOPs of a prefix are computed only
    when read (serving reads none), and then equal the reference path's."""
    attention = nested_attention()
    x, mask = inputs(7)
    with torch.no_grad():
        attention.fast_path = False
        _, expected = attention(x, key_padding_mask=mask)
        attention.fast_path = True
        _, stats = attention(x, key_padding_mask=mask)
        with monkeypatch.context() as patched:  # nothing derived is computed unless read
            patched.setattr("budget_plugin.modules.budgeted_attention.attention_flops", None)
            patched.setattr(attention.router, "prefix", None)
            attention(x, key_padding_mask=mask)
    assert type(expected) is dict and sorted(stats) == sorted(expected)
    for key, value in expected.items():  # the fast path works the budgets out on the host, in float64
        if key in ("budget", "budget_logit"):
            assert_close(stats[key], value, msg=key)
        else:
            assert torch.equal(stats[key], value), key
    stats["layer"] = 3
    assert len(stats) == 8 and stats["layer"] == 3


def test_layer_statistics_compute_each_group_once_and_keep_what_was_set():
    from budget_plugin.modules.statistics import LayerStatistics

    calls = []
    stats = LayerStatistics({"a": 1}, {("b", "c"): lambda: calls.append("bc") or (2, 3)})
    assert sorted(stats) == ["a", "b", "c"] and calls == []
    stats["c"] = 30  # set before the group is computed: kept
    assert stats["b"] == 2 and stats["c"] == 30 and calls == ["bc"]
    assert dict(stats) == {"a": 1, "b": 2, "c": 30} and calls == ["bc"]
    del stats["a"]
    assert len(stats) == 2


@pytest.mark.parametrize("heads", [None, 3])
def test_prefix_path_under_autocast(heads):
    """fairseq-train --bf16's validation and the benchmark's mixed precision: autocast
    casts the products' inputs; the prefix path returns what the reference path does."""
    attention = nested_attention()
    x, mask = inputs(7)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        fast, stats = attention(x, key_padding_mask=mask, dial=LayerDial(heads=heads))
        expected = attention.attend_all_heads(x, mask, stats["selected"].float())
    assert fast.dtype == expected.dtype == torch.bfloat16
    assert_close(fast, expected, rtol=2e-2)  # bfloat16's 8 bits of mantissa
    assert heads or len(set(stats["heads"].tolist())) > 1
