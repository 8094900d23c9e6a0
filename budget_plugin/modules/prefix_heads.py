"""Executing a prefix of the heads (``--head-selection nested``): example b runs heads
0..k_b-1, which are rows ``0:k_b*d`` of fairseq's own q_proj/k_proj/v_proj weights
and columns ``0:k_b*d`` of out_proj's. Both are views, so a prefix costs no gather, no
head-major copy and no product per run of heads: one product per projection, one
attention call, and the out_proj product on a column-sliced view (BLAS reads it with
its row stride; nothing is copied: tests/test_nested.py checks the ops).

Examples with different counts are grouped by count: the batch is sorted once by
count, every group is a contiguous range of the sorted batch and runs exactly its own
heads. The alternative, the batch's largest count K for every example with the heads
past an example's count zeroed before out_proj, computes K - k_b heads too many for
example b (22-49% more head work for counts of std 1 at MiniLM's size): at batch 32
on 2 CPU threads it took 0.93-1.06x the grouped time at 25 tokens and 1.09-1.6x at
128 (issue 26's report), its fewer ops not making up for the extra work.

Plain torch ops, so the same code runs on a GPU; the counts must be known on the host
to slice the weights (one synchronisation a layer, none when a dial fixes them)."""

from typing import List, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .head_subset import keep_mask


def attend_prefix(x: Tensor, key_padding_mask: Optional[Tensor], counts: Union[int, List[int]], q: nn.Linear,
                  k: nn.Linear, v: nn.Linear, out: nn.Linear, num_heads: int) -> Tensor:
    """Example b of ``x`` (T x B x C) attended with its first ``counts[b]`` heads (a
    list of B host ints, each in [1, H]; one int: every example). Returns T x B x C,
    contiguous, in the dtype fairseq's own attention would return (autocast's)."""
    T, B, C = x.shape
    d = C // num_heads
    mask = keep_mask(key_padding_mask)
    if isinstance(counts, int) or min(counts) == max(counts):
        count = counts if isinstance(counts, int) else counts[0]
        return _prefix(x, mask, count, d, q, k, v, out, time_major=True).view(T, B, C)
    # sorted by count, descending: each count's examples a contiguous range of views
    order = sorted(range(B), key=counts.__getitem__, reverse=True)
    index = torch.tensor(order, device=x.device)
    xs = x.transpose(0, 1).index_select(0, index)  # B x T x C
    mask = None if mask is None else mask.index_select(0, index)
    result = None
    start = 0
    for stop in range(1, B + 1):
        if stop == B or counts[order[stop]] != counts[order[start]]:
            group = _prefix(xs[start:stop], None if mask is None else mask[start:stop], counts[order[start]], d,
                            q, k, v, out, time_major=False)
            if result is None:
                result = group.new_empty(T, B, C)
            # back in fairseq's order and layout (T x B x C, contiguous)
            result.transpose(0, 1).index_copy_(0, index[start:stop], group.view(stop - start, T, C))
            start = stop
    return result


def _prefix(x: Tensor, mask: Optional[Tensor], count: int, d: int, q: nn.Linear, k: nn.Linear, v: nn.Linear,
            out: nn.Linear, time_major: bool) -> Tensor:
    """The first ``count`` heads (of ``d`` dimensions) of every example of ``x`` (T x n
    x C when ``time_major``, else n x T x C): the out_proj product, n*T x C, rows in
    ``x``'s order."""
    width = count * d
    heads = []
    for p in (q, k, v):
        t = F.linear(x, p.weight[:width], None if p.bias is None else p.bias[:width]).unflatten(-1, (count, d))
        heads.append(t.permute(1, 2, 0, 3) if time_major else t.transpose(1, 2))  # n x count x T x d
    context = F.scaled_dot_product_attention(*heads, attn_mask=mask)
    context = (context.permute(2, 0, 1, 3) if time_major else context.transpose(1, 2)).reshape(-1, width)
    return F.linear(context, out.weight[:, :width], out.bias)  # a view of the columns: rows keep their stride
