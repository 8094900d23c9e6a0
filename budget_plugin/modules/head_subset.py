"""Executing a chosen subset of heads: attention whose cost is proportional to the
heads it runs (BudgetFormer's inference path).

Pure functions of the input, the selection and the weights. On CPU the cost is the
GEMMs plus whatever feeds them, so the feeding is kept cheap: when every example runs
the same heads (always at batch 1) the weights are only sliced, never copied;
otherwise the batch is processed head by head on the examples that chose that head,
and the output projection is one batched product per chunk of examples on their own
gathered out_proj columns."""

from typing import List, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Gathered out_proj columns per chunk: at most 4 MB (the allocator recycles small
# temporaries; big ones are page-faulted in anew), and no more than the context
# buffer, so that peak memory keeps falling with the budget on short inputs.
CHUNK_FLOATS = 1 << 20


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


def head_runs(heads: Tensor) -> List[Tuple[int, int]]:
    """Ascending head indices as maximal runs of consecutive heads, [start, stop)."""
    runs: List[Tuple[int, int]] = []
    for h in heads.tolist():
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


def attend_heads(x: Tensor, key_padding_mask: Optional[Tensor], heads: Tensor,
                 q: nn.Linear, k: nn.Linear, v: nn.Linear, out: nn.Linear, head_dim: int) -> Tensor:
    """Attention of the given heads (ascending indices) for every example of ``x``
    (T x B x C): their rows of q/k/v, their columns of out_proj.

    Every run of consecutive heads is one product on views of the weights
    (``weight[rows]``, ``out.weight[:, rows]``); the runs' outputs are accumulated
    into one buffer by ``addmm``."""
    T, B, C = x.shape
    d = head_dim
    mask = keep_mask(key_padding_mask)
    result: Optional[Tensor] = None
    for start, stop in head_runs(heads.flatten()):
        rows = slice(start * d, stop * d)
        qkv = (
            split_heads(F.linear(x, p.weight[rows], None if p.bias is None else p.bias[rows]), stop - start)
            for p in (q, k, v)
        )
        # reshape, not view: SDPA's output layout differs between devices
        heads_out = merge_heads(F.scaled_dot_product_attention(*qkv, attn_mask=mask)).reshape(T * B, -1)
        weight = out.weight[:, rows].t()
        if result is not None and torch.is_grad_enabled():  # autograd refuses out=
            result = torch.addmm(result, heads_out, weight)
        elif result is not None:  # in place; out= rather than addmm_: FlopCounterMode counts addmm only
            torch.addmm(result, heads_out, weight, out=result)
        elif out.bias is not None:
            result = torch.addmm(out.bias, heads_out, weight)
        else:
            result = torch.mm(heads_out, weight)
    assert result is not None, "attend_heads needs at least one head"
    return result.view(T, B, C)


def attend_selected(x: Tensor, key_padding_mask: Optional[Tensor], selected: Tensor,
                    weights: HeadMajorWeights) -> Tensor:
    """Only the selected heads of every example (``selected``: B x H, bool) computed.

    Head by head, the examples that chose head h are gathered and run through h's
    q/k/v rows (one product) and attention; each result lands in its example's next
    free slot of a B x T x k_max x d buffer. The output projection is then a batched
    product of every example's slots with its own heads' out_proj columns (gathered),
    in chunks of examples sorted by k, so that an example with fewer heads than
    ``k_max`` pads its chunk (with exact zeros) only up to its chunk's largest k. No
    example is looped over; every product is proportional to the heads run. Returns
    T x B x C (a transposed view of a B x T x C buffer)."""
    T, B, C = x.shape
    H, d = selected.size(1), weights.out.size(1)
    mask = keep_mask(key_padding_mask)
    heads_per_example = selected.sum(dim=1)
    k_max = int(heads_per_example.max())
    slot = selected.long().cumsum(dim=1) - 1  # B x H: slot of head h in example b
    context = x.new_zeros(B, T, k_max, d)
    examples_per_head = selected.sum(dim=0)
    active = examples_per_head.nonzero().flatten()
    by_head = selected.t().nonzero()[:, 1].split(examples_per_head[active].tolist())
    for h, examples in zip(active.tolist(), by_head):
        bias = None if weights.qkv_bias is None else weights.qkv_bias[h]
        context[examples, :, slot[examples, h]] = _one_head(x, mask, examples, weights.qkv[h], bias)

    # each example's heads in ascending order, k_max of them (a padded slot names
    # head 0: its context is zero, so it adds exactly nothing)
    head_of_slot = torch.where(selected, torch.arange(H, device=x.device), H)
    head_of_slot = head_of_slot.sort(dim=1).values[:, :k_max].clamp_max(H - 1)
    order = heads_per_example.argsort(stable=True)
    per_chunk = max(1, min(CHUNK_FLOATS, context.numel()) // (k_max * d * C))
    result = x.new_empty(B, T, C)
    for chunk in order.split(per_chunk):
        k = int(heads_per_example[chunk[-1]])  # the chunk's largest
        _project_chunk(result, context, chunk, weights, head_of_slot[chunk, :k])
    return result.transpose(0, 1)


def _one_head(x: Tensor, mask: Optional[Tensor], examples: Tensor, weight: Tensor,
              bias: Optional[Tensor]) -> Tensor:
    """One head (its 3d x C q/k/v rows) on the given examples: B_h x T x d.
    (A function of its own, so that each head's temporaries are freed before the next.)"""
    if examples.numel() < x.size(1):
        x = x.index_select(1, examples)  # T x B_h x C
        mask = None if mask is None else mask.index_select(0, examples)
    qkv = F.linear(x, weight, bias).permute(1, 0, 2).unsqueeze(1)  # B_h x 1 x T x 3d
    d = weight.size(0) // 3
    return F.scaled_dot_product_attention(*qkv.split(d, dim=-1), attn_mask=mask).squeeze(1)


def _project_chunk(result: Tensor, context: Tensor, chunk: Tensor, weights: HeadMajorWeights,
                   heads: Tensor):
    """result[chunk] = out_proj of the chunk's context slots, each example with its own
    heads' columns (``heads``: n x k)."""
    (n, k), (_, T, C), d = heads.shape, result.shape, weights.out.size(1)
    first = int(chunk[0])
    contiguous = bool((chunk == torch.arange(first, first + n, device=chunk.device)).all())
    weight = weights.out.index_select(0, heads.flatten()).view(n, k * d, C)
    chunk_context = context[first:first + n] if contiguous else context.index_select(0, chunk)
    chunk_context = chunk_context[:, :, :k].reshape(n, T, k * d)
    bias = weights.out_bias if weights.out_bias is not None else result.new_zeros(C)
    if contiguous and not torch.is_grad_enabled():  # autograd refuses out=
        torch.baddbmm(bias, chunk_context, weight, out=result[first:first + n])
    else:
        result.index_copy_(0, chunk, torch.baddbmm(bias, chunk_context, weight))
