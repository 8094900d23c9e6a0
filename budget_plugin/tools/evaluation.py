"""Scoring a trained checkpoint over the batches of an evaluation split: accuracy, the
heads it runs per layer and per input, and its FLOPs."""

from typing import Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import torch

from budget_plugin.models.hub_interface import head_choice
from budget_plugin.modules.flops import MeasuredFlops, measure_flops


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


def classify(model, tokens, dial=None):
    if dial is None:  # a stock RoBERTa takes no dial
        return model(tokens, classification_head_name="sentence_classification_head")
    return model(tokens, classification_head_name="sentence_classification_head", dial=dial)


@torch.no_grad()
def count_flops(model, batches: Sequence[dict]) -> MeasuredFlops:
    """Whole-model and attention FLOPs (routers included) over the batches."""
    return measure_flops(lambda: [classify(model, tokens(sample)) for sample in batches])


class Scored(NamedTuple):
    accuracy: float  # %
    heads: Optional[List[float]]  # each layer's mean heads (None: a model without head budgets)
    model_flops_ratio: Optional[float]  # the encoder layers' FLOPs against every head and neuron's


@torch.no_grad()
def scored(model, batches: Sequence[dict], dial=None) -> Scored:
    """Accuracy over the batches' examples, the heads run and the FLOPs, in one pass
    (``dial``: a setting for the calls, dial/settings.py; None: the model's own)."""
    correct = examples = 0
    totals, flops, full = None, 0.0, 0.0
    for sample in batches:
        logits, extra = classify(model, tokens(sample), dial)
        correct += int((logits.argmax(-1) == sample["target"].view(-1)).sum())
        examples += logits.size(0)
        if extra.get("budget"):
            layers = extra["budget"]
            heads = torch.stack([layer["heads"].float().sum() for layer in layers])
            totals = heads if totals is None else totals + heads
            flops += sum(float(layer["attn_flops"]) + layer["ffn_flops"] for layer in layers)
            full += sum(float(layer["attn_flops_full"]) + layer["ffn_flops_full"] for layer in layers)
    return Scored(100 * correct / examples, None if totals is None else (totals / examples).tolist(),
                  flops / full if full else None)


def accuracy_and_heads(model, batches: Sequence[dict]) -> Tuple[float, Optional[List[float]]]:
    """Accuracy (%) over the batches' examples and each layer's mean heads (None for a
    model without head budgets), in one pass."""
    found = scored(model, batches)
    return found.accuracy, found.heads


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


def heads_per_input(model, batches: Iterable[dict]) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """N x L x H: the heads each input of fairseq's ``batches`` ran (bool), and its N gold
    classes (None where the split has no labels)."""
    selected, targets = [], []
    for sample in batches:
        selected.append(head_choice(model, tokens(sample)).selected.cpu())
        if "target" in sample:
            targets.append(sample["target"].view(-1).cpu())
    return torch.cat(selected), (torch.cat(targets) if targets else None)


def label_names(task, classes: int) -> List[str]:
    """The task's label names in the classifier's output order."""
    dictionary = task.label_dictionary
    return [dictionary[i + dictionary.nspecial] for i in range(classes)]
