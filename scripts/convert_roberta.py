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
from pathlib import Path

import torch

from budget_plugin.tools.building import build_model  # registers the model; allow-lists checkpoint types
from budget_plugin.tools.files import atomic_path


def convert(state: dict) -> dict:
    cfg = state.get("cfg") or {}
    args = cfg.get("model") if isinstance(cfg, dict) else None
    args = args if args is not None else state.get("args")
    if args is None or not hasattr(args, "encoder_embed_dim"):
        raise SystemExit("error: the checkpoint holds no RoBERTa model arguments (cfg.model / args)")
    if not str(getattr(args, "arch", "roberta")).startswith(("roberta", "budgetformer")):
        raise SystemExit(f"error: expected a RoBERTa checkpoint, found arch {args.arch!r}")
    weights = state["model"]
    vocab = weights["encoder.sentence_encoder.embed_tokens.weight"].size(0)
    model = build_model("budgetformer", vocab, args=args, _name="budgetformer")  # the same size, every option kept
    args = model.args
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
    with atomic_path(args.output) as tmp:  # never a half-written checkpoint
        torch.save(converted, tmp)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
