"""The width dial's allocation to the layers, chosen on dev (the recipe's last step).

``--width R`` runs R of the model's heads and R of its FFN neurons. Two allocations
are scored on the calibration split at the recipe's widths (width.py, WIDTHS):

* ``uniform``: R in every layer;
* ``importance``: Michel et al.'s global ranking. A unit's importance on the dense
  model (nested/importance.py), divided by its layer's l2 norm of importance, ranks it
  against every layer's units, so that a layer whose units matter more keeps more of
  them. Every layer keeps the trained minimum (--min-heads, the sandwich's smallest FFN
  width): narrower was never trained.

The one with the higher mean dev accuracy over the widths is stored in the checkpoint
(``head_priority``, ``neuron_priority``; a tie keeps ``uniform``, which stores none),
so that the hub, fairseq-validate and the export allocate a ratio as it was chosen."""

from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import torch

from ..tools.checkpoints import load_checkpoint, read, rewrite
from ..tools.evaluation import scored, split_batches
from .parsing import parse_width
from .width import WIDTHS

ALLOCATIONS = ("uniform", "importance")


def priorities(importance: torch.Tensor, kept: int) -> torch.Tensor:
    """L x N: each layer's importances in decreasing order (the order reorder.py put its
    units in), over the layer's l2 norm; the first ``kept`` infinite (always run)."""
    ranked = importance.double().sort(dim=1, descending=True).values
    ranked = ranked / ranked.norm(dim=1, keepdim=True).clamp_min(1e-12)
    ranked[:, :kept] = float("inf")
    return ranked.float()


def allocation_priorities(model, head_importance: torch.Tensor, neuron_importance: torch.Tensor,
                          min_ffn_ratio: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """The ``importance`` allocation's priorities for ``model`` (its trained minimum kept)."""
    neurons = model.args.encoder_ffn_embed_dim
    return (priorities(head_importance, model.budget.min_heads),
            priorities(neuron_importance, max(1, round(min_ffn_ratio * neurons))))


def compare_allocations(model, batches, candidates: Dict[str, Optional[Tuple[torch.Tensor, torch.Tensor]]],
                        widths, log: Callable[[str], None]) -> Dict[str, Dict[str, dict]]:
    """Each candidate's dev accuracy and FLOPs at each width: {name: {width: row}}."""
    args = model.args
    found = {}
    for name, candidate in candidates.items():
        found[name] = {}
        for width in widths:
            cut = parse_width(width, args.encoder_layers, args.encoder_attention_heads, args.encoder_ffn_embed_dim,
                              model.budget.min_heads, candidate)
            score = scored(model, batches, cut.dial())
            found[name][width] = {"accuracy": score.accuracy, "model_flops_ratio": score.model_flops_ratio,
                                  "width": cut.option()}
            log(f"width {width}, {name}: dev accuracy {score.accuracy:.2f}, FLOPs {score.model_flops_ratio:.3f} "
                f"({cut.option()})")
    return found


def allocate_checkpoint(checkpoint: Path, data: Path, head_importance: torch.Tensor,
                        neuron_importance: torch.Tensor, min_ffn_ratio: float, split: str = "valid",
                        batch_size: int = 64, log: Callable[[str], None] = print) -> dict:
    """Choose the width dial's allocation of a nested checkpoint on ``split`` and store
    it in the checkpoint (rewritten atomically). Returns what was compared and chosen."""
    model, task = load_checkpoint(checkpoint, data)
    batches = split_batches(task, batch_size, split)
    candidates = {"uniform": None,
                  "importance": allocation_priorities(model, head_importance, neuron_importance, min_ffn_ratio)}
    widths = [w for w in WIDTHS if float(w) >= min_ffn_ratio]  # none below the smallest trained
    found = compare_allocations(model, batches, candidates, widths, log)
    mean = {name: sum(row["accuracy"] for row in rows.values()) / len(rows) for name, rows in found.items()}
    chosen = max(ALLOCATIONS, key=lambda name: (mean[name], name == "uniform"))
    log(f"allocation: {chosen} (mean dev accuracy over the widths: " +
        ", ".join(f"{name} {value:.2f}" for name, value in mean.items()) + ")")
    state = read(checkpoint)
    heads, neurons = candidates[chosen] or (None, None)
    for key, value, like in (("head_priority", heads, head_importance), ("neuron_priority", neurons,
                                                                          neuron_importance)):
        state["model"][key] = like.new_zeros(0, like.size(1)).float() if value is None else value
    rewrite(checkpoint, state)
    return {"split": split, "chosen": chosen, "mean_accuracy": mean, "widths": found}
