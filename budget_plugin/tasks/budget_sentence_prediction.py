"""Sentence(-pair) classification and regression that scores every evaluation example,
and says in one line when a data folder or split cannot serve what is asked of it."""

import contextlib
import os
from dataclasses import dataclass, field
from typing import Optional

import torch
from fairseq.data import indexed_dataset
from fairseq.dataclass import ChoiceEnum
from fairseq.optim.amp_optimizer import AMPOptimizer
from fairseq.tasks import register_task
from fairseq.tasks.sentence_prediction import SentencePredictionConfig, SentencePredictionTask
from omegaconf import OmegaConf, open_dict

from ..precision import CHOICES, outside_autocast, training_autocast


class DataSplitError(SystemExit):
    """A data folder or split that cannot serve what was asked of it. A SystemExit, so
    that fairseq's command-line tools, which catch nothing, print its one line and exit 1
    instead of a traceback; Python callers catch it by this name."""

    def __init__(self, message: str):
        super().__init__(f"error: {message}")


@dataclass
class BudgetSentencePredictionConfig(SentencePredictionConfig):
    """The task's dial options: task options so that fairseq-validate parses them; they
    are handed to the model (docs/options.md)."""

    head_ratio: Optional[str] = field(
        default=None, metadata={"help": "the head dial at evaluation: a mean head ratio R in [--min-heads / H, 1] "
                                "(calibrated), or one head count per layer ('4,4,3,3,4,4')"}
    )
    width: Optional[str] = field(
        default=None, metadata={"help": "the width dial at evaluation: a ratio R in (0, 1] of heads and FFN "
                                "neurons, or one heads:neurons pair per layer ('4:461,...')"}
    )
    cpu_precision: ChoiceEnum(CHOICES) = field(
        default="auto", metadata={"help": "training on the CPU: bfloat16 autocast, fp32 weights and losses (bf16), "
                                  "fp32 throughout (fp32), or bf16 where the CPU has bfloat16 instructions (auto)"}
    )


@register_task("budget_sentence_prediction", dataclass=BudgetSentencePredictionConfig)
class BudgetSentencePredictionTask(SentencePredictionTask):
    """fairseq's ``sentence_prediction`` (same options and data layout: ``input0/``,
    optional ``input1/``, ``label/``), except that validation and test sets are scored
    in full, that a missing folder or split, or scoring a split without labels, is
    refused in one line, and that ``--head-ratio`` and ``--width`` dial a BudgetFormer.
    (BudgetFormer's options, its exploration schedule included, are model options;
    any model trains with this task.)"""

    def build_model(self, cfg, from_checkpoint=False):
        for option in ("head_ratio", "width"):  # model options fairseq-validate could not parse
            if getattr(self.cfg, option) is not None:
                with open_dict(cfg) if OmegaConf.is_config(cfg) else contextlib.nullcontext():
                    setattr(cfg, option, getattr(self.cfg, option))
        return super().build_model(cfg, from_checkpoint)

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        needed = ["input0/dict.txt"] + ([] if cfg.regression_target else ["label/dict.txt"])
        missing = [name for name in needed if not os.path.isfile(os.path.join(cfg.data, name))]
        if missing:
            raise DataSplitError(f"{cfg.data}: not a binarized data folder (no {' or '.join(missing)}); give the "
                                 "<TASK>-bin folder that budget-prepare wrote")
        return super().setup_task(cfg, **kwargs)

    def _exists(self, key: str, split: str) -> bool:
        path = os.path.join(self.cfg.data, key, split)
        if key == "label" and self.cfg.regression_target:  # regression targets are plain text
            return os.path.isfile(path + ".label")
        return indexed_dataset.infer_dataset_impl(path) is not None

    def load_dataset(self, split, combine=False, **kwargs):
        # fairseq's own message is an assertion deep in its loader
        if not self._exists("input0", split):
            found = sorted(f[:-4] for f in os.listdir(os.path.join(self.cfg.data, "input0")) if f.endswith(".idx"))
            raise DataSplitError(f"{self.cfg.data}: no split {split!r} (no input0/{split}.idx); "
                                 f"it has: {', '.join(found) or 'none'}")
        return super().load_dataset(split, combine=combine, **kwargs)

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        """fairseq's train step, with the CPU's autocast (``--cpu-precision``) beside
        CUDA's (``--amp``), and a criterion that backpropagates its own passes (the
        sandwich's widths: its peak memory is one width's graph, not every width's)
        given the optimizer's backward."""
        model.train()
        model.set_num_updates(update_num)

        def backward(loss):
            with torch.autograd.profiler.record_function("backward"), outside_autocast(model):
                optimizer.backward(loss * 0 if ignore_grad else loss)

        with torch.autograd.profiler.record_function("forward"):
            with training_autocast(self.cfg.cpu_precision, model, isinstance(optimizer, AMPOptimizer)):
                if getattr(criterion, "runs_own_backward", False):
                    return criterion(model, sample, backward=backward)
                loss, sample_size, logging_output = criterion(model, sample)
        backward(loss)
        return loss, sample_size, logging_output

    def valid_step(self, sample, model, criterion):
        # An unlabelled split loads (the hub and the measurements predict on it); only
        # scoring it needs labels, which fairseq would look up as a bare KeyError: 'target'.
        if "target" not in sample:
            unlabelled = [s for s in self.datasets if not self._exists("label", s)]
            raise DataSplitError(
                f"split {', '.join(map(repr, unlabelled)) or '?'} of {self.cfg.data} has no labels, so it cannot be "
                "scored (it can be predicted: budget-predict); if its TSV file is labelled, prepare it again "
                "with budget-prepare --labelled-test"
            )
        return super().valid_step(sample, model, criterion)

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
