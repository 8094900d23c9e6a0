"""The product's router, ``--head-selection nested``: a per-input budget over a prefix
of the heads. The heads of an importance-ordered checkpoint (nested/reorder.py) run as
heads ``0..k-1`` for every input, so the router predicts only how many, and one model
serves every width. ``pruned`` (an export of one width) runs the prefix its layer
holds, always, with no predictor.

Nothing is ranked or explored. The gates are the hard prefix plus the straight-through
soft count mask; the "relevance" (a statistic, no parameter makes it) is uniform over
the heads an input runs, ``1/k`` on the prefix and 0 past it, so that its entropy,
``log k / log H``, reads as the heads run."""

import math
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..config import BudgetConfig
from ..dial.settings import NO_DIAL, LayerDial
from .router import HeadRoute, HeadRouter, straight_through, summarize


def _sigmoid(z: float) -> float:
    """The logistic function of a host float, without overflow."""
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


class NestedRouter(HeadRouter):
    def __init__(self, embed_dim: int, num_heads: int, cfg: BudgetConfig, fixed_heads: float):
        super().__init__(embed_dim, num_heads, cfg, fixed_heads)
        if cfg.predicts_budget:  # not an export's ('pruned')
            self.add_budget_predictor(embed_dim)
        self.register_buffer("position", torch.arange(num_heads), persistent=False)  # each head's rank
        self.reset_parameters()

    def fixed_count(self, dial: LayerDial = NO_DIAL) -> Optional[int]:
        """As every router's, and a pruned layer's heads where the dial gives none."""
        if dial.heads is None and self.cfg.head_selection == "pruned":
            return int(self.fixed_heads)
        return super().fixed_count(dial)

    def forward(self, x: Tensor, key_padding_mask: Optional[Tensor], gate: bool = True,
                dial: LayerDial = NO_DIAL) -> HeadRoute:
        """x: T x B x C. A fixed count (the dial's, or a pruned layer's) runs no
        predictor: the budget is that count, and the gates carry no gradient to it.
        Without gates (the fast path), the counts alone: the rest is :meth:`prefix`."""
        H, m, B = self.num_heads, self.cfg.min_heads, x.size(1)
        fixed = self.fixed_count(dial)
        if fixed is None and not gate:  # the fast path: the counts are needed on the host
            return self.host_counts(x, key_padding_mask, dial.shift)
        logit = None
        if fixed is None:
            summary = summarize(x, key_padding_mask, self.cfg.budget_pooling)
            logit = self.budget_logit(summary)
            budget = self.predict_budget(summary, dial.shift, logit)
            heads, every_head = budget.round().long(), m >= H  # b is in [m, H]: no clamp
            logit = logit.detach().double()
        else:
            budget = x.new_full((B,), float(fixed), dtype=torch.float)
            heads, every_head = torch.full((B,), fixed, device=x.device), fixed == H
        if not gate:
            return HeadRoute(budget, heads, None, None, None, every_head, logit=logit)
        selected, relevance = self.prefix(heads)
        gates = selected.to(budget.dtype) + straight_through(self.soft_count(budget, self.position))
        return HeadRoute(budget, heads, selected, gates, relevance, every_head, logit=logit)

    def host_counts(self, x: Tensor, key_padding_mask: Optional[Tensor], shift: float = 0.0) -> HeadRoute:
        """The fast path's route: the budget logits read once to the host, where the
        budgets and counts are worked out (the counts slice the weights there), in a few
        operations instead of a tensor op for each step of the formula: at batch 1 the
        router is a fixed cost that the heads it saves must pay for. The budgets are
        float64 arithmetic rounded to float32: within an ulp of the tensor formula's."""
        H, m, scale = self.num_heads, self.cfg.min_heads, self.cfg.router_scale
        summary = summarize(x, key_padding_mask, self.cfg.budget_pooling)
        raw = F.linear(summary, self.budget_proj.weight, self.budget_proj.bias).view(-1).tolist()
        logits = [scale * z for z in raw]
        budgets = [m + (H - m) * _sigmoid(z + shift) for z in logits]
        counts: List[int] = [round(b) for b in budgets]
        return HeadRoute(torch.tensor(budgets, device=x.device), torch.tensor(counts, device=x.device), None, None,
                         None, m >= H, counts, torch.tensor(logits, dtype=torch.float64, device=x.device))

    def prefix(self, heads: Tensor) -> Tuple[Tensor, Tensor]:
        """Each input's selection, its first ``heads`` heads (B x H, bool), and its
        relevance, uniform over them (a statistic: 1/k on the prefix, 0 past it)."""
        heads = heads.unsqueeze(-1)
        selected = self.position < heads
        return selected, selected / heads
