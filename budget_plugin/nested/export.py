"""A physically smaller model: a nested BudgetFormer at fixed per-layer head counts,
written as a checkpoint whose attention layers hold only their first k heads (the rows
of q/k/v and the columns of out_proj that a prefix reads) and no router
(``--head-selection pruned --fixed-heads k1,...,kL``). It computes what the nested
checkpoint computes at ``--head-ratio k1,...,kL``, loads with fairseq-validate and the
hub, and is smaller on disk. (fairseq's own ``MultiheadAttention._adaptive_prune_heads``
slices stock RoBERTa's weights the same way, but keeps one count for every layer and
leaves a checkpoint that its own configuration cannot rebuild.)"""

import argparse
import io
from dataclasses import fields
from pathlib import Path
from typing import List

import torch

from budget_plugin.config import BudgetConfig
from budget_plugin.models.budget_dial import parse_head_ratio
from budget_plugin.tools.checkpoints import model_options, read
from budget_plugin.tools.errors import DataError
from budget_plugin.tools.files import write_atomic

ATTENTION = "encoder.sentence_encoder.layers.{}.self_attn."


def export_counts(args: argparse.Namespace, head_ratio: str) -> List[int]:
    """``--head-ratio``'s counts for an export: each layer's count as given, or, for a
    ratio R, round(R x H) in every layer (a fixed budget: the export runs no router)."""
    L, H = args.encoder_layers, args.encoder_attention_heads
    try:
        dial = parse_head_ratio(head_ratio, L, H, 1)
    except ValueError as e:
        raise DataError(str(e)) from None
    if dial is None:
        raise DataError("--head-ratio: give a ratio or one count per layer")
    return dial.counts or [max(1, round(dial.ratio * H))] * L


def pruned_checkpoint(state: dict, counts: List[int]) -> dict:
    """The checkpoint dict of the pruned model (``state`` is not changed)."""
    args = model_options(state)
    if str(getattr(args, "head_selection", "")) != "nested":
        raise DataError("export needs a --head-selection nested checkpoint (its heads ordered so that a budget "
                        f"is a prefix); this one is {getattr(args, 'head_selection', 'not a BudgetFormer')!r}")
    d = args.encoder_embed_dim // args.encoder_attention_heads
    weights = {k: v for k, v in state["model"].items() if ".router." not in k and k != "head_dial"}
    for layer, k in enumerate(counts):
        prefix = ATTENTION.format(layer)
        for name in ("q_proj", "k_proj", "v_proj"):
            for part in ("weight", "bias"):
                if prefix + f"{name}.{part}" in weights:
                    weights[prefix + f"{name}.{part}"] = weights[prefix + f"{name}.{part}"][: k * d].clone()
        weights[prefix + "out_proj.weight"] = weights[prefix + "out_proj.weight"][:, : k * d].clone()
    options = argparse.Namespace(**vars(args))
    options.head_selection, options.fixed_heads = "pruned", ",".join(map(str, counts))
    options.initial_budget, options.head_ratio = None, None
    options.min_heads = min(int(options.min_heads), *counts)
    defaults = BudgetConfig()
    for name in BudgetConfig(**{f.name: getattr(options, f.name) for f in fields(BudgetConfig)}).inert_options():
        setattr(options, name, getattr(defaults, name))  # the budget options a pruned model has no use for
    cfg = dict(state["cfg"])
    cfg["model"] = options
    return {**state, "cfg": cfg, "model": weights, "last_optimizer_state": None}


def export_pruned(checkpoint: Path, out: Path, head_ratio: str) -> List[int]:
    """Write ``checkpoint``'s model pruned to ``head_ratio``'s counts as ``out``
    (atomically). Returns the counts."""
    state = read(checkpoint)
    counts = export_counts(model_options(state), head_ratio)
    buffer = io.BytesIO()
    torch.save(pruned_checkpoint(state, counts), buffer)
    write_atomic(out, buffer.getvalue())
    return counts
