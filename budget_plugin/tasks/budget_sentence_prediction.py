"""Sentence(-pair) classification and regression with BudgetFormer's exploration schedule."""

import math
from dataclasses import dataclass, field

from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task
from fairseq.tasks.sentence_prediction import (
    SentencePredictionConfig,
    SentencePredictionTask,
)

from ..config_checks import require
from ..modules import Exploration

SCHEDULE_CHOICES = ChoiceEnum(["linear", "cosine"])


@dataclass
class BudgetSentencePredictionTaskConfig(SentencePredictionConfig):
    exploration_updates: int = field(
        default=1000,
        metadata={
            "help": "updates over which exploration anneals to zero; after them head "
            "choice is pure top-k exploitation (0: no exploration)"
        },
    )
    exploration_schedule: SCHEDULE_CHOICES = field(
        default="linear",
        metadata={"help": "shape of the annealing of the exploration rate from 1 to 0"},
    )
    exploration_noise: float = field(
        default=1.0,
        metadata={
            "help": "Gumbel noise scale on the relevance logits at rate 1 "
            "(1.0 = heads sampled without replacement from p)"
        },
    )
    exploration_uniform: float = field(
        default=0.1,
        metadata={
            "help": "probability, at rate 1, that an example ranks its heads "
            "uniformly at random (epsilon-greedy)"
        },
    )
    temperature_start: float = field(
        default=2.0,
        metadata={"help": "softmax temperature of the relevance distribution at rate 1"},
    )
    temperature_end: float = field(
        default=1.0,
        metadata={"help": "softmax temperature at rate 0, and at evaluation"},
    )


def check_schedule(cfg: BudgetSentencePredictionTaskConfig):
    """Fail when the task is built, naming the option and its allowed range."""
    require(cfg.exploration_updates >= 0, "exploration-updates", ">= 0", cfg.exploration_updates)
    require(cfg.exploration_noise >= 0, "exploration-noise", ">= 0", cfg.exploration_noise)
    require(0 <= cfg.exploration_uniform <= 1, "exploration-uniform", "in [0, 1]", cfg.exploration_uniform)
    require(cfg.temperature_start > 0, "temperature-start", "> 0", cfg.temperature_start)
    require(cfg.temperature_end > 0, "temperature-end", "> 0", cfg.temperature_end)
    require(cfg.exploration_schedule in ("linear", "cosine"), "exploration-schedule",
            "one of linear, cosine", cfg.exploration_schedule)


@register_task("budget_sentence_prediction", dataclass=BudgetSentencePredictionTaskConfig)
class BudgetSentencePredictionTask(SentencePredictionTask):
    """fairseq's ``sentence_prediction`` (same data layout: ``input0/``, optional
    ``input1/``, ``label/``) that drives BudgetFormer's exploration schedule.

    The schedule is a pure function of the update number, which fairseq's
    checkpoints restore, so a resumed run continues exactly where it stopped."""

    def __init__(self, cfg, data_dictionary, label_dictionary):
        check_schedule(cfg)
        super().__init__(cfg, data_dictionary, label_dictionary)

    def exploration_at(self, num_updates: float) -> Exploration:
        cfg = self.cfg
        progress = min(1.0, num_updates / cfg.exploration_updates) if cfg.exploration_updates > 0 else 1.0
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

    def get_batch_iterator(self, dataset, max_tokens=None, max_sentences=None,
                           max_positions=None, ignore_invalid_inputs=False,
                           required_batch_size_multiple=1, **kwargs):
        # fairseq drops the last batch when its size is not a multiple of
        # --required-batch-size-multiple: harmless for a shuffled training set, but an
        # evaluation must score every example, so the multiple applies to train alone.
        if dataset is not self.datasets.get("train"):
            required_batch_size_multiple = 1
        return super().get_batch_iterator(
            dataset, max_tokens, max_sentences, max_positions, ignore_invalid_inputs,
            required_batch_size_multiple, **kwargs,
        )

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        if hasattr(model, "set_exploration"):  # evaluation state until training starts
            model.set_exploration(self.exploration_at(math.inf))
        return model

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        if hasattr(model, "set_exploration"):
            model.set_exploration(self.exploration_at(update_num))
        return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

    def valid_step(self, sample, model, criterion):
        if hasattr(model, "set_exploration"):
            model.set_exploration(self.exploration_at(math.inf))
        return super().valid_step(sample, model, criterion)
