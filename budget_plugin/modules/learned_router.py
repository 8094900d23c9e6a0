"""The paper's router, ``--head-selection learned``: for every input, how many heads a
layer runs (the budget, router.py) and which (a relevance over the heads).

    p(x) = softmax(s * W_r s(x) / temperature)      over the H heads

selects the ``k = clamp(round(b), m, H)`` most relevant heads. While training, the
choice is explored (exploration.py: Gumbel-top-k sampling from p and uniformly random
rankings, annealed to pure top-k over ``--exploration-updates``), and the gates add
``ST(H * p_h)``, ``ST(z) = z - z.detach()``, to the hard selection and the soft count
mask: probability moves towards the heads whose output lowers the loss (a first-order
estimate, available for every head because training computes all of them).
``--relevance-prior`` starts the relevance from given head scores (e.g. a dense
model's head importance)."""

from typing import List, Optional

import torch
from torch import Tensor, nn

from ..config import BudgetConfig
from ..dial.settings import NO_DIAL, LayerDial
from .exploration import exploration_at, explored_ranks
from .router import HeadRoute, HeadRouter, summarize


class LearnedRouter(HeadRouter):
    def __init__(self, embed_dim: int, num_heads: int, cfg: BudgetConfig, fixed_heads: float):
        super().__init__(embed_dim, num_heads, cfg, fixed_heads)
        self.relevance_outputs = num_heads
        self.relevance_proj = nn.Linear(embed_dim, num_heads)
        self.add_budget_predictor(embed_dim)
        self.prior: Optional[Tensor] = None  # prefer(): the relevance bias's start
        self.reset_parameters()

    def reset_parameters(self):
        """Near-uniform relevance (or the prior's), and the budget's start."""
        super().reset_parameters()
        nn.init.normal_(self.relevance_proj.weight, std=0.02 / self.cfg.router_scale)
        if self.prior is None:
            nn.init.zeros_(self.relevance_proj.bias)
        else:
            with torch.no_grad():
                self.relevance_proj.bias.copy_(self.prior / self.cfg.router_scale)

    def prefer(self, scores: List[float]):
        """--relevance-prior: the relevance starts from these head scores, standardised
        (kept for reset_parameters, which the model calls after fairseq's init)."""
        scores = torch.tensor(scores, dtype=torch.float)
        std = scores.std()
        self.prior = (scores - scores.mean()) / (std if std > 0 else 1.0)
        self.reset_parameters()

    def forward(self, x: Tensor, key_padding_mask: Optional[Tensor], gate: bool = True,
                dial: LayerDial = NO_DIAL) -> HeadRoute:
        """x: T x B x C (the attention's input). ``gate=False`` skips the gates (the fast
        path runs the selection itself); ``dial``: this call's setting (its shift at evaluation only)."""
        H, m = self.num_heads, self.cfg.min_heads
        exploration = exploration_at(self.cfg, self.num_updates, self.training)
        summary = summarize(x, key_padding_mask, self.cfg.budget_pooling)
        logits = self.cfg.router_scale * self.relevance_proj(summary).float()
        budget_logit = self.budget_logit(summary)
        budget = self.predict_budget(summary, dial.shift, budget_logit)
        heads = budget.detach().round().clamp(m, H).long()
        relevance = torch.softmax(logits / exploration.temperature, dim=-1)
        rank = explored_ranks(logits, exploration, self.training)
        route = self.ranked_route(budget, heads, relevance, rank, m >= H, gate, dial)
        # the logit decided the counts unless a fixed count overrode them
        return route if self.fixed_count(dial) is not None else route._replace(logit=budget_logit.detach().double())
