"""The exploration schedule of the paper's learned head choice (learned_router.py, and
the static baseline): how far the choice departs from top-k at an update, and the
ranking it perturbs.

A pure function of the update number, which fairseq hands the model on every update
(``set_num_updates``) and restores from a checkpoint, so a resumed run continues
exactly where it stopped. Evaluation never explores."""

import math
from typing import NamedTuple

import torch
from torch import Tensor

from ..config import BudgetConfig
from .router import ranks


class Exploration(NamedTuple):
    rate: float = 0.0  # 1 = full exploration (start of training), 0 = pure top-k exploitation
    noise: float = 0.0  # scale of the Gumbel noise on the relevance logits
    uniform: float = 0.0  # probability that an example's heads are ranked uniformly at random
    temperature: float = 1.0  # softmax temperature of the relevance distribution


def exploration_at(cfg: BudgetConfig, num_updates: float, training: bool = True) -> Exploration:
    """The schedule at ``num_updates``; after ``--exploration-updates`` (or when not
    training) rate 0 at ``--temperature-end``."""
    if not training or cfg.exploration_updates <= 0:
        progress = 1.0
    else:
        progress = min(1.0, num_updates / cfg.exploration_updates)
    if cfg.exploration_schedule == "cosine":
        rate = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        rate = 1.0 - progress
    return Exploration(
        rate=rate,
        noise=cfg.exploration_noise * rate,
        uniform=cfg.exploration_uniform * rate,
        temperature=cfg.temperature_end + (cfg.temperature_start - cfg.temperature_end) * rate,
    )


def explored_ranks(logits: Tensor, exploration: Exploration, training: bool) -> Tensor:
    """Rank of every head (0 = most relevant) under ``exploration`` while training.

    Gumbel noise of scale ``noise`` on ``logits / temperature`` makes the top-k a sample
    without replacement from p (Gumbel-top-k); with probability ``uniform`` an example's
    ranking is replaced by a uniformly random permutation."""
    scores = logits.detach() / exploration.temperature
    noise, uniform = exploration.noise, exploration.uniform
    if training and (noise > 0 or uniform > 0):
        gumbel = -torch.empty_like(scores).exponential_().log()
        scores = scores + noise * gumbel
        if uniform > 0:
            at_random = torch.rand_like(scores[:, :1]) < uniform
            scores = torch.where(at_random, gumbel, scores)
    return ranks(scores)
