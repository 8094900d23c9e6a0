"""The exploration schedule: how far head choice departs from top-k at an update.

A pure function of the update number, which fairseq hands the model on every update
(``set_num_updates``) and restores from a checkpoint, so a resumed run continues
exactly where it stopped. Evaluation never explores."""

import math
from typing import NamedTuple

from ..config import BudgetConfig


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
