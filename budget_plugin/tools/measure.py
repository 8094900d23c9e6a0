"""Measuring trained checkpoints side by side: FLOPs and CPU latency over the batches of
an evaluation split, as the accuracy study and the main job report them."""

import statistics
import time
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch

from ..models.hub_interface import head_choice
from ..modules.flops import MeasuredFlops, measure_flops
from .checkpoints import load_checkpoint
from .timing import rotation


def samples(task, subset: str, batch_size: int) -> Iterator[dict]:
    """fairseq's batches of every example of ``subset``, unshuffled (``sample["id"]``
    gives each example's index in the split)."""
    task.load_dataset(subset)
    return iter(task.get_batch_iterator(task.dataset(subset), max_sentences=batch_size).next_epoch_itr(shuffle=False))


def split_batches(task, batch_size: int, subset: str = "test") -> List[dict]:
    """Every example of ``subset``, in order, ``batch_size`` at a time (fairseq's samples)."""
    return list(samples(task, subset, batch_size))


def tokens(sample: dict) -> torch.Tensor:
    return sample["net_input"]["src_tokens"]


def classify(model, tokens):
    return model(tokens, classification_head_name="sentence_classification_head")


@torch.no_grad()
def count_flops(model, batches: Sequence[dict]) -> MeasuredFlops:
    """Whole-model and attention FLOPs (routers included) over the batches."""
    return measure_flops(lambda: [classify(model, tokens(sample)) for sample in batches])


@torch.no_grad()
def accuracy_and_heads(model, batches: Sequence[dict]) -> Tuple[float, Optional[List[float]]]:
    """Accuracy (%) over the batches' examples and each layer's mean heads (None for a
    model without head budgets), in one pass."""
    correct = examples = 0
    totals = None
    for sample in batches:
        logits, extra = classify(model, tokens(sample))
        correct += int((logits.argmax(-1) == sample["target"].view(-1)).sum())
        examples += logits.size(0)
        if extra.get("budget"):
            heads = torch.stack([layer["heads"].float().sum() for layer in extra["budget"]])
            totals = heads if totals is None else totals + heads
    return 100 * correct / examples, (None if totals is None else (totals / examples).tolist())


def accuracy_and_ratio(model, batches: Sequence[dict]) -> Tuple[float, float]:
    """Accuracy (%) over the batches' examples, and the mean head ratio the model ran (1
    for a model without head budgets)."""
    accuracy, heads = accuracy_and_heads(model, batches)
    return accuracy, (sum(heads) / (len(heads) * model.args.encoder_attention_heads) if heads else 1.0)


@torch.no_grad()
def layer_heads(model, batches: Sequence[dict]) -> List[float]:
    """Each layer's mean heads over the batches' examples; for a model without head
    budgets, each layer's own heads (fewer where AdaPrune cut them), with no pass."""
    if not hasattr(model, "budgeted_attentions"):
        return [float(layer.self_attn.num_heads) for layer in model.encoder.sentence_encoder.layers]
    totals, examples = None, 0
    for sample in batches:
        _, extra = model(tokens(sample), features_only=True)
        heads = torch.stack([layer["heads"].float().sum() for layer in extra["budget"]])
        totals = heads if totals is None else totals + heads
        examples += tokens(sample).size(0)
    return (totals / examples).tolist()


@torch.no_grad()
def latencies(models, batches: Sequence[dict], repeats: int) -> List[float]:
    """Seconds per pass over the batches, per model: median of ``repeats`` rounds after
    one warm-up round, the models interleaved (and rotated) within each round, so that
    the machine's drift hits them alike."""
    times = [[] for _ in models]
    for round_ in range(repeats + 1):
        for i in rotation(len(models), round_):
            start = time.perf_counter()
            for sample in batches:
                classify(models[i], tokens(sample))
            if round_ > 0:
                times[i].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def heads_per_input(model, batches: Iterable[dict]) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """N x L x H: the heads each input of fairseq's ``batches`` ran (bool), and its N gold
    classes (None where the split has no labels)."""
    selected, targets = [], []
    for sample in batches:
        selected.append(head_choice(model, tokens(sample)).selected.cpu())
        if "target" in sample:
            targets.append(sample["target"].view(-1).cpu())
    return torch.cat(selected), (torch.cat(targets) if targets else None)


def measure_checkpoints(checkpoints: Dict[str, Path], data: Path, repeats: int, singles: int = 64,
                        timed_batches: Optional[int] = None) -> Dict[str, dict]:
    """Side by side on the test split, per named checkpoint: CPU latency at batch 1 (the
    first ``singles`` examples) and 32 (the first ``timed_batches`` batches; all by
    default), the models interleaved; FLOPs over every example; and for models with
    head budgets the heads each input ran (``heads``: N x L) and its gold class
    (``targets``)."""
    loaded = {name: load_checkpoint(path, data) for name, path in checkpoints.items()}
    task = next(iter(loaded.values()))[1]
    models = [model for model, _ in loaded.values()]
    found = {name: {} for name in loaded}
    batches = split_batches(task, 32)
    for batch_size, timed in ((1, split_batches(task, 1)[:singles]), (32, batches[:timed_batches])):
        seconds = latencies(models, timed, repeats)
        for name, t in zip(loaded, seconds):
            found[name][f"latency_b{batch_size}_ms"] = 1000 * t / len(timed)
    for name, (model, _) in loaded.items():
        flops = count_flops(model, batches)
        found[name].update(model_flops=flops.total, attn_flops=flops.attention)
        if hasattr(model, "budgeted_attentions"):
            selected, found[name]["targets"] = heads_per_input(model, batches)
            found[name]["heads"] = selected.sum(-1)
    return found
