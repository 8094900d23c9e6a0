"""Executing a chosen subset of heads: attention whose cost is proportional to the
heads it runs (BudgetFormer's inference path).

Pure functions of the input, the selection and the weights. On CPU the cost is the
GEMMs plus whatever feeds them, so the feeding is kept cheap: when every example runs
the same heads (always at batch 1) the weights are only sliced, never copied;
otherwise the examples are sorted so that those that chose a head sit side by side,
and every range of examples is one product on a view of the input with the heads
that share it. (The GPU path, gpu_heads.py, is built differently: no host
synchronisation and a fixed number of kernels.)"""

from typing import Dict, List, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class HeadMajorWeights(NamedTuple):
    qkv: Tensor  # H x 3d x C: q/k/v rows of every head side by side
    qkv_bias: Optional[Tensor]  # H x 3d
    out: Tensor  # H x d x C: out_proj's columns of every head, transposed
    out_bias: Optional[Tensor]  # C


def split_heads(t: Tensor, num_heads: int) -> Tensor:
    """T x B x (H*d) -> B x H x T x d"""
    T, B, _ = t.shape
    return t.view(T, B, num_heads, -1).permute(1, 2, 0, 3)


def merge_heads(t: Tensor) -> Tensor:
    """B x H x T x d -> T x B x (H*d)"""
    B, H, T, d = t.shape
    return t.permute(2, 0, 1, 3).reshape(T, B, H * d)


def keep_mask(key_padding_mask: Optional[Tensor]) -> Optional[Tensor]:
    """fairseq's padding mask (True = pad, B x T) as an SDPA mask (True = attend)."""
    if key_padding_mask is None:
        return None
    return ~key_padding_mask.bool()[:, None, None, :]


def head_runs(heads: List[int]) -> List[Tuple[int, int]]:
    """Ascending head indices as maximal runs of consecutive heads, [start, stop)."""
    runs: List[Tuple[int, int]] = []
    for h in heads:
        if runs and runs[-1][1] == h:
            runs[-1] = (runs[-1][0], h + 1)
        else:
            runs.append((h, h + 1))
    return runs


def head_major(q: nn.Linear, k: nn.Linear, v: nn.Linear, out: nn.Linear, num_heads: int) -> HeadMajorWeights:
    """The projections rearranged so that one head's (or one example's) weights are a
    single gather (copies: callers cache them)."""
    C = out.weight.size(0)
    H, d = num_heads, C // num_heads
    with torch.no_grad():  # an inference cache: never part of a graph
        qkv = torch.cat([p.weight.view(H, d, C) for p in (q, k, v)], dim=1)
        bias = None if q.bias is None else torch.cat([p.bias.view(H, d) for p in (q, k, v)], dim=1)
        out_weight = out.weight.view(C, H, d).permute(1, 2, 0).contiguous()
    return HeadMajorWeights(qkv, bias, out_weight, out.bias)


def sort_examples(selected: Tensor) -> Tensor:
    """An order of the examples in which the examples that chose a head mostly sit
    side by side: their head sets read as binary numbers, the most often chosen head
    the most significant bit, in decreasing order. Nested sets (the top-k of similar
    rankings) then give every head one range of examples; in practice a trained
    router's batch of 32 gives 1-2.5 ranges per head."""
    popular_first = selected.sum(dim=0).argsort(descending=True, stable=True)[:62]  # an int64 holds 62 bits
    bits = torch.pow(2, torch.arange(popular_first.numel() - 1, -1, -1, device=selected.device))
    return (selected[:, popular_first].long() * bits).sum(dim=1).argsort(descending=True, stable=True)


def head_ranges(selected: Tensor) -> Dict[Tuple[int, int], List[int]]:
    """For examples in a fixed order (``selected``: B x H), the maximal ranges
    ``[start, stop)`` of consecutive examples that chose a head, each with every head
    (ascending) that has exactly that range."""
    edges = F.pad(selected.t().to(torch.int8), (1, 1)).diff(dim=1)  # +1: a range starts, -1: it stops
    starts, stops = (edges == 1).nonzero(), (edges == -1).nonzero()
    ranges: Dict[Tuple[int, int], List[int]] = {}
    for h, start, stop in zip(starts[:, 0].tolist(), starts[:, 1].tolist(), stops[:, 1].tolist()):
        ranges.setdefault((start, stop), []).append(h)
    return ranges


def attend_selected(x: Tensor, key_padding_mask: Optional[Tensor], selected: Tensor,
                    weights: HeadMajorWeights) -> Tensor:
    """Only the selected heads of every example (``selected``: B x H, bool) computed.

    When every example runs the same heads (always at batch 1), the batch is one
    range in fairseq's own T x B x C layout. Otherwise the examples are sorted once
    (:func:`sort_examples`) so that the examples that chose a head form a few
    ranges, and every range of examples is attended on a view of the sorted input
    with exactly the heads that share that range (:func:`_attend`). No example is
    looped over and no head is computed for an example that did not choose it.
    Returns T x B x C, contiguous."""
    T, B, C = x.shape
    mask = keep_mask(key_padding_mask)
    result = x.new_empty(B * T, C)
    if weights.out_bias is None:
        result.zero_()
    else:
        result.copy_(weights.out_bias.expand(B * T, C))
    if B == 1 or bool((selected == selected[:1]).all()):
        _attend(x, mask, selected[0].nonzero().flatten().tolist(), weights, result, time_major=True)
        return result.view(T, B, C)
    order = sort_examples(selected)
    xs = x.transpose(0, 1).index_select(0, order)  # B x T x C, sorted: every range a view
    mask = None if mask is None else mask.index_select(0, order)
    for (start, stop), heads in head_ranges(selected.index_select(0, order)).items():
        _attend(xs[start:stop], None if mask is None else mask[start:stop], heads, weights,
                result[start * T:stop * T], time_major=False)
    # back in fairseq's order and layout (T x B x C, contiguous: the layer's residual
    # add, layer norm and FFN would otherwise all run on a transposed layout), in the
    # sorted input's memory, which is free now
    out = xs.view(T, B, C)
    out.transpose(0, 1).index_copy_(0, order, result.view(B, T, C))
    return out


def _attend(x: Tensor, mask: Optional[Tensor], heads: List[int], weights: HeadMajorWeights, result: Tensor,
            time_major: bool):
    """The given heads of every example of ``x`` (n x T x C, or T x n x C when
    ``time_major``; contiguous), their out_proj products added to ``result`` (n*T x C,
    rows in the order of ``x``'s first two dimensions).

    The q/k/v products (:func:`_pieces`) write into their columns of one buffer; one
    attention call covers all the heads; every out_proj product is added in place."""
    d = weights.out.size(1)
    rows = x.flatten(0, 1)
    pieces = _pieces(weights, heads, rows.size(0))
    qkv = x.new_empty(rows.size(0), len(heads) * 3 * d)
    column = 0
    for qkv_weight, qkv_bias, _ in pieces:
        width = qkv_weight.size(0)
        _product(rows, qkv_weight.t(), qkv[:, column:column + width], qkv_bias)
        column += width
    projected = qkv.view(*x.shape[:2], len(heads), 3, d)
    q, k, v = projected.permute(3, 1, 2, 0, 4) if time_major else projected.permute(3, 0, 2, 1, 4)
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # n x g x T x d
    context = (context.permute(2, 0, 1, 3) if time_major else context.transpose(1, 2)).reshape(rows.size(0), -1)
    column = 0
    for _, _, out_weight in pieces:
        width = out_weight.size(0)
        _product(context[:, column:column + width], out_weight, result, result)
        column += width


# From this many input rows on, one product with the heads' weights gathered beats one
# product per run of consecutive heads on views of them (2 cores: at 128 rows the runs
# win by 10-30%, at 32 x 128 the gather by 5-8%)
GATHER_ROWS = 512


def _pieces(weights: HeadMajorWeights, heads: List[int], rows: int) -> List[Tuple[Tensor, Optional[Tensor], Tensor]]:
    """The products that run ``heads`` (ascending) on ``rows`` input rows, as (q/k/v
    rows: g*3d x C, their bias, out_proj columns: g*d x C): one per run of
    consecutive heads on views of the weights, or, for many rows, one for all the
    heads with their weights gathered."""
    runs = [slice(first, last) for first, last in head_runs(heads)]
    if len(runs) > 1 and rows >= GATHER_ROWS:
        runs = [torch.tensor(heads, device=weights.qkv.device)]
    return [(weights.qkv[pick].flatten(0, 1), None if weights.qkv_bias is None else weights.qkv_bias[pick].flatten(),
             weights.out[pick].flatten(0, 1)) for pick in runs]


def _product(a: Tensor, b: Tensor, out: Tensor, add: Optional[Tensor]):
    """out = add + a @ b, written into ``out`` (a view); plain a @ b without ``add``.
    (out= rather than addmm_: FlopCounterMode counts addmm only. Autograd refuses
    out=, so this path is for inference, which is where BudgetedAttention uses it.)"""
    if add is None:
        torch.mm(a, b, out=out)
    else:
        torch.addmm(add, a, b, out=out)
