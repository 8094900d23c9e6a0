"""The head router: for every input, how many heads a layer runs and which.

From a summary ``s`` of the layer input it predicts

* a head budget   ``b(x) = m + (H - m) * sigmoid(w_b . s + c_b)``  in ``[m, H]``,
* a relevance     ``p(x) = softmax(W_r s / temperature)``           over the H heads,

and selects the ``k = clamp(round(b), m, H)`` most relevant heads. Training needs
gradients for both discrete choices (which heads, how many): the gate of head h has
the forward value of the hard selection (0 or 1, so a layer at full budget *is* a
standard attention layer) and straight-through gradients,

    gate_h = sel_h + ST(sigmoid((b - rank_h - 0.5) / t)) + ST(H * p_h),    ST(z) = z - z.detach()

The soft count mask gives the budget predictor the task gradient of adding or dropping
the heads next to its boundary; the relevance term moves probability towards heads
whose output lowers the loss (a first-order estimate, available for every head
because training computes all of them).

``--head-selection nested`` keeps the budget and drops the relevance: the heads of an
importance-ordered checkpoint (nested/reorder.py) run as a prefix, heads ``0..k-1``,
for every input, so the router predicts only how many. Its gates are the hard prefix
plus the straight-through soft count mask, and its "relevance" (a statistic, no
parameter makes it) is uniform over the heads the input runs: ``1/k`` on the prefix,
0 past it, so that the selection is still its top-k and its entropy, ``log k / log H``,
reads as the heads run.

The baselines (``--head-selection static|random|kept``) replace the predictor by a fixed
budget per layer: one learned relevance shared by every input, uniform draws, or named heads.
``pruned`` (an exported nested model) runs the prefix its layer holds, always.

At evaluation the budget can be dialled (``--head-ratio``): the model hands every
router its :class:`LayerDial` with each forward (an argument, never router state, so
that concurrent calls can run at different settings): ``shift`` is added to the budget
logit of every input (a calibrated shift, nested/calibration.py, moves the mean without
undoing the per-input differences), or ``heads`` runs a fixed count with no predictor.

Every logit is multiplied by ``--router-scale`` (10 by default), a reparametrization that
lets the router move faster than the pretrained weights under one learning rate.
"""

import contextlib
import math
from typing import Iterator, List, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import BudgetConfig
from .exploration import Exploration, exploration_at
from .layer_dial import NO_DIAL, LayerDial


class HeadRoute(NamedTuple):
    budget: Tensor  # B, continuous budget b(x) (differentiable)
    heads: Tensor  # B, heads run per example: k = clamp(round(b), m, H)
    selected: Optional[Tensor]  # B x H, bool (None: a prefix not asked for, HeadRouter.prefix(heads))
    gate: Optional[Tensor]  # B x H, forward value == selected; straight-through gradients (None: not asked)
    relevance: Optional[Tensor]  # B x H, p(x) (None with selected)
    every_head: bool  # known on the host: every example runs all H heads
    counts: Optional[List[int]] = None  # ``heads`` on the host, where the router computed them there


def straight_through(z: Tensor) -> Tensor:
    """Zero in the forward pass, the gradient of ``z`` in the backward pass."""
    return z - z.detach()


def _sigmoid(z: float) -> float:
    """The logistic function of a host float, without overflow."""
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


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
    """The router of one layer, holding only what its mode uses: ``relevance_proj``
    (C -> H) and ``budget_proj`` (C -> 1) for the learned budget, ``budget_proj`` alone
    for the nested one; ``static_logits`` (H), the ``random_seed`` or the ``kept``
    buffer for the baselines."""

    def __init__(self, embed_dim: int, num_heads: int, cfg: BudgetConfig, fixed_heads: float):
        super().__init__()
        self.cfg = cfg
        self.num_heads = num_heads
        self.fixed_heads = fixed_heads  # this layer's budget for static/random
        if cfg.head_selection == "learned":
            self.relevance_proj = nn.Linear(embed_dim, num_heads)
        if cfg.predicts_budget:
            self.budget_proj = nn.Linear(embed_dim, 1)
        if cfg.runs_prefix:  # the rank of every head, once (not in checkpoints)
            self.register_buffer("position", torch.arange(num_heads), persistent=False)
        if cfg.head_selection == "static":  # one relevance for every input
            self.static_logits = nn.Parameter(torch.zeros(num_heads))
        if cfg.head_selection == "random":
            # seeds the draws at inference; a buffer, so that a checkpoint replays them
            self.register_buffer("random_seed", torch.randint(1 << 62, ()))
        if cfg.head_selection == "kept":  # filled by keep(); a buffer, so checkpoints hold it
            self.register_buffer("kept", torch.zeros(num_heads, dtype=torch.bool))
        self.prior: Optional[Tensor] = None  # prefer(): the relevance bias's start
        self._generator: Optional[torch.Generator] = None
        self.num_updates = 0
        self.forced_heads: Optional[int] = None  # only inside forced()
        self.reset_parameters()

    @property
    def outputs(self) -> int:
        """Logits the router predicts per input (relevance and budget): its FLOPs."""
        return (self.num_heads if self.cfg.head_selection == "learned" else 0) + int(self.cfg.predicts_budget)

    def reset_parameters(self):
        """Near-uniform relevance, and a budget that starts at ``--initial-budget``.

        Called again by the model after RoBERTa's ``init_bert_params`` has re-initialised
        every ``nn.Linear``."""
        scale = self.cfg.router_scale  # the initial logits do not depend on it
        if self.cfg.head_selection == "static":
            nn.init.normal_(self.static_logits, std=0.02 / scale)
        if not self.cfg.predicts_budget:
            return
        H, m, start = self.num_heads, self.cfg.min_heads, self.cfg.initial_budget
        start = H - 0.25 if start is None else start
        fraction = min(max((start - m) / (H - m), 1e-3), 1 - 1e-3) if H > m else 0.5
        if self.cfg.head_selection == "learned":
            nn.init.normal_(self.relevance_proj.weight, std=0.02 / scale)
            if self.prior is None:
                nn.init.zeros_(self.relevance_proj.bias)
            else:
                with torch.no_grad():
                    self.relevance_proj.bias.copy_(self.prior / scale)
        nn.init.zeros_(self.budget_proj.weight)
        nn.init.constant_(self.budget_proj.bias, math.log(fraction / (1 - fraction)) / scale)

    def prefer(self, scores: List[float]):
        """--relevance-prior: the relevance starts from these head scores, standardised
        (kept for reset_parameters, which the model calls after fairseq's init)."""
        scores = torch.tensor(scores, dtype=torch.float)
        std = scores.std()
        self.prior = (scores - scores.mean()) / (std if std > 0 else 1.0)
        self.reset_parameters()

    def keep(self, heads: List[int]):
        """--head-selection kept: the heads this layer runs for every input."""
        with torch.no_grad():
            self.kept.zero_()
            self.kept[heads] = True

    def set_num_updates(self, num_updates: int):
        """fairseq calls this on every update (and after loading a checkpoint)."""
        self.num_updates = num_updates

    @contextlib.contextmanager
    def forced(self, heads: int) -> Iterator[None]:
        """Run exactly ``heads`` heads for every input inside the block (the most
        relevant ones; for nested, the first ones, with no predictor run); the
        router's own budget again after it, even on error."""
        if not 1 <= heads <= self.num_heads:
            raise ValueError(f"forced heads must be in [1, {self.num_heads}], got {heads}")
        self.forced_heads = heads
        try:
            yield
        finally:
            self.forced_heads = None

    def fixed_count(self, dial: LayerDial = NO_DIAL) -> Optional[int]:
        """The count every input runs, when it does not depend on the input: forced,
        the heads a pruned layer holds, or dialled to a count (at evaluation)."""
        if self.forced_heads is not None:
            return self.forced_heads
        if self.cfg.head_selection == "pruned":
            return int(self.fixed_heads)
        return None if self.training else dial.heads

    def rank_heads(self, logits: Tensor, exploration: Exploration) -> Tensor:
        """Rank of every head (0 = most relevant), explored while training.

        Gumbel noise of scale 1 on ``logits / temperature`` makes the top-k a sample
        without replacement from p (Gumbel-top-k); with probability ``uniform`` an
        example's ranking is replaced by a uniformly random permutation."""
        scores = logits.detach() / exploration.temperature
        noise, uniform = exploration.noise, exploration.uniform
        if self.training and (noise > 0 or uniform > 0):
            gumbel = -torch.empty_like(scores).exponential_().log()
            scores = scores + noise * gumbel
            if uniform > 0:
                at_random = torch.rand_like(scores[:, :1]) < uniform
                scores = torch.where(at_random, gumbel, scores)
        return ranks(scores)

    def uniform_draw(self, shape, device) -> Tensor:
        """Uniform numbers for --head-selection random: the global (per-update seeded)
        generator while training, the layer's own seeded one at inference."""
        if self.training:
            return torch.rand(shape, device=device)
        if self._generator is None or self._generator.device != torch.device(device):
            self._generator = torch.Generator(device=device).manual_seed(int(self.random_seed))
        return torch.rand(shape, device=device, generator=self._generator)

    def predict_budget(self, summary: Tensor, shift: float = 0.0) -> Tensor:
        """b(x) = m + (H - m) sigmoid(s (w_b . summary + c_b) + shift): B, float32; the
        dial's ``shift`` applies at evaluation only."""
        H, m = self.num_heads, self.cfg.min_heads
        logit = self.cfg.router_scale * self.budget_proj(summary).float().squeeze(-1)
        if not self.training and shift:
            logit = logit + shift
        return m + (H - m) * torch.sigmoid(logit)

    def forward(self, x: Tensor, key_padding_mask: Optional[Tensor], gate: bool = True,
                dial: LayerDial = NO_DIAL) -> HeadRoute:
        """x: T x B x C (the attention's input). ``gate=False`` skips the gates (the fast
        path runs the selection itself, and the gates are a dozen small ops a layer);
        ``dial``: the budget dial's setting for this call (evaluation only)."""
        H, m, B = self.num_heads, self.cfg.min_heads, x.size(1)
        selection, scale = self.cfg.head_selection, self.cfg.router_scale
        if self.cfg.runs_prefix:
            return self.nested(x, key_padding_mask, gate, dial)
        exploration = exploration_at(self.cfg, self.num_updates, self.training)
        if selection == "learned":
            summary = summarize(x, key_padding_mask, self.cfg.budget_pooling)
            logits = scale * self.relevance_proj(summary).float()
            budget = self.predict_budget(summary, dial.shift)
            heads = budget.detach().round().clamp(m, H).long()
        else:  # baselines: a fixed budget, no router
            budget = x.new_full((B,), self.fixed_heads, dtype=torch.float)
            if selection == "static":
                logits = scale * self.static_logits.float().expand(B, H)
                heads = budget.round().long()
            elif selection == "kept":  # ranked first, uniform relevance among them
                logits = torch.where(self.kept, 0.0, float("-inf")).expand(B, H)
                heads = budget.round().long()
            else:  # floor or ceiling, so that the mean is the fractional budget
                logits = x.new_zeros((B, H), dtype=torch.float)
                fraction = self.fixed_heads - math.floor(self.fixed_heads)
                heads = math.floor(self.fixed_heads) + (self.uniform_draw(B, x.device) < fraction).long()
        every_head = m >= H or {"learned": False, "static": round(self.fixed_heads) >= H,
                                "random": self.fixed_heads >= H, "kept": self.fixed_heads >= H}[selection]
        fixed = self.fixed_count(dial)
        if fixed is not None:
            heads = torch.full_like(heads, fixed)
            every_head = fixed == H
        relevance = torch.softmax(logits / exploration.temperature, dim=-1)
        if selection == "random":
            rank = ranks(self.uniform_draw((B, H), x.device))
        elif selection == "kept":  # nothing to explore
            rank = ranks(logits)
        else:
            rank = self.rank_heads(logits, exploration)
        selected = rank < heads.unsqueeze(-1)
        if not gate:
            return HeadRoute(budget, heads, selected, None, relevance, every_head)
        soft_count = torch.sigmoid(
            (budget.unsqueeze(-1) - rank.to(budget.dtype) - 0.5) / self.cfg.budget_mask_temperature
        )
        gates = selected.to(budget.dtype) + straight_through(soft_count) + straight_through(H * relevance)
        return HeadRoute(budget, heads, selected, gates, relevance, every_head)

    def nested(self, x: Tensor, key_padding_mask: Optional[Tensor], gate: bool, dial: LayerDial = NO_DIAL) -> HeadRoute:
        """--head-selection nested (and pruned): the budget as 'learned' predicts it, the
        heads a prefix of the layer's order. Nothing is ranked or explored; the gates
        are the hard prefix plus the straight-through soft count mask. A fixed count
        (forced, dialled, or a pruned layer's) runs no predictor: the budget is that
        count (and the gates carry no gradient to it). Without gates (the fast path),
        the counts alone: the rest is :meth:`prefix`."""
        H, m, B = self.num_heads, self.cfg.min_heads, x.size(1)
        fixed = self.fixed_count(dial)
        if fixed is None and not gate:  # the fast path: the counts are needed on the host
            return self.host_counts(x, key_padding_mask, dial.shift)
        if fixed is None:
            budget = self.predict_budget(summarize(x, key_padding_mask, self.cfg.budget_pooling), dial.shift)
            heads, every_head = budget.round().long(), m >= H  # b is in [m, H]: no clamp
        else:
            budget = x.new_full((B,), float(fixed), dtype=torch.float)
            heads, every_head = torch.full((B,), fixed, device=x.device), fixed == H
        if not gate:
            return HeadRoute(budget, heads, None, None, None, every_head)
        selected, relevance = self.prefix(heads)
        soft_count = torch.sigmoid((budget.unsqueeze(-1) - self.position - 0.5) / self.cfg.budget_mask_temperature)
        gates = selected.to(budget.dtype) + straight_through(soft_count)
        return HeadRoute(budget, heads, selected, gates, relevance, every_head)

    def host_counts(self, x: Tensor, key_padding_mask: Optional[Tensor], shift: float = 0.0) -> HeadRoute:
        """The nested fast path's route: the budget logits read once to the host, where
        the budgets and counts are worked out (the counts slice the weights there), in a
        few operations instead of a tensor op for each step of the formula: at batch 1
        the router is a fixed cost that the heads it saves must pay for. The budgets are
        float64 arithmetic rounded to float32: within an ulp of the tensor formula's."""
        H, m, scale = self.num_heads, self.cfg.min_heads, self.cfg.router_scale
        summary = summarize(x, key_padding_mask, self.cfg.budget_pooling)
        logits = F.linear(summary, self.budget_proj.weight, self.budget_proj.bias).view(-1).tolist()
        budgets = [m + (H - m) * _sigmoid(scale * z + shift) for z in logits]
        counts = [round(b) for b in budgets]
        return HeadRoute(torch.tensor(budgets, device=x.device), torch.tensor(counts, device=x.device), None, None,
                         None, m >= H, counts)

    def prefix(self, heads: Tensor) -> Tuple[Tensor, Tensor]:
        """Each input's selection, its first ``heads`` heads (B x H, bool), and its
        relevance, uniform over them (a statistic: 1/k on the prefix, 0 past it)."""
        heads = heads.unsqueeze(-1)
        selected = self.position < heads
        return selected, selected / heads
