"""The one command that makes a budgeted model from a converted encoder and one's own
data (budget-finetune): every budget in one fine-tuned model.

1. ``dense``: fairseq's own ``roberta`` fine-tuned (finetune.py's recipe);
2. ``importance``: Michel et al.'s importance of its heads and FFN neurons on training
   examples;
3. ``reordered.pt``: its heads and FFN neurons permuted into importance order
   (reorder.py: the same function), so that every width is a prefix, the most
   important ones;
4. ``nested``: BudgetFormer ``--head-selection nested`` fine-tuned from it, every update
   training the router's per-input budgets (unless ``router`` is off) and the sandwich of
   fixed widths (heads and, with ``min_ffn_ratio``, FFN neurons), distilled in place from
   the full width;
5. the budget dial calibrated on dev (with the router) and, with the FFN nested, the width
   dial's allocation to the layers chosen on dev (allocation.py), both stored in
   ``nested/checkpoint_best.pt``.

Each step leaves its output under SAVE_DIR, and SAVE_DIR/recipe.json records what each
finished step was run with (fairseq's command line, or the step's settings). The same
command again resumes at the step it stopped in (Ctrl-C, a machine that went away),
which starts over; a finished step is not run again. A command whose step differs from
what was recorded (another ``--lr``, ``--max-updates``, data folder, ...) is refused,
naming what differs, unless ``redo`` is given: then that step and every step after it
run again (their inputs changed)."""

import json
import shlex
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, Optional

import torch

from budget_plugin.data.binarize import count_binarized, num_classes
from budget_plugin.dial.allocation import allocate_checkpoint
from budget_plugin.dial.calibration import calibrate_checkpoint
from budget_plugin.nested import finetune
from budget_plugin.nested.importance import layer_importance
from budget_plugin.nested.reorder import reorder_heads, reorder_neurons
from budget_plugin.nested.step_record import Step, recorded, run_steps
from budget_plugin.option_error import OptionError
from budget_plugin.tools.checkpoints import read
from budget_plugin.tools.fairseq_cli import run, train_options
from budget_plugin.tools.files import atomic_path, write_json
from budget_plugin.tools.memory import release_freed_memory

TRAINING_PROGRESS = ("| train_inner |", "valid on 'valid'", "done training")


@dataclass
class NestedRecipe:
    importance_examples: int = 2048  # the study's: importance over the first 2048 training examples
    lr: float = 1e-4  # as the dense step's
    max_updates: Optional[int] = None  # default: the dense step's updates
    min_heads: int = 2  # the smallest width trained (2 of MiniLM's 12: ratio 0.17)
    sandwich_widths: int = 3  # every head, the smallest, one random width per update
    # the random width at most half of each layer's heads and neurons: more of each update at
    # the narrow widths (chosen on MR's and TREC's dev splits: results/width/candidates-*.md)
    sandwich_max_ratio: float = 0.5
    target_head_ratio: float = 0.5  # where the router's own budgets are held (the dial moves them)
    distill_weight: float = 0.5  # in-place distillation from the full width
    router_scale: float = 10.0
    # the FFN nested too: its neurons ordered by importance, and the smallest width the
    # sandwich trains runs this fraction of them (DynaBERT's smallest width, 0.25); 0: heads only
    min_ffn_ratio: float = 0.25
    # the head dial's calibration runs the model over these examples 15-20 times (17 runs
    # on MR): about 512 dev examples, spread over their lengths, instead of all of dev
    # (MR's 1275) halve its cost; 0 or None: all of dev
    calibration_examples: Optional[int] = 512
    # the router's per-input budgets trained beside the fixed widths (its own pass of each
    # update) and the head dial calibrated on them; off, for a model served at fixed widths
    # (--width): an update 0.64x the time in bf16 (results/width/update-cost-MR.md), no head dial
    router: bool = True
    # the router's pass every N updates, the fixed widths alone between (1: every update)
    router_interval: int = 1
    # the nested step in fp32 on the CPU: in bfloat16 its widths lost up to 2 points on dev
    # on some seeds (results/width/precision/summary.md); "auto" or "bf16" ask for it
    cpu_precision: str = "fp32"


def nested_command(data: Path, model_pt: Path, reordered: Path, save_dir: Path, dense: finetune.Recipe,
                   nested: NestedRecipe, updates: int, classes: int, cpu: bool = True, fp16: bool = False) -> list:
    """fairseq-train's command line for the nested step, from the reordered dense model
    (of the converted encoder ``model_pt``'s size). No --layernorm-eps: the dense model
    was fine-tuned with fairseq's (1e-5), which the nested model keeps so that at full
    width it computes what the dense model computes."""
    flags, _ = finetune.encoder_flags(model_pt)
    return [
        *train_options(data, save_dir, lr=nested.lr, updates=updates,
                       warmup=max(1, round(dense.warmup_share * updates)),
                       seed=dense.seed, num_classes=classes, batch_size=dense.batch_size, max_tokens=dense.max_tokens,
                       log_interval=dense.log_interval, cpu=cpu),
        *finetune.device_options(nested.cpu_precision, cpu, fp16),
        "--task", "budget_sentence_prediction", "--arch", "budgetformer", *flags,
        "--head-selection", "nested", "--min-heads", nested.min_heads, "--router-scale", nested.router_scale,
        "--criterion", "budget_sentence_prediction", "--target-head-ratio", nested.target_head_ratio,
        "--sandwich-widths", nested.sandwich_widths, "--sandwich-max-ratio", nested.sandwich_max_ratio,
        "--distill-weight", nested.distill_weight,
        *(["--min-ffn-ratio", nested.min_ffn_ratio] if nested.min_ffn_ratio else []),
        *([] if nested.router else ["--no-router-pass"]),
        *(["--router-interval", nested.router_interval] if nested.router and nested.router_interval > 1 else []),
        "--max-epoch", 10_000, *finetune.checkpoint_options(dense),
        "--restore-file", reordered, "--reset-optimizer", "--reset-dataloader", "--reset-meters",
    ]


def train_step(name: str, command: list, save_dir: Path, log: Callable[[str], None], threads: Optional[int]) -> dict:
    """One fairseq-train run into ``save_dir``; its ``done.json`` (the command and wall
    time, written last) marks it finished."""
    save_dir.mkdir(parents=True, exist_ok=True)
    log(f"{name}: $ {shlex.join(map(str, command))}")
    release_freed_memory()  # this process's earlier steps' heap, resident beside the child's otherwise
    start = time.time()
    run(command, log_path=save_dir / "train.log", threads=threads, env=finetune.TRAIN_ENV,
        progress=lambda line: any(marker in line for marker in TRAINING_PROGRESS))
    for interval in save_dir.glob("checkpoint_*_*.pt"):  # only the best is kept
        interval.unlink()
    record = {"command": [str(c) for c in command], "train_wall_s": round(time.time() - start, 1)}
    write_json(save_dir / "done.json", record)
    return record


class RecipePaths:
    """Where each step leaves its output under SAVE_DIR."""

    def __init__(self, save_dir: Path):
        self.save_dir = save_dir
        self.dense, self.nested = save_dir / "dense", save_dir / "nested"
        self.dense_best, self.nested_best = self.dense / "checkpoint_best.pt", self.nested / "checkpoint_best.pt"
        self.head_importance, self.neuron_importance = save_dir / "importance.json", save_dir / "neuron_importance.json"
        self.reordered, self.calibration = save_dir / "reordered.pt", self.nested / "calibration.json"


def importance_step(paths: RecipePaths, data: Path, dense: finetune.Recipe, nested: NestedRecipe) -> None:
    found = layer_importance(paths.dense_best, data, "train", dense.batch_size, nested.importance_examples)
    write_json(paths.neuron_importance, found.neurons.tolist())
    write_json(paths.head_importance, found.heads.tolist())


def reorder_step(paths: RecipePaths, nested: NestedRecipe) -> None:
    state = read(paths.dense_best)
    state["model"], order = reorder_heads(state["model"], read_json_tensor(paths.head_importance))
    if nested.min_ffn_ratio:
        state["model"], neuron_order = reorder_neurons(state["model"], read_json_tensor(paths.neuron_importance))
        write_json(paths.save_dir / "neuron_order.json", neuron_order.tolist())
    state["last_optimizer_state"] = None
    with atomic_path(paths.reordered) as tmp:
        torch.save(state, tmp)
    write_json(paths.save_dir / "order.json", order.tolist())


def calibration_step(paths: RecipePaths, data: Path, nested: NestedRecipe, log: Callable[[str], None]) -> None:
    indented = lambda line: log("    " + line)  # noqa: E731
    table = calibrate_checkpoint(paths.nested_best, data, "valid", log=indented,
                                 max_examples=nested.calibration_examples) if nested.router else None
    record = {"split": "valid", "table": None if table is None else table.tolist(), "nested": asdict(nested)}
    if nested.min_ffn_ratio:
        record["allocation"] = allocate_checkpoint(
            paths.nested_best, data, read_json_tensor(paths.head_importance),
            read_json_tensor(paths.neuron_importance), nested.min_ffn_ratio, "valid", log=indented)
    write_json(paths.calibration, record)


def calibration_heading(router: bool, ffn: bool) -> str:
    dials = (["the budget dial calibrated on dev"] if router else []) + \
        (["the width dial's allocation chosen on dev"] if ffn else [])
    return ", and ".join(dials)


def calibration_record(nested: NestedRecipe, ffn: bool) -> dict:
    """The calibration step's settings, as recorded (a run without the router's says so; the
    default's record is what it always was, so that finished runs resume)."""
    record = {"split": "valid", "allocation": ffn, "examples": nested.calibration_examples or None}
    return record if nested.router else {**record, "examples": None, "head_dial": False}


def read_json_tensor(path: Path) -> torch.Tensor:
    return torch.tensor(json.loads(path.read_text()))


def finetune_nested(model_dir: Path, data: Path, save_dir: Path, dense: finetune.Recipe, nested: NestedRecipe,
                    log: Callable[[str], None], threads: Optional[int] = None, redo: bool = False,
                    cpu: bool = True, fp16: bool = False) -> Dict[str, Path]:
    """The five steps; returns the dense and nested best checkpoints. ``cpu``: train on
    the CPU (else fairseq's default device, the GPU); ``fp16``: half-precision training."""
    if not (nested.router or nested.min_ffn_ratio):
        raise OptionError("--no-router needs the FFN nested (--min-ffn-ratio above 0): without the router's "
                          "budgets, the width dial is the model's only dial")
    paths, classes = RecipePaths(save_dir), num_classes(data)
    examples = count_binarized(data / "input0" / "train")
    updates = dense.updates(examples)
    nested_updates = nested.max_updates or updates
    device = {"cpu": cpu, "fp16": fp16}
    dense_run = finetune.command("dense", data, model_dir, paths.dense, dense, examples, classes, **device)
    nested_run = nested_command(data, model_dir / "model.pt", paths.reordered, paths.nested, dense, nested,
                                nested_updates, classes, **device)
    ffn = bool(nested.min_ffn_ratio)
    save_dir.mkdir(parents=True, exist_ok=True)
    run_steps([
        Step("dense", f"dense fine-tuning ({updates} updates)", recorded(dense_run),
             lambda: train_step("dense", dense_run, paths.dense, log, threads)),
        Step("importance", f"head and FFN-neuron importance of the dense model on {nested.importance_examples} "
             "training examples", {"examples": nested.importance_examples, "batch_size": dense.batch_size,
                                   "split": "train"},
             lambda: importance_step(paths, data, dense, nested)),
        Step("reorder", "heads" + (" and FFN neurons" if ffn else "") + " reordered by importance (the same "
             "function)", {"neurons": ffn}, lambda: reorder_step(paths, nested)),
        Step("nested", f"nested fine-tuning ({nested_updates} updates; each trains "
             + ("the router's budgets and " if nested.router else "") + f"{nested.sandwich_widths} fixed widths)",
             recorded(nested_run),
             lambda: train_step("nested", nested_run, paths.nested, log, threads)),
        Step("calibration", calibration_heading(nested.router, ffn), calibration_record(nested, ffn),
             lambda: calibration_step(paths, data, nested, log)),
    ], save_dir, redo, log)
    return {"dense": paths.dense_best, "nested": paths.nested_best}
