"""The fast inference path: head by head with per-example output products, chunking,
head runs at batch 1, one shared head set, learned (varying) k."""

import pytest
import torch

from budget_plugin.modules import BudgetConfig, BudgetedAttention

T, C, H = 12, 48, 6


def make_attention():
    attention = BudgetedAttention(C, H, BudgetConfig())
    with torch.no_grad():
        attention.relevance_proj.weight.normal_(std=1.0)
        attention.budget_proj.weight.normal_(std=4.0 / C**0.5)
        attention.budget_proj.bias.zero_()
    return attention.eval()


def padded(batch, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(T, batch, C, generator=generator)
    lengths = torch.randint(1, T + 1, (batch,), generator=generator)
    lengths[0] = T
    return x, torch.arange(T)[None, :] >= lengths[:, None]


def reference(attention, x, padding, selected):
    return attention.attend_all_heads(x, padding, selected.to(x.dtype))


@pytest.mark.parametrize("chunk", ["one example", "default"])
@pytest.mark.parametrize("forced", [None, 1, 3, 5])
@pytest.mark.parametrize("batch", [1, 2, 16])
@pytest.mark.parametrize("grad", [False, True])
def test_fast_path_equals_reference(chunk, forced, batch, grad):
    attention = make_attention()
    attention.forced_heads = forced
    if chunk == "one example":  # one output product per example
        attention._CHUNK_FLOATS = 1
    x, padding = padded(batch)
    with torch.set_grad_enabled(grad):  # eval with autograd on takes the out=-free branch
        selected = attention.route(x, padding).selected
        fast = attention.attend_selected_heads(x, padding, selected)
        expected = reference(attention, x, padding, selected)
    assert fast.shape == x.shape
    assert (fast - expected).abs().max().item() <= 1e-5
    if forced is None and batch == 16:
        assert len(set(selected.sum(1).tolist())) > 1, "the learned budget varies per example"


RUNS = {
    (0,): [(0, 1)], (5,): [(5, 6)], (1, 2, 3): [(1, 4)], (0, 2, 4): [(0, 1), (2, 3), (4, 5)],
    (0, 1, 3, 4, 5): [(0, 2), (3, 6)], (0, 1, 2, 3, 4): [(0, 5)],
}


@pytest.mark.parametrize("heads", sorted(RUNS))
def test_attend_heads_on_runs_of_heads(heads):
    attention = make_attention()
    assert attention._head_runs(torch.tensor(heads)) == RUNS[heads]
    x, padding = padded(3, seed=1)
    selected = torch.zeros(3, H, dtype=torch.bool)
    selected[:, list(heads)] = True
    with torch.no_grad():
        out = attention.attend_heads(x, padding, torch.tensor(heads))
        expected = reference(attention, x, padding, selected)
    assert (out - expected).abs().max().item() <= 1e-5


def test_identical_head_sets_share_one_product():
    attention = make_attention()
    attention.forced_heads = 2
    x, padding = padded(1)
    x = x.expand(T, 7, C).contiguous()
    padding = padding.expand(7, T)
    with torch.no_grad():
        selected = attention.route(x, padding).selected
        assert len(torch.unique(selected, dim=0)) == 1
        fast = attention.attend_selected_heads(x, padding, selected)
    assert (fast - reference(attention, x, padding, selected)).abs().max().item() <= 1e-5


def test_fast_path_weights_are_views_not_copies():
    """Editing a weight in place changes the next fast-path output: nothing is cached."""
    attention = make_attention()
    attention.forced_heads = 3
    x, padding = padded(4)
    with torch.no_grad():
        selected = attention.route(x, padding).selected
        before = attention.attend_selected_heads(x, padding, selected)
        attention.v_proj.weight.mul_(2.0)
        after = attention.attend_selected_heads(x, padding, selected)
        expected = reference(attention, x, padding, selected)
    assert not torch.equal(before, after)
    assert (after - expected).abs().max().item() <= 1e-5


def test_fast_path_sees_weights_an_optimizer_updated_through_data():
    """fairseq's optimizers write ``p.data`` in place, which bumps no version counter:
    the head-major weight cache must not outlive a training step (it once did, and
    fairseq-train's validation scored stale weights)."""
    attention = make_attention()
    x, padding = padded(16)
    with torch.no_grad():
        selected = attention.route(x, padding).selected
        assert len(set(map(tuple, selected.tolist()))) > 1, "several head sets: the cached path"
        attention.attend_selected_heads(x, padding, selected)  # fills the cache
        attention.train()
        for parameter in attention.parameters():  # what fairseq.optim.adam does
            parameter.data.add_(0.5 * torch.randn_like(parameter))
        attention.eval()
        fast = attention.attend_selected_heads(x, padding, selected)
        expected = reference(attention, x, padding, selected)
    assert (fast - expected).abs().max().item() <= 1e-5
