"""A teacher's class logits for every example of a split, for distillation
(``--criterion budget_sentence_prediction --distill-logits FILE``): row i is the example
of id i (the dataset index fairseq's batches carry as ``sample["id"]``)."""

import io
from pathlib import Path

import torch

from budget_plugin.tools.checkpoints import load_checkpoint
from budget_plugin.tools.errors import DataError
from budget_plugin.tools.evaluation import classify, samples, tokens
from budget_plugin.tools.files import write_atomic


@torch.no_grad()
def teacher_logits(checkpoint: Path, data: Path, split: str = "train", batch_size: int = 64) -> torch.Tensor:
    """N x classes float logits of the checkpoint (loaded as fairseq-validate loads it)."""
    model, task = load_checkpoint(checkpoint, data)
    logits = None
    for sample in samples(task, split, batch_size):
        out = classify(model, tokens(sample))[0].float()
        if logits is None:
            logits = torch.full((len(task.dataset(split)), out.size(1)), float("nan"))
        logits[sample["id"]] = out
    if logits is None or torch.isnan(logits).any():
        raise DataError(f"{data}: not every example of '{split}' was scored")
    return logits


def save_logits(path: Path, logits: torch.Tensor) -> Path:
    """``torch.save`` atomically: a half-written file is never read as the teacher."""
    buffer = io.BytesIO()
    torch.save(logits, buffer)
    return write_atomic(path, buffer.getvalue())
