"""What every head router shares: the route it hands its attention layer, the budget
predictor, and the counts a call fixes (the dial's heads).

A router reads a summary ``s`` of the layer input and decides, per input, how many of
the layer's H heads run and which. The routers, one per ``--head-selection``:

- nested_router.py: ``nested``, the product's path (a per-input budget over an
  importance-ordered prefix of the heads) and ``pruned`` (an export's fixed prefix);
- learned_router.py: ``learned``, the paper's method (a per-input budget and a
  relevance over the heads, explored while training: exploration.py);
- baseline_routers.py: ``static``, ``random`` and ``kept``, fixed budgets.

A router with a budget predictor predicts

    b(x) = m + (H - m) * sigmoid(s * (w_b . s(x) + c_b))   in [m, H]

and runs ``k = round(b)`` heads. Training needs gradients for the discrete choice: the
gate of head h has the forward value of the hard selection (0 or 1, so that a layer at
full budget *is* a standard attention layer) and straight-through gradients from the
soft count mask ``sigmoid((b - rank_h - 0.5) / t)``, which gives the budget the task
gradient of adding or dropping the heads next to its boundary.

Every logit is multiplied by ``--router-scale`` s, so that the router can move faster
than the pretrained weights under one learning rate. The dial (``LayerDial``, an
argument of each call) fixes the count, in training (the sandwich's widths) as at
evaluation, or shifts the budget logit, at evaluation only."""

import math
from typing import List, NamedTuple, Optional

import torch
from torch import Tensor, nn

from ..config import BudgetConfig
from ..dial.settings import NO_DIAL, LayerDial


class HeadRoute(NamedTuple):
    budget: Tensor  # B, continuous budget b(x) (differentiable)
    heads: Tensor  # B, heads run per example: k = clamp(round(b), m, H)
    selected: Optional[Tensor]  # B x H, bool (None: a prefix not asked for, NestedRouter.prefix(heads))
    gate: Optional[Tensor]  # B x H, forward value == selected; straight-through gradients (None: not asked)
    relevance: Optional[Tensor]  # B x H, p(x) (None with selected)
    every_head: bool  # known on the host: every example runs all H heads
    counts: Optional[List[int]] = None  # ``heads`` on the host, where the router computed them there
    # B, float64: s * (w_b . s(x) + c_b), the budget logit before the dial's shift (None:
    # no predictor ran); what the calibration searches the shift with (dial/calibration.py)
    logit: Optional[Tensor] = None


def straight_through(z: Tensor) -> Tensor:
    """Zero in the forward pass, the gradient of ``z`` in the backward pass."""
    return z - z.detach()


def ranks(scores: Tensor) -> Tensor:
    """Rank of every entry along the last dimension, 0 = highest score."""
    order = scores.argsort(dim=-1, descending=True, stable=True)
    return order.argsort(dim=-1, stable=True)


def summarize(x: Tensor, key_padding_mask: Optional[Tensor], pooling: str) -> Tensor:
    """T x B x C -> B x C, blind to padding: the first token, or the masked mean."""
    if pooling == "first":
        return x[0]
    if key_padding_mask is None:
        return x.mean(dim=0)
    keep = (~key_padding_mask.bool()).type_as(x).unsqueeze(1)  # B x 1 x T
    # one batched product on a view of x: no T x B x C temporary, unlike (x * keep).sum(0)
    total = torch.bmm(keep, x.transpose(0, 1)).squeeze(1)  # B x C
    return total / keep.sum(dim=-1).clamp_min(1.0)


class HeadRouter(nn.Module):
    """The base of every router: the budget predictor (``budget_proj``, C -> 1, added
    by :meth:`add_budget_predictor` where the mode predicts a budget), the update number
    (for the exploration schedule), and the count a dial fixes. A subclass adds its own
    parameters and ``forward(x, key_padding_mask, gate, dial) -> HeadRoute``."""

    relevance_outputs = 0  # logits per input besides the budget's (the router's FLOPs)

    def __init__(self, embed_dim: int, num_heads: int, cfg: BudgetConfig, fixed_heads: float):
        super().__init__()
        self.cfg = cfg
        self.num_heads = num_heads
        self.fixed_heads = fixed_heads  # this layer's budget where it is fixed
        self.num_updates = 0

    def add_budget_predictor(self, embed_dim: int):
        """``budget_proj`` (after the subclass's own parameters: a checkpoint's optimizer
        state lists them in that order)."""
        self.budget_proj = nn.Linear(embed_dim, 1)

    @property
    def outputs(self) -> int:
        """Logits the router predicts per input (relevance and budget): its FLOPs."""
        return self.relevance_outputs + int(self.cfg.predicts_budget)

    def reset_parameters(self):
        """A budget that starts at ``--initial-budget``. Called again by the model after
        RoBERTa's ``init_bert_params`` has re-initialised every ``nn.Linear``."""
        if not self.cfg.predicts_budget:
            return
        H, m, start = self.num_heads, self.cfg.min_heads, self.cfg.initial_budget
        start = H - 0.25 if start is None else start
        fraction = min(max((start - m) / (H - m), 1e-3), 1 - 1e-3) if H > m else 0.5
        nn.init.zeros_(self.budget_proj.weight)
        nn.init.constant_(self.budget_proj.bias, math.log(fraction / (1 - fraction)) / self.cfg.router_scale)

    def set_num_updates(self, num_updates: int):
        """fairseq calls this on every update (and after loading a checkpoint)."""
        self.num_updates = num_updates

    def fixed_count(self, dial: LayerDial = NO_DIAL) -> Optional[int]:
        """The count every input runs, when it does not depend on the input: the dial's
        heads, in training as at evaluation (the most relevant ones; a prefix router's
        first ones, with no predictor run)."""
        if dial.heads is not None and not 1 <= dial.heads <= self.num_heads:
            raise ValueError(f"a dial's heads must be in [1, {self.num_heads}], got {dial.heads}")
        return dial.heads

    def budget_logit(self, summary: Tensor) -> Tensor:
        """s (w_b . summary + c_b): B, float32."""
        return self.cfg.router_scale * self.budget_proj(summary).float().squeeze(-1)

    def predict_budget(self, summary: Tensor, shift: float = 0.0, logit: Optional[Tensor] = None) -> Tensor:
        """b(x) = m + (H - m) sigmoid(s (w_b . summary + c_b) + shift): B, float32
        (``logit``: :meth:`budget_logit`, when the caller has it); the dial's ``shift``
        applies at evaluation only."""
        H, m = self.num_heads, self.cfg.min_heads
        logit = self.budget_logit(summary) if logit is None else logit
        if not self.training and shift:
            logit = logit + shift
        return m + (H - m) * torch.sigmoid(logit)

    def soft_count(self, budget: Tensor, rank: Tensor) -> Tensor:
        """B x H: sigmoid((b - rank - 0.5) / t), the soft head-count mask."""
        return torch.sigmoid((budget.unsqueeze(-1) - rank.to(budget.dtype) - 0.5) / self.cfg.budget_mask_temperature)

    def ranked_route(self, budget: Tensor, heads: Tensor, relevance: Tensor, rank: Tensor, every_head: bool,
                     gate: bool, dial: LayerDial) -> HeadRoute:
        """The route of a router that ranks the heads: the ``heads`` best-ranked run
        (a fixed count overrides them); the gates add the straight-through soft count
        mask and relevance ``H * p`` (a first-order estimate of each head's worth)."""
        fixed = self.fixed_count(dial)
        if fixed is not None:
            heads, every_head = torch.full_like(heads, fixed), fixed == self.num_heads
        selected = rank < heads.unsqueeze(-1)
        if not gate:
            return HeadRoute(budget, heads, selected, None, relevance, every_head)
        gates = (selected.to(budget.dtype) + straight_through(self.soft_count(budget, rank))
                 + straight_through(self.num_heads * relevance))
        return HeadRoute(budget, heads, selected, gates, relevance, every_head)
