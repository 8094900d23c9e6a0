"""FLOP counting, in one place: the analytic count every budgeted layer reports in its
statistics, and the measured count (torch's FlopCounterMode) that the benchmark and
the study take of whole models. Multiply-add = 2 FLOPs in both."""

import re
from typing import Callable, NamedTuple, Optional

import torch
from torch import Tensor


def attention_flops(seq_len: int, heads: Tensor, embed_dim: int, num_heads: int,
                    router_outputs: Optional[int] = None) -> "tuple[Tensor, Tensor]":
    """Attention FLOPs of a batch whose examples run ``heads`` heads (B), router
    included, and the FLOPs all heads would cost. Per head and example: q/k/v/out
    projections 8 T C d, scores and weighted values 4 T^2 d; a router of n outputs
    (``router_outputs``: H + 1 by default, the learned budget's relevance and budget;
    1 for the nested budget; 0 for none) its summary T C and its projections 2 C n."""
    T, C, H = seq_len, embed_dim, num_heads
    d = C // H
    per_head = 8.0 * T * C * d + 4.0 * T * T * d
    n = H + 1 if router_outputs is None else router_outputs
    router_flops = (T * C + 2.0 * C * n) if n else 0.0
    used = heads.sum(dtype=torch.float64) * per_head + heads.numel() * router_flops
    full = torch.full_like(used, heads.numel() * H * per_head)
    return used, full


def ffn_flops(seq_len: int, batch: int, embed_dim: int, neurons: int, full_neurons: int) -> "tuple[float, float]":
    """FFN FLOPs of a batch that runs ``neurons`` of ``full_neurons``, and at full
    width: fc1 and fc2 are 2 T C f each, per example."""
    per_neuron = 4.0 * seq_len * embed_dim * batch
    return per_neuron * neurons, per_neuron * full_neurons


def _sdpa_cpu_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


def flop_counter():
    """torch's FlopCounterMode, taught the CPU kernel of scaled_dot_product_attention
    (which it does not count by itself)."""
    from torch.utils.flop_counter import FlopCounterMode

    mapping = {}
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if op is not None:
        mapping[op] = _sdpa_cpu_flops
    return FlopCounterMode(display=False, custom_mapping=mapping)


class MeasuredFlops(NamedTuple):
    total: int  # everything ``fn`` ran
    attention: int  # the self-attention modules (``*.self_attn``, routers included)


ATTENTION_MODULE = re.compile(r"\.self_attn$")


def measure_flops(fn: Callable[[], object]) -> MeasuredFlops:
    """FLOPs of ``fn()``, in all and in the modules named ``self_attn`` (stock
    fairseq's attention and BudgetFormer's alike)."""
    with flop_counter() as counter:
        fn()
    by_module = counter.get_flop_counts()
    attention = sum(sum(ops.values()) for name, ops in by_module.items() if ATTENTION_MODULE.search(name))
    return MeasuredFlops(int(counter.get_total_flops()), int(attention))
