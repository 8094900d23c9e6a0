"""The baselines one nested fine-tuning must match (issue 42): a model fine-tuned for one
width alone, and the model cut to its first layers. Each starts from budget-finetune's
dense step (SAVE_DIR) and is fine-tuned alone with the dense step's own command (its data,
update budget, learning rate and seed), only the model changed:

* ``width R alone``: the dense model, its heads and FFN neurons in importance order
  (SAVE_DIR/reordered.pt, the nested step's start), cut to the heads and neurons per
  layer that the nested model runs at width R (the same shape, so the same latency),
  then fine-tuned at that width (CoFi's and FastFormers' one model per budget);
* ``4 of 6 layers``: the dense model's first two thirds of its layers (fairseq's
  ``--encoder-layers-to-keep``; MiniLM's first 4 of 6), fine-tuned so.

Each lands in SAVE_DIR/baselines/NAME/ with train_step's done.json: a finished one is
never trained again."""

import json
from pathlib import Path
from typing import Callable, List, Optional

import torch

from budget_plugin.nested.export import export_width, pruned_checkpoint
from budget_plugin.nested.recipe import train_step
from budget_plugin.tools.checkpoints import as_budgetformer, model_options, read
from budget_plugin.tools.files import atomic_path
from budget_research.recipe_study import replaced

LAYERS_KEPT = 2 / 3  # of the dense model's layers, the first ones


def baseline_dir(save_dir: Path, name: str) -> Path:
    return save_dir.resolve() / "baselines" / name.replace(" ", "-")


def dense_command(save_dir: Path, out: Path, restore: Path) -> List[str]:
    """The dense step's fairseq-train command, saving to ``out`` and starting from ``restore``."""
    recipe = json.loads((save_dir / "recipe.json").read_text())
    return replaced(recipe["dense"], {"--save-dir": out, "--tensorboard-logdir": out / "tensorboard",
                                      "--restore-file": restore})


def width_alone_start(save_dir: Path, width: str) -> dict:
    """The dense model in importance order cut to the nested model's shape at ``width``,
    as a checkpoint (a pruned BudgetFormer: ``--head-selection pruned``)."""
    nested = read(save_dir / "nested" / "checkpoint_best.pt")
    cut = export_width(nested, width)
    dense = as_budgetformer(read(save_dir / "reordered.pt")).state_dict()
    return pruned_checkpoint({**nested, "model": dense}, list(cut.heads), list(cut.neurons))


def width_alone_command(save_dir: Path, width: str, out: Path) -> List[str]:
    """The dense step's command for the cut model (written as OUT/start.pt unless there):
    BudgetFormer at its fixed heads and neurons per layer, trained with plain cross-entropy."""
    start = out / "start.pt"
    if start.is_file():
        state = read(start)
    else:
        state = width_alone_start(save_dir, width)
        with atomic_path(start) as tmp:
            torch.save(state, tmp)
    args = model_options(state)
    command = replaced(dense_command(save_dir, out, start), {"--arch": "budgetformer"})
    return command + ["--layernorm-eps", repr(float(args.layernorm_eps)), "--head-selection", "pruned",
                      "--fixed-heads", args.fixed_heads, "--ffn-neurons", args.ffn_neurons,
                      "--min-heads", str(args.min_heads)]


def layers_command(save_dir: Path, out: Path) -> List[str]:
    dense = save_dir.resolve() / "dense" / "checkpoint_best.pt"
    kept = round(LAYERS_KEPT * model_options(read(dense)).encoder_layers)
    command = dense_command(save_dir, out, dense)
    return command + ["--encoder-layers-to-keep", ",".join(map(str, range(kept)))]


def train_baselines(save_dir: Path, widths: List[str], log: Callable[[str], None] = print,
                    threads: Optional[int] = None) -> dict:
    """Each baseline's best checkpoint by name (``width R alone`` for each of ``widths``,
    ``4 of 6 layers``), trained unless done."""
    planned = {f"width {w} alone": (lambda out, w=w: width_alone_command(save_dir, w, out)) for w in widths}
    planned["4 of 6 layers"] = lambda out: layers_command(save_dir, out)
    found = {}
    for name, command in planned.items():
        out = baseline_dir(save_dir, name)
        if not (out / "done.json").is_file():
            out.mkdir(parents=True, exist_ok=True)
            train_step(name, command(out), out, log, threads)
        found[name] = out / "checkpoint_best.pt"
    return found
