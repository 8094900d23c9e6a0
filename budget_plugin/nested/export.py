"""A physically smaller model: a nested BudgetFormer at fixed per-layer head counts,
written as a checkpoint whose attention layers hold only their first k heads (the rows
of q/k/v and the columns of out_proj that a prefix reads) and no router
(``--head-selection pruned --fixed-heads k1,...,kL``). It computes what the nested
checkpoint computes at ``--head-ratio k1,...,kL``, loads with fairseq-validate and the
hub, and is smaller on disk. (fairseq's own ``MultiheadAttention._adaptive_prune_heads``
slices stock RoBERTa's weights the same way, but keeps one count for every layer and
leaves a checkpoint that its own configuration cannot rebuild.)

A ratio R exports what the calibrated dial runs at R: its mean heads per layer on the
split it was calibrated on, made whole with the same total (:func:`whole_counts`, the
static twin's rounding), not round(R x H) in every layer. A width (``--width``: heads and
FFN neurons per layer) cuts each layer's FFN too, to its first neurons (fc1's rows and
bias, fc2's columns; ``--ffn-neurons``)."""

import argparse
import io
import math
from dataclasses import fields
from pathlib import Path
from typing import List, Optional, Sequence

import torch

from budget_plugin.config import BudgetConfig
from budget_plugin.dial.calibration import RECORD
from budget_plugin.dial.parsing import parse_head_ratio, parse_width
from budget_plugin.dial.settings import Width
from budget_plugin.dial.state_format import DIAL_BUFFERS
from budget_plugin.dial.width import stored_priorities
from budget_plugin.tools.checkpoints import load_checkpoint, model_options, read
from budget_plugin.tools.errors import DataError
from budget_plugin.tools.evaluation import layer_heads, split_batches
from budget_plugin.tools.files import write_atomic

ATTENTION = "encoder.sentence_encoder.layers.{}.self_attn."
LAYER = "encoder.sentence_encoder.layers.{}."


def whole_counts(means: Sequence[float]) -> List[int]:
    """Per-layer head counts as near ``means`` as whole numbers go with the same total
    (the mean total, rounded): each layer rounded down, and the heads left over given to
    the layers with the largest remainders. Rounding each layer alone would give a
    budget of 3.6 heads in every layer 4 everywhere, 11% more heads than the means."""
    counts = [math.floor(h) for h in means]
    left = round(sum(means)) - sum(counts)
    for i in sorted(range(len(means)), key=lambda i: counts[i] - means[i])[:left]:
        counts[i] += 1
    return counts


def dialled_counts(model, batches: Sequence[dict], head_ratio: str) -> List[int]:
    """The static twin of ``model`` at ``head_ratio``: the per-layer counts its dial runs
    there on ``batches``, made whole (whole_counts)."""
    with model.dialled(head_ratio):
        return whole_counts(layer_heads(model, batches))


def check_nested(args: argparse.Namespace):
    if str(getattr(args, "head_selection", "")) != "nested":
        raise DataError("export needs a --head-selection nested checkpoint (its heads ordered so that a budget "
                        f"is a prefix); this one is {getattr(args, 'head_selection', 'not a BudgetFormer')!r}")


def export_counts(checkpoint: Path, head_ratio: str, data: Optional[Path] = None, batch_size: int = 64) -> List[int]:
    """``--head-ratio``'s counts for an export: each layer's count as given, or, for a
    ratio R, the counts the checkpoint's calibrated dial runs at R on the split it was
    calibrated on (of ``data``, which a ratio needs)."""
    state = read(checkpoint)
    args = model_options(state)
    check_nested(args)
    try:
        dial = parse_head_ratio(head_ratio, args.encoder_layers, args.encoder_attention_heads, 1)
    except ValueError as e:
        raise DataError(str(e)) from None
    if dial is None:
        raise DataError("--head-ratio: give a ratio or one count per layer")
    if dial.counts is not None:
        return dial.counts
    if data is None:
        raise DataError(f"--head-ratio {head_ratio}: a ratio exports the counts the dial runs on the split it was "
                        "calibrated on: give that data folder (--data DATA_DIR), or the counts "
                        "(--head-ratio 4,4,3,3,4,4)")
    record = state.get(RECORD)
    if not record:
        raise DataError(f"checkpoint {checkpoint}: no record of the split its dial was calibrated on: calibrate it "
                        f"again (budget-calibrate {checkpoint} {data}), or give the counts (--head-ratio 4,4,3,3,4,4)")
    model, task = load_checkpoint(checkpoint, data)
    return dialled_counts(model, split_batches(task, batch_size, record["split"]), head_ratio)


def export_width(state: dict, width: str) -> Width:
    """``--width``'s heads and neurons per layer for an export of the checkpoint ``state``
    (a ratio allocated as the model's dial allocates it)."""
    args = model_options(state)
    check_nested(args)
    priorities = stored_priorities(state["model"].get("head_priority"), state["model"].get("neuron_priority"))
    try:
        return parse_width(width, args.encoder_layers, args.encoder_attention_heads, args.encoder_ffn_embed_dim,
                           int(getattr(args, "min_heads", 1)), priorities)
    except ValueError as e:
        raise DataError(str(e)) from None


def pruned_checkpoint(state: dict, counts: List[int], neurons: Optional[List[int]] = None) -> dict:
    """The checkpoint dict of the pruned model, each layer holding its first ``counts``
    heads and (given) first ``neurons`` FFN neurons (``state`` is not changed)."""
    args = model_options(state)
    check_nested(args)
    d = args.encoder_embed_dim // args.encoder_attention_heads
    weights = {k: v for k, v in state["model"].items() if ".router." not in k and k not in DIAL_BUFFERS}
    for layer, k in enumerate(counts):
        prefix = ATTENTION.format(layer)
        for name in ("q_proj", "k_proj", "v_proj"):
            for part in ("weight", "bias"):
                if prefix + f"{name}.{part}" in weights:
                    weights[prefix + f"{name}.{part}"] = weights[prefix + f"{name}.{part}"][: k * d].clone()
        weights[prefix + "out_proj.weight"] = weights[prefix + "out_proj.weight"][:, : k * d].clone()
    for layer, f in enumerate(neurons or []):
        prefix = LAYER.format(layer)
        for name in ("fc1.weight", "fc1.bias"):
            weights[prefix + name] = weights[prefix + name][:f].clone()
        weights[prefix + "fc2.weight"] = weights[prefix + "fc2.weight"][:, :f].clone()
    options = argparse.Namespace(**vars(args))
    BudgetConfig.fill_args(options)  # a checkpoint saved before an option existed: the value it ran with
    options.head_selection, options.fixed_heads = "pruned", ",".join(map(str, counts))
    options.initial_budget, options.head_ratio, options.width = None, None, None
    if neurons:
        options.ffn_neurons = ",".join(map(str, neurons))
    options.min_heads = min(int(options.min_heads), *counts)
    defaults = BudgetConfig()
    for name in BudgetConfig(**{f.name: getattr(options, f.name) for f in fields(BudgetConfig)}).inert_options():
        setattr(options, name, getattr(defaults, name))  # the budget options a pruned model has no use for
    cfg = dict(state["cfg"])
    cfg["model"] = options
    exported = {**state, "cfg": cfg, "model": weights, "last_optimizer_state": None}
    exported.pop(RECORD, None)  # an export has no dial
    return exported


def chosen_cut(state: dict, checkpoint: Path, head_ratio: Optional[str], data: Optional[Path],
               width: Optional[str]) -> Width:
    """The heads and FFN neurons per layer that ``width`` (export_width) or ``head_ratio``
    (export_counts; every neuron kept) give the nested checkpoint ``state`` read from
    ``checkpoint``; neither: the whole model."""
    args = model_options(state)
    if width is not None:
        return export_width(state, width)
    if head_ratio is not None:
        counts = export_counts(checkpoint, head_ratio, data)
        return Width(tuple(counts), (args.encoder_ffn_embed_dim,) * len(counts))
    layers = args.encoder_layers
    return Width((args.encoder_attention_heads,) * layers, (args.encoder_ffn_embed_dim,) * layers)


def export_pruned(checkpoint: Path, out: Path, head_ratio: Optional[str] = None, data: Optional[Path] = None,
                  width: Optional[str] = None) -> Width:
    """Write ``checkpoint``'s model cut to ``head_ratio``'s head counts (export_counts;
    every FFN neuron kept) or to ``width``'s heads and neurons as ``out`` (atomically).
    Returns the heads and neurons per layer."""
    if (head_ratio is None) == (width is None):
        raise DataError("export: give --head-ratio (heads) or --width (heads and FFN neurons), one of them")
    state = read(checkpoint)
    cut = chosen_cut(state, checkpoint, head_ratio, data, width)
    buffer = io.BytesIO()
    torch.save(pruned_checkpoint(state, list(cut.heads), None if width is None else list(cut.neurons)), buffer)
    write_atomic(out, buffer.getvalue())
    return cut
