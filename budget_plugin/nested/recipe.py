"""The one command that makes a budgeted model from a converted encoder and one's own
data (scripts/finetune.py): every budget in one fine-tuned model.

1. ``dense``: fairseq's own ``roberta`` fine-tuned (finetune.py's recipe);
2. ``importance``: Michel et al.'s head importance of it on training examples;
3. ``reordered.pt``: its heads permuted into importance order (tools/reorder.py: the
   same function), so that every budget's heads are a prefix, the most important ones;
4. ``nested``: BudgetFormer ``--head-selection nested`` fine-tuned from it, every update
   training the router's per-input budgets and the sandwich of fixed widths, distilled
   in place from the full width;
5. the budget dial calibrated on dev and stored in ``nested/checkpoint_best.pt``.

Each step leaves its output under SAVE_DIR and a step that has finished is never run
again: a command that stopped (Ctrl-C, a machine that went away) resumes at the step
it was in, which starts over."""

import json
import shlex
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, Optional

import torch

from budget_plugin.data.binarize import count_binarized, num_classes
from budget_plugin.nested import finetune
from budget_plugin.nested.calibration import calibrate_checkpoint
from budget_plugin.nested.importance import head_importance
from budget_plugin.nested.reorder import reorder_heads
from budget_plugin.tools.checkpoints import read
from budget_plugin.tools.fairseq_cli import run, train_options
from budget_plugin.tools.files import atomic_path, write_json

TRAINING_PROGRESS = ("| train_inner |", "valid on 'valid'", "done training")


@dataclass
class NestedRecipe:
    importance_examples: int = 2048  # the study's: importance over the first 2048 training examples
    lr: float = 1e-4  # as the dense step's
    max_updates: Optional[int] = None  # default: the dense step's updates
    min_heads: int = 2  # the smallest width trained (2 of MiniLM's 12: ratio 0.17)
    sandwich_widths: int = 3  # every head, the smallest, one random width per update
    target_head_ratio: float = 0.5  # where the router's own budgets are held (the dial moves them)
    distill_weight: float = 0.5  # in-place distillation from the full width
    router_scale: float = 10.0


def nested_command(data: Path, reordered: Path, save_dir: Path, dense: finetune.Recipe, nested: NestedRecipe,
                   updates: int, classes: int) -> list:
    """fairseq-train's command line for the nested step, from the reordered dense model.
    No --layernorm-eps: the dense model was fine-tuned with fairseq's (1e-5), which the
    nested model keeps so that at full width it computes what the dense model computes."""
    model = torch.load(reordered, map_location="cpu", weights_only=True, mmap=True)["cfg"]["model"]
    flags = ["--encoder-layers", model.encoder_layers, "--encoder-embed-dim", model.encoder_embed_dim,
             "--encoder-ffn-embed-dim", model.encoder_ffn_embed_dim,
             "--encoder-attention-heads", model.encoder_attention_heads, "--max-positions", model.max_positions]
    return [
        *train_options(data, save_dir, lr=nested.lr, updates=updates, warmup=max(1, round(dense.warmup_share * updates)),
                       seed=dense.seed, num_classes=classes, batch_size=dense.batch_size,
                       log_interval=dense.log_interval),
        "--task", "budget_sentence_prediction", "--arch", "budgetformer", *flags,
        "--head-selection", "nested", "--min-heads", nested.min_heads, "--router-scale", nested.router_scale,
        "--criterion", "budget_sentence_prediction", "--target-head-ratio", nested.target_head_ratio,
        "--sandwich-widths", nested.sandwich_widths, "--distill-weight", nested.distill_weight,
        "--max-epoch", 10_000, *finetune.checkpoint_options(dense),
        "--restore-file", reordered, "--reset-optimizer", "--reset-dataloader", "--reset-meters",
    ]


def train_step(name: str, command: list, save_dir: Path, log: Callable[[str], None], threads: Optional[int]) -> dict:
    """One fairseq-train run into ``save_dir``, done once: its ``done.json`` (the
    command and wall time, written last) marks it finished."""
    done = save_dir / "done.json"
    if done.is_file():
        log(f"{name}: done before ({save_dir / 'checkpoint_best.pt'})")
        return json.loads(done.read_text())
    save_dir.mkdir(parents=True, exist_ok=True)
    log(f"{name}: $ {shlex.join(map(str, command))}")
    start = time.time()
    run(command, log_path=save_dir / "train.log", threads=threads,
        progress=lambda line: any(marker in line for marker in TRAINING_PROGRESS))
    for interval in save_dir.glob("checkpoint_*_*.pt"):  # only the best is kept
        interval.unlink()
    record = {"command": [str(c) for c in command], "train_wall_s": round(time.time() - start, 1)}
    write_json(done, record)
    return record


def finetune_nested(model_dir: Path, data: Path, save_dir: Path, dense: finetune.Recipe, nested: NestedRecipe,
                    log: Callable[[str], None], threads: Optional[int] = None) -> Dict[str, Path]:
    """The five steps; returns the dense and nested best checkpoints."""
    classes = num_classes(data)
    examples = count_binarized(data / "input0" / "train")
    updates = dense.updates(examples)
    dense_dir, nested_dir = save_dir / "dense", save_dir / "nested"
    log(f"recipe 1/5: dense fine-tuning ({updates} updates)")
    train_step("dense", finetune.command("dense", data, model_dir, dense_dir, dense, examples, classes),
               dense_dir, log, threads)
    dense_best = dense_dir / "checkpoint_best.pt"

    importance_file = save_dir / "importance.json"
    if not importance_file.is_file():
        log(f"recipe 2/5: head importance of the dense model on {nested.importance_examples} training examples")
        importance = head_importance(dense_best, data, "train", dense.batch_size, nested.importance_examples)
        write_json(importance_file, importance.tolist())
    importance = torch.tensor(json.loads(importance_file.read_text()))

    reordered = save_dir / "reordered.pt"
    if not reordered.is_file():
        log("recipe 3/5: heads reordered by importance (the same function)")
        state = read(dense_best)
        state["model"], order = reorder_heads(state["model"], importance)
        state["last_optimizer_state"] = None
        with atomic_path(reordered) as tmp:
            torch.save(state, tmp)
        write_json(save_dir / "order.json", order.tolist())

    nested_updates = nested.max_updates or updates
    log(f"recipe 4/5: nested fine-tuning ({nested_updates} updates; each trains the router's budgets and "
        f"{nested.sandwich_widths} fixed widths)")
    train_step("nested", nested_command(data, reordered, nested_dir, dense, nested, nested_updates, classes),
               nested_dir, log, threads)
    nested_best = nested_dir / "checkpoint_best.pt"

    calibrated = nested_dir / "calibration.json"
    if not calibrated.is_file():
        log("recipe 5/5: the budget dial calibrated on dev")
        table = calibrate_checkpoint(nested_best, data, "valid", log=lambda line: log("    " + line))
        write_json(calibrated, {"split": "valid", "table": table.tolist(), "nested": asdict(nested)})
    return {"dense": dense_best, "nested": nested_best}
