"""Does DynaBERT's hidden-state distillation help the nested step (issue 34, point 2)?
Two nested checkpoints trained from the same reordered model with the same options but
``--distill-hidden-weight`` (0: the recipe's logits-only in-place distillation; w: each
narrower width also fits the full width's layer outputs) are scored side by side on dev
at every width, in both allocations the recipe compares (the same in every layer; by
importance), as the recipe's last step scores them."""

import json
from pathlib import Path
from typing import Callable, Dict

import torch

from budget_plugin.dial.width import WIDTHS
from budget_plugin.dial.allocation import allocation_priorities, compare_allocations
from budget_plugin.tools.checkpoints import load_checkpoint
from budget_plugin.tools.evaluation import split_batches


def compare_nested(checkpoints: Dict[str, Path], data: Path, save_dir: Path, min_ffn_ratio: float = 0.25,
                   log: Callable[[str], None] = print) -> dict:
    """{name: {allocation: {width: row}}} on dev; ``save_dir``: the recipe's folder holding
    the importance both were ordered by."""
    heads, neurons = (torch.tensor(json.loads((save_dir / name).read_text()))
                      for name in ("importance.json", "neuron_importance.json"))
    found = {}
    for name, checkpoint in checkpoints.items():
        model, task = load_checkpoint(checkpoint, data)
        candidates = {"uniform": None, "importance": allocation_priorities(model, heads, neurons, min_ffn_ratio)}
        widths = ["1", *(w for w in WIDTHS if float(w) >= min_ffn_ratio)]
        found[name] = compare_allocations(model, split_batches(task, 64, "valid"), candidates, widths,
                                          log=lambda line, name=name: log(f"{name}: {line}"))
    return found


def report(found: dict, title: str) -> str:
    names = list(found)
    widths = list(next(iter(found[names[0]].values())))
    lines = [f"# {title}", "", "Dev accuracy at each width (the nested model's own dial, no export).", "",
             "| allocation | width | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for allocation in found[names[0]]:
        for width in widths:
            lines.append(f"| {allocation} | {width} | " +
                         " | ".join(f"{found[n][allocation][width]['accuracy']:.2f}" for n in names) + " |")
        lines.append(f"| {allocation} | mean | " + " | ".join(
            f"{sum(r['accuracy'] for r in found[n][allocation].values()) / len(widths):.2f}" for n in names) + " |")
    return "\n".join(lines) + "\n"
