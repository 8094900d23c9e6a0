"""The study's baselines (``--head-selection static|random|kept``): a fixed budget per
layer (``--fixed-heads``, or the kept heads' number) and no budget predictor, so that
what the per-input choice adds can be measured against choices that ignore the input.

- ``static``: one learned relevance per layer, shared by every input (explored while
  training as the learned router's is);
- ``random``: each input's heads drawn uniformly, a fractional budget met on average;
- ``kept``: named heads (``--kept-heads``, e.g. the most important ones)."""

import math
from typing import List, Optional, Tuple

import torch
from torch import Tensor, nn

from ..config import BudgetConfig
from ..dial.settings import NO_DIAL, LayerDial
from .exploration import Exploration, exploration_at, explored_ranks
from .router import HeadRoute, HeadRouter, ranks


class FixedBudgetRouter(HeadRouter):
    """A budget of ``fixed_heads`` for every input; a subclass says which heads rank first."""

    def choice(self, budget: Tensor, exploration: Exploration) -> Tuple[Tensor, Tensor, Tensor, bool]:
        """(logits B x H, heads B, rank B x H, every_head) for a batch of ``budget`` (B)."""
        raise NotImplementedError

    def forward(self, x: Tensor, key_padding_mask: Optional[Tensor], gate: bool = True,
                dial: LayerDial = NO_DIAL) -> HeadRoute:
        budget = x.new_full((x.size(1),), self.fixed_heads, dtype=torch.float)
        exploration = exploration_at(self.cfg, self.num_updates, self.training)
        logits, heads, rank, every_head = self.choice(budget, exploration)
        relevance = torch.softmax(logits / exploration.temperature, dim=-1)
        every_head = every_head or self.cfg.min_heads >= self.num_heads
        return self.ranked_route(budget, heads, relevance, rank, every_head, gate, dial)


class StaticRouter(FixedBudgetRouter):
    def __init__(self, embed_dim: int, num_heads: int, cfg: BudgetConfig, fixed_heads: float):
        super().__init__(embed_dim, num_heads, cfg, fixed_heads)
        self.static_logits = nn.Parameter(torch.zeros(num_heads))  # one relevance for every input
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.normal_(self.static_logits, std=0.02 / self.cfg.router_scale)

    def choice(self, budget: Tensor, exploration: Exploration):
        logits = self.cfg.router_scale * self.static_logits.float().expand(budget.size(0), self.num_heads)
        heads = budget.round().long()
        rank = explored_ranks(logits, exploration, self.training)
        return logits, heads, rank, round(self.fixed_heads) >= self.num_heads


class RandomRouter(FixedBudgetRouter):
    def __init__(self, embed_dim: int, num_heads: int, cfg: BudgetConfig, fixed_heads: float):
        super().__init__(embed_dim, num_heads, cfg, fixed_heads)
        # seeds the draws at inference; a buffer, so that a checkpoint replays them
        self.register_buffer("random_seed", torch.randint(1 << 62, ()))
        self._generator: Optional[torch.Generator] = None

    def uniform_draw(self, shape, device) -> Tensor:
        """Uniform numbers: the global (per-update seeded) generator while training, the
        layer's own seeded one at inference."""
        if self.training:
            return torch.rand(shape, device=device)
        if self._generator is None or self._generator.device != torch.device(device):
            self._generator = torch.Generator(device=device).manual_seed(int(self.random_seed))
        return torch.rand(shape, device=device, generator=self._generator)

    def choice(self, budget: Tensor, exploration: Exploration):
        batch, device = budget.size(0), budget.device
        # the floor or the ceiling, so that the mean is the fractional budget
        fraction = self.fixed_heads - math.floor(self.fixed_heads)
        heads = math.floor(self.fixed_heads) + (self.uniform_draw(batch, device) < fraction).long()
        rank = ranks(self.uniform_draw((batch, self.num_heads), device))
        logits = torch.zeros((batch, self.num_heads), device=device)
        return logits, heads, rank, self.fixed_heads >= self.num_heads


class KeptRouter(FixedBudgetRouter):
    def __init__(self, embed_dim: int, num_heads: int, cfg: BudgetConfig, fixed_heads: float):
        super().__init__(embed_dim, num_heads, cfg, fixed_heads)
        # filled by keep(); a buffer, so that checkpoints hold it
        self.register_buffer("kept", torch.zeros(num_heads, dtype=torch.bool))

    def keep(self, heads: List[int]):
        """The heads this layer runs for every input."""
        with torch.no_grad():
            self.kept.zero_()
            self.kept[heads] = True

    def choice(self, budget: Tensor, exploration: Exploration):
        # ranked first, uniform relevance among them; nothing to explore
        logits = torch.where(self.kept, 0.0, float("-inf")).expand(budget.size(0), self.num_heads)
        heads = budget.round().long()
        return logits, heads, ranks(logits), self.fixed_heads >= self.num_heads
