#!/usr/bin/env python3
"""Convert a fairseq RoBERTa checkpoint (e.g. roberta.base/model.pt) into a BudgetFormer
checkpoint of the same size.

Every shared weight is taken over unchanged (the budgeted layers keep fairseq's
q_proj/k_proj/v_proj/out_proj, so heads are the same row blocks); the new head routers
start at full budget, so the converted model computes what RoBERTa computes until it is
trained. Use the result with ``fairseq-train --restore-file OUT --reset-optimizer
--reset-dataloader --reset-meters --arch budgetformer ...`` (or give the RoBERTa
checkpoint to ``--restore-file`` directly: the model upgrades it the same way).

    python scripts/convert_roberta.py roberta.base/model.pt budgetformer.base.pt
"""

import argparse
import copy
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import budget_plugin  # noqa: E402,F401  (registers the model; allow-lists checkpoint types)
from budget_plugin.models.budgetformer import BudgetFormerModel, budgetformer_architecture  # noqa: E402
from fairseq.data import Dictionary  # noqa: E402


class _Task:
    """What BudgetFormerModel.build_model needs: the vocabulary's size and padding."""

    def __init__(self, vocab_size, max_positions):
        self.source_dictionary = Dictionary()
        for i in range(vocab_size - len(self.source_dictionary)):
            self.source_dictionary.add_symbol(f"madeupword{i:05d}")
        self._max_positions = max_positions

    def max_positions(self):
        return self._max_positions


def convert(state: dict) -> dict:
    cfg = state.get("cfg") or {}
    args = cfg.get("model") if isinstance(cfg, dict) else None
    args = copy.deepcopy(args if args is not None else state.get("args"))
    if args is None or not hasattr(args, "encoder_embed_dim"):
        raise SystemExit("error: the checkpoint holds no RoBERTa model arguments (cfg.model / args)")
    if not str(getattr(args, "arch", "roberta")).startswith(("roberta", "budgetformer")):
        raise SystemExit(f"error: expected a RoBERTa checkpoint, found arch {args.arch!r}")
    args.arch = args._name = "budgetformer"
    budgetformer_architecture(args)

    weights = state["model"]
    vocab = weights["encoder.sentence_encoder.embed_tokens.weight"].size(0)
    model = BudgetFormerModel.build_model(args, _Task(vocab, args.max_positions))
    for name, head in weights.items():  # keep RoBERTa's classification heads
        if name.startswith("classification_heads.") and name.endswith(".out_proj.weight"):
            head_name = name.split(".")[1]
            model.register_classification_head(
                head_name, head.size(0), weights[f"classification_heads.{head_name}.dense.weight"].size(0)
            )
    converted = dict(weights)
    model.upgrade_state_dict_named(converted, "")
    missing, unexpected = model.load_state_dict(converted, strict=False)
    if missing or unexpected:
        raise SystemExit(f"error: conversion left missing keys {missing} and unexpected keys {unexpected}")
    new = sorted(set(converted) - set(weights))
    dropped = sorted(set(weights) - set(converted))
    print(f"kept {len(weights) - len(dropped)} RoBERTa tensors unchanged; new (router, full budget): "
          f"{len(new)} ({', '.join(new[:2])}, ...); dropped: {dropped or 'none'}")

    out = dict(state)
    out["model"] = converted
    if isinstance(cfg, dict) and cfg.get("model") is not None:
        out["cfg"] = dict(cfg, model=args)
    else:
        out["args"] = args
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input", type=Path, help="RoBERTa checkpoint (fairseq format)")
    parser.add_argument("output", type=Path, help="BudgetFormer checkpoint to write")
    args = parser.parse_args()
    if not args.input.is_file():
        raise SystemExit(f"error: {args.input}: no such file")
    state = torch.load(args.input, map_location="cpu", weights_only=True)
    converted = convert(state)
    tmp = args.output.with_name(args.output.name + ".tmp")
    torch.save(converted, tmp)
    os.replace(tmp, args.output)  # never a half-written checkpoint
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
