"""Reading fairseq checkpoints for measurement and conversion, one way each: with their
task as fairseq-validate loads them (the data folder given), or as a BudgetFormer of
their own size and options (no data needed)."""

import argparse
import io
from pathlib import Path
from typing import Tuple

import torch

from budget_plugin.tools.building import build_model
from budget_plugin.tools.errors import DataError
from budget_plugin.tools.files import write_atomic


def read(path: Path) -> dict:
    """A checkpoint's dict, read with torch's safe loader (``weights_only=True``; importing
    the plugin allow-lists the argparse.Namespace a legacy fairseq model keeps in its cfg)."""
    if not Path(path).is_file():
        raise DataError(f"checkpoint {path}: no such file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle, zip and torch's own errors: one message naming the file
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DataError(f"checkpoint {path}: cannot be read ({reason})") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise DataError(f"checkpoint {path}: not a fairseq checkpoint (no 'model' state dict)")
    return state


def rewrite(path: Path, state: dict) -> None:
    """Save a checkpoint's dict over ``path``, atomically: the old file stays whole until
    the new one is."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_atomic(path, buffer.getvalue())


def model_options(state: dict) -> argparse.Namespace:
    """The model's options a checkpoint holds: ``cfg.model`` (fairseq-train's, a
    Namespace for legacy models), else the pre-hydra ``args``; empty if neither."""
    cfg = state.get("cfg")
    args = (cfg.get("model") if isinstance(cfg, dict) else getattr(cfg, "model", None)) if cfg is not None else None
    args = args if args is not None else state.get("args")
    if args is None:
        return argparse.Namespace()
    return args if isinstance(args, argparse.Namespace) else argparse.Namespace(**dict(args))


def as_budgetformer(state: dict):
    """A BudgetFormer with the checkpoint's size, options and weights, in eval mode. A
    BudgetFormer architecture is kept; a RoBERTa checkpoint gets head routers that start at
    full budget (the model's warm start), so it computes what RoBERTa computes. Its
    classification heads are kept."""
    args = model_options(state)
    if not hasattr(args, "encoder_embed_dim"):
        raise DataError("the checkpoint holds no RoBERTa model options (cfg.model / args)")
    arch = str(getattr(args, "arch", "roberta"))
    if not arch.startswith(("roberta", "budgetformer")):
        raise DataError(f"expected a RoBERTa or BudgetFormer checkpoint, found arch {arch!r}")
    weights = state["model"]
    vocab = weights["encoder.sentence_encoder.embed_tokens.weight"].size(0)
    if arch.startswith("budgetformer"):
        model = build_model(arch, vocab, args=args)
    else:  # every option kept, the architecture's name replaced
        model = build_model("budgetformer", vocab, args=args, _name="budgetformer")
    for key, head in weights.items():
        if key.startswith("classification_heads.") and key.endswith(".out_proj.weight"):
            name = key.split(".")[1]
            model.register_classification_head(name, head.size(0),
                                               weights[f"classification_heads.{name}.dense.weight"].size(0))
    upgraded = dict(weights)
    model.upgrade_state_dict_named(upgraded, "")
    missing, unexpected = model.load_state_dict(upgraded, strict=False)
    if missing or unexpected:
        raise DataError(f"the checkpoint's weights do not fit: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model.eval()


def load_checkpoint(checkpoint: Path, data: Path) -> Tuple[torch.nn.Module, object]:
    """A checkpoint in evaluation mode and its task, as fairseq-validate loads them."""
    from fairseq import checkpoint_utils

    for path, what in ((checkpoint, "checkpoint"), (data, "data folder")):
        if not Path(path).exists():
            raise DataError(f"{what} {path}: no such file or folder")
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)],
                                                                    arg_overrides={"data": str(data)})
    return models[0].eval(), task
