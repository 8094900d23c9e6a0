"""The CPU fast path: examples sorted into ranges, each range's heads as runs on views
of the head-major weights or gathered, one head set in fairseq's layout, learned
(varying) k, and any memory layout of the attention kernel's output (CUDA's)."""

import pytest
import torch

from budget_plugin.dial.settings import LayerDial
from budget_plugin.modules import head_subset
from helpers import WeightCopies, assert_close, cuda_layout, routed_attention

T, C, H = 12, 48, 6


def make_attention():
    return routed_attention(C, H)


def padded(batch, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(T, batch, C, generator=generator)
    lengths = torch.randint(1, T + 1, (batch,), generator=generator)
    lengths[0] = T
    return x, torch.arange(T)[None, :] >= lengths[:, None]


def reference(attention, x, padding, selected):
    return attention.attend_all_heads(x, padding, selected.to(x.dtype))


@pytest.mark.parametrize("gather", [False, True])
@pytest.mark.parametrize("heads", [None, 1, 3, 5])
@pytest.mark.parametrize("batch", [1, 2, 16])
def test_fast_path_equals_reference(gather, heads, batch, monkeypatch):
    """``gather``: every range's heads gathered into one product (the branch for many
    rows), else one product per run of consecutive heads."""
    attention = make_attention()
    if gather:
        monkeypatch.setattr(head_subset, "GATHER_ROWS", 0)
    x, padding = padded(batch)
    with torch.no_grad():
        selected = attention.router(x, padding, dial=LayerDial(heads=heads)).selected  # None: the router's budgets
        fast = attention.attend_selected_heads(x, padding, selected)
        expected = reference(attention, x, padding, selected)
    assert fast.shape == x.shape
    assert_close(fast, expected)
    if heads is None and batch == 16:
        assert len(set(selected.sum(1).tolist())) > 1, "the learned budget varies per example"


def test_with_autograd_recording_eval_mode_takes_the_gated_path():
    """The fast path is inference only: with gradients asked for (eval mode, no
    torch.no_grad), the layer computes every head and gates them, so every weight gets
    its gradient; the output is the fast path's."""
    attention = make_attention()
    x, padding = padded(5, seed=2)
    x.requires_grad_(True)
    dial = LayerDial(heads=3)
    out, stats = attention(x, key_padding_mask=padding, dial=dial)
    with torch.no_grad():
        fast, _ = attention(x, key_padding_mask=padding, dial=dial)
    assert_close(out, fast)
    out.square().sum().backward()
    q_grad = attention.q_proj.weight.grad.clone()
    assert x.grad is not None and x.grad.abs().sum() > 0
    attention.zero_grad()  # the heads' own gradients (the router's reach x, not q_proj)
    reference(attention, x.detach(), padding, stats["selected"]).square().sum().backward()
    assert_close(attention.q_proj.weight.grad, q_grad)
    assert q_grad.abs().sum() > 0


@pytest.mark.parametrize("heads", [None, 2])
@pytest.mark.parametrize("batch", [1, 5])
def test_fast_path_takes_any_layout_of_the_attention_output(heads, batch, monkeypatch):
    """The fast path once called ``.view`` on SDPA's output, which CUDA lays out
    differently: batch 1 crashed there. Emulated here on CPU."""
    attention = make_attention()
    x, padding = padded(batch, seed=3)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        cuda_layout(torch.nn.functional.scaled_dot_product_attention))
    q = torch.randn(2, 3, 4, 8)
    assert not torch.nn.functional.scaled_dot_product_attention(q, q, q).is_contiguous()
    with torch.no_grad():
        selected = attention.router(x, padding, dial=LayerDial(heads=heads)).selected
        fast = attention.attend_selected_heads(x, padding, selected)
        expected = reference(attention, x, padding, selected)
    assert_close(fast, expected)


def test_sorted_examples_give_nested_head_sets_one_range_per_head():
    """The top-k of one ranking, k varying per example: after sorting, the examples
    that chose any head are one range, and heads with the same range share it."""
    ranking = [4, 1, 5, 0, 2, 3]
    ks = [2, 6, 1, 4, 4, 3, 2]
    selected = torch.zeros(len(ks), H, dtype=torch.bool)
    for b, k in enumerate(ks):
        selected[b, ranking[:k]] = True
    order = head_subset.sort_examples(selected)
    ranges = head_subset.head_ranges(selected[order])
    assert sorted(h for heads in ranges.values() for h in heads) == list(range(H))
    for (start, stop), heads in ranges.items():
        assert start == 0 and all(selected[order][start:stop, heads].all(0))
        assert not selected[order][stop:, heads].any()
    assert ranges[(0, 7)] == [4]  # everyone's first choice: the whole batch


RUNS = {
    (0,): [(0, 1)], (5,): [(5, 6)], (1, 2, 3): [(1, 4)], (0, 2, 4): [(0, 1), (2, 3), (4, 5)],
    (0, 1, 3, 4, 5): [(0, 2), (3, 6)], (0, 1, 2, 3, 4): [(0, 5)],
}


@pytest.mark.parametrize("heads", sorted(RUNS))
def test_head_sets_split_into_runs_of_consecutive_heads(heads):
    attention = make_attention()
    assert head_subset.head_runs(list(heads)) == RUNS[heads]
    x, padding = padded(3, seed=1)
    selected = torch.zeros(3, H, dtype=torch.bool)
    selected[:, list(heads)] = True
    with torch.no_grad():
        out = attention.attend_selected_heads(x, padding, selected)
        expected = reference(attention, x, padding, selected)
    assert_close(out, expected)


@pytest.mark.parametrize("batch", [1, 7])
def test_one_head_set_runs_on_views_of_the_cached_weights(batch):
    """At batch 1, or when every example runs the same heads, the selected heads'
    rows and columns of the (cached) head-major weights are sliced, never copied
    (the recorder sees a gather, which shows that it sees copies)."""
    attention = make_attention()
    x, padding = padded(1)
    x, padding = x.expand(T, batch, C).contiguous(), padding.expand(batch, T)
    with torch.no_grad():
        selected = attention.router(x, padding, dial=LayerDial(heads=2)).selected
        assert len(torch.unique(selected, dim=0)) == 1
        cached = attention.head_major_weights()
        with WeightCopies([cached.qkv, cached.out]) as one_set:
            fast = attention.attend_selected_heads(x, padding, selected)
        assert one_set.copies == []
        assert_close(fast, reference(attention, x, padding, selected))
        with WeightCopies([cached.qkv, cached.out]) as gathered:
            cached.qkv.index_select(0, torch.tensor([0, 2]))
        assert gathered.copies == ["index_select"]


def test_fast_path_sees_weights_an_optimizer_updated_through_data():
    """fairseq's optimizers write ``p.data`` in place, which bumps no version counter:
    the head-major weight cache must not outlive a training step (it once did, and
    fairseq-train's validation scored stale weights)."""
    attention = make_attention()
    x, padding = padded(16)
    with torch.no_grad():
        selected = attention.router(x, padding).selected
        assert len(set(map(tuple, selected.tolist()))) > 1, "several head sets: the cached path"
        attention.attend_selected_heads(x, padding, selected)  # fills the cache
        attention.train()
        for parameter in attention.parameters():  # what fairseq.optim.adam does
            parameter.data.add_(0.5 * torch.randn_like(parameter))
        attention.eval()
        fast = attention.attend_selected_heads(x, padding, selected)
        expected = reference(attention, x, padding, selected)
    assert_close(fast, expected)  # outputs of ~20 after the update


def test_the_cache_follows_in_place_edits_of_the_weights():
    """An in-place edit bumps a weight's version: the head-major copy is rebuilt."""
    attention = make_attention()
    x, padding = padded(16)
    with torch.no_grad():
        selected = attention.router(x, padding).selected
        before = attention.attend_selected_heads(x, padding, selected)
        attention.v_proj.weight.mul_(2.0)
        after = attention.attend_selected_heads(x, padding, selected)
        expected = reference(attention, x, padding, selected)
    assert not torch.equal(before, after)
    assert_close(after, expected)
