"""Budgeted multi-head self-attention: fairseq's MultiheadAttention whose every call
runs the heads its router chose for each input (router.py; the router of each
``--head-selection`` is ROUTERS'), computing only those at
inference (a prefix of the heads, ``--head-selection nested``: prefix_heads.py; any
subset: head_subset.py on CPU, gpu_heads.py on a GPU) and all of them, gated, in
training."""

from typing import List, Mapping, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from torch import Tensor, nn

from ..config import BudgetConfig
from ..dial.settings import NO_DIAL, LayerDial
from . import gpu_heads, head_subset, prefix_heads
from .baseline_routers import KeptRouter, RandomRouter, StaticRouter
from .flops import attention_flops
from .head_subset import HeadMajorWeights, head_major, keep_mask, merge_heads, split_heads
from .learned_router import LearnedRouter
from .nested_router import NestedRouter
from .router import HeadRoute
from .statistics import LayerStatistics

ROUTERS = {"learned": LearnedRouter, "nested": NestedRouter, "pruned": NestedRouter, "static": StaticRouter,
           "random": RandomRouter, "kept": KeptRouter}  # --head-selection: its router
ROUTER_KEYS = ("relevance_proj.", "budget_proj.", "static_logits", "random_seed")


class BudgetedAttention(MultiheadAttention):
    """Self-attention that runs a per-input number of heads.

    It keeps fairseq's ``q_proj``/``k_proj``/``v_proj``/``out_proj`` (head h owns rows
    ``h*d:(h+1)*d`` of q/k/v and those columns of ``out_proj``), so RoBERTa weights
    load by name; its ``router`` holds the parameters BudgetFormer adds.

    ``forward`` is fairseq's call (``self_attn(x, x, x, key_padding_mask=...)``) and
    returns ``(output, statistics)``: the second value is this layer's budget
    statistics, not attention weights, which it never computes."""

    def __init__(self, embed_dim: int, num_heads: int, cfg: BudgetConfig, fixed_heads: float, **kwargs):
        super().__init__(embed_dim, num_heads, self_attention=True, **kwargs)
        self.router = ROUTERS[cfg.head_selection](embed_dim, num_heads, cfg, fixed_heads)
        self.fast_path = cfg.attention_path == "fast"
        self.nested = cfg.runs_prefix
        if cfg.head_selection == "pruned" and fixed_heads < num_heads:
            # an exported model: the layer holds only its first k heads' weights (the
            # rows of q/k/v, the columns of out_proj); num_heads stays H, for statistics
            width = int(fixed_heads) * self.head_dim
            bias = self.q_proj.bias is not None
            self.q_proj, self.k_proj, self.v_proj = (nn.Linear(embed_dim, width, bias=bias) for _ in range(3))
            self.out_proj = nn.Linear(width, embed_dim, bias=self.out_proj.bias is not None)
        self._head_major: Optional[Tuple[tuple, HeadMajorWeights]] = None

    def upgrade_state_dict_named(self, state_dict, name):
        """Checkpoints written before the router was a module of its own kept its
        parameters on the attention (``self_attn.budget_proj.weight``)."""
        super().upgrade_state_dict_named(state_dict, name)
        prefix = name + "." if name else ""
        for key in [k for k in state_dict if k.startswith(prefix) and k[len(prefix):].startswith(ROUTER_KEYS)]:
            state_dict[prefix + "router." + key[len(prefix):]] = state_dict.pop(key)
        # baselines written before issue 25 also held the predictor they did not use
        unused = tuple(p + "." for p in ("relevance_proj", "budget_proj") if not hasattr(self.router, p))
        if unused:
            for key in [k for k in state_dict if k.startswith(prefix + "router.") and
                        k[len(prefix + "router."):].startswith(unused)]:
                del state_dict[key]

    def train(self, mode: bool = True):
        # fairseq's optimizers update ``p.data`` in place, which bumps no version
        # counter, so the head-major cache cannot see them; every update happens in
        # training mode, so a mode switch is the moment to forget it
        self._head_major = None
        return super().train(mode)

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        key_padding_mask: Optional[Tensor] = None,
        incremental_state=None,
        need_weights: bool = False,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
        dial: LayerDial = NO_DIAL,
    ) -> Tuple[Tensor, Mapping[str, Tensor]]:
        """query: T x B x C; ``dial``: the budget dial for this call (router.py). Returns
        the attention output and this layer's statistics."""
        refused = {
            "key or value other than the query (budgeted attention is self-attention)":
                any(t is not None and t is not query for t in (key, value)),
            "incremental_state": incremental_state is not None,
            "need_weights / need_head_weights / before_softmax": need_weights or need_head_weights or before_softmax,
            "static_kv": static_kv,
            "attn_mask": attn_mask is not None,
        }
        for what, asked in refused.items():
            if asked:
                raise ValueError(f"BudgetedAttention cannot honour {what}; it runs a per-input "
                                 "subset of heads over the whole (padded) input")
        x = query
        # the fast path is inference only (its products write in place, on a cached
        # copy of the weights): with autograd recording, gradients need the gated path
        recording = torch.is_grad_enabled() and (x.requires_grad or self.q_proj.weight.requires_grad)
        reference = self.training or not self.fast_path or recording
        route = self.router(x, key_padding_mask, gate=reference, dial=dial)
        if reference:
            # a nested layer at a count fixed for the whole batch (the sandwich's widths)
            # computes that prefix only: the other heads' gates are 0 and carry no gradient
            count = self.router.fixed_count(dial) if self.nested else None
            out = self.attend_all_heads(x, key_padding_mask, route.gate, count)
        elif self.nested:
            out = self.attend_prefix(x, key_padding_mask, route.counts or route.heads, route.every_head, dial)
        else:
            out = self.attend_selected_heads(x, key_padding_mask, route.selected, route.every_head)
        return out, self.statistics(x.size(0), route, lazy=not reference)

    def statistics(self, seq_len: int, route: HeadRoute, lazy: bool) -> Mapping[str, Tensor]:
        """This layer's statistics: budget, heads, selected, relevance, attn_flops and
        attn_flops_full, and budget_logit where a predictor decided the counts. ``lazy``
        (inference): those the layer did not compute itself, computed when read
        (modules/statistics.py)."""
        values = {"budget": route.budget, "heads": route.heads}
        if route.logit is not None:  # the budget logit before the dial's shift
            values["budget_logit"] = route.logit
        derived = {("attn_flops", "attn_flops_full"): lambda: attention_flops(
            seq_len, route.heads, self.embed_dim, self.num_heads, self.router.outputs)}
        if route.selected is None:  # a prefix
            derived[("selected", "relevance")] = lambda: self.router.prefix(route.heads)
        else:
            values.update(selected=route.selected, relevance=route.relevance)
        if lazy:
            return LayerStatistics(values, derived)
        for names, compute in derived.items():
            values.update(zip(names, compute()))
        return values

    def attend_all_heads(self, x: Tensor, key_padding_mask: Optional[Tensor], gate: Tensor,
                         count: Optional[int] = None) -> Tensor:
        """Reference path: every head computed (that the layer holds: all H but in a
        pruned model), or its first ``count``, each scaled by its gate before out_proj."""
        held = self.q_proj.out_features // self.head_dim
        run = held if count is None else min(count, held)
        width = run * self.head_dim  # the first heads' rows of q, k and v, columns of out_proj

        def project(proj, t):  # every head: the module itself (what hooks on it see)
            if run == held:
                return proj(t)
            return F.linear(t, proj.weight[:width], None if proj.bias is None else proj.bias[:width])

        q, k, v = (split_heads(project(proj, x), run) for proj in (self.q_proj, self.k_proj, self.v_proj))
        dropout = self.dropout_module.p if self.training else 0.0
        heads = F.scaled_dot_product_attention(q, k, v, attn_mask=keep_mask(key_padding_mask), dropout_p=dropout)
        heads = merge_heads(heads * gate[:, :run].to(heads.dtype)[:, :, None, None])
        return self.out_proj(heads) if run == held else F.linear(heads, self.out_proj.weight[:, :width],
                                                                  self.out_proj.bias)

    def attend_selected_heads(self, x: Tensor, key_padding_mask: Optional[Tensor], selected: Tensor,
                              every_head: bool = False) -> Tensor:
        """Fast path: only the selected heads (B x H, bool) are computed. ``every_head``:
        the caller knows, without asking the device, that every head is selected."""
        on_gpu = gpu_heads.available(x)  # the GPU path decides nothing on the host: no synchronisation
        if every_head or (not on_gpu and bool(selected.all())):  # exactly fairseq's own attention
            return MultiheadAttention.forward(self, x, x, x, key_padding_mask=key_padding_mask, need_weights=False)[0]
        weights = self.head_major_weights(x.dtype)
        if on_gpu:
            return gpu_heads.attend_selected(x, key_padding_mask, selected, weights)
        return head_subset.attend_selected(x, key_padding_mask, selected, weights)

    def attend_prefix(self, x: Tensor, key_padding_mask: Optional[Tensor], heads: Union[Tensor, List[int]],
                      every_head: bool = False, dial: LayerDial = NO_DIAL) -> Tensor:
        """Fast path of --head-selection nested: example b runs heads 0..heads[b]-1, on
        views of the projections' own weights. The counts are read on the host (a
        synchronisation on a GPU) unless they are fixed (dialled or pruned)."""
        fixed = self.router.fixed_count(dial)
        counts = fixed if fixed is not None else heads if isinstance(heads, list) else heads.tolist()
        if every_head or (fixed is None and min(counts) == self.num_heads):  # exactly fairseq's own attention
            return MultiheadAttention.forward(self, x, x, x, key_padding_mask=key_padding_mask, need_weights=False)[0]
        return prefix_heads.attend_prefix(x, key_padding_mask, counts, self.q_proj, self.k_proj, self.v_proj,
                                          self.out_proj, self.num_heads)

    def head_major_weights(self, dtype: Optional[torch.dtype] = None) -> HeadMajorWeights:
        """The head-major copy of the weights in ``dtype`` (default: theirs; under
        autocast, the activations'), cached until a weight changes: in-place updates and
        ``load_state_dict`` bump the tensors' versions, ``.to()`` moves them, and
        ``train()`` drops the cache for the writes that do not (fairseq's optimizers)."""
        projections = (self.q_proj, self.k_proj, self.v_proj, self.out_proj)
        tensors = [p.weight for p in projections] + [p.bias for p in projections if p.bias is not None]
        dtype = dtype or self.q_proj.weight.dtype
        key = tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in tensors) + (dtype,)
        if self._head_major is None or self._head_major[0] != key:
            weights = head_major(*projections, self.num_heads)
            if dtype != weights.qkv.dtype:
                weights = HeadMajorWeights(*(None if w is None else w.detach().to(dtype) for w in weights))
            self._head_major = (key, weights)
        return self._head_major[1]
