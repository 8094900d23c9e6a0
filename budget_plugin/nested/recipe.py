"""The one command that makes a budgeted model from a converted encoder and one's own
data (budget-finetune): every budget in one fine-tuned model.

1. ``dense``: fairseq's own ``roberta`` fine-tuned (finetune.py's recipe);
2. ``importance``: Michel et al.'s importance of its heads and FFN neurons on training
   examples;
3. ``reordered.pt``: its heads and FFN neurons permuted into importance order
   (reorder.py: the same function), so that every width is a prefix, the most
   important ones;
4. ``nested``: BudgetFormer ``--head-selection nested`` fine-tuned from it, every update
   training the router's per-input budgets and the sandwich of fixed widths (heads and,
   with ``min_ffn_ratio``, FFN neurons), distilled in place from the full width;
5. the budget dial calibrated on dev and, with the FFN nested, the width dial's
   allocation to the layers chosen on dev (allocation.py), both stored in
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
from budget_plugin.nested import finetune
from budget_plugin.nested.allocation import allocate_checkpoint
from budget_plugin.nested.calibration import calibrate_checkpoint
from budget_plugin.nested.importance import layer_importance
from budget_plugin.nested.reorder import reorder_heads, reorder_neurons
from budget_plugin.tools.checkpoints import read
from budget_plugin.tools.errors import DataError
from budget_plugin.tools.fairseq_cli import run, train_options
from budget_plugin.tools.files import atomic_path, write_json

TRAINING_PROGRESS = ("| train_inner |", "valid on 'valid'", "done training")
# fairseq-train options that change nothing a step makes, left out of its record
UNRECORDED = ("--log-interval",)


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
    # the FFN nested too: its neurons ordered by importance, and the smallest width the
    # sandwich trains runs this fraction of them (DynaBERT's smallest width, 0.25); 0: heads only
    min_ffn_ratio: float = 0.25
    # the head dial's calibration runs the model over these examples dozens of times (71
    # runs on MR): about 512 dev examples, spread over their lengths, instead of all of
    # dev (MR's 1066) halve its cost; 0 or None: all of dev
    calibration_examples: Optional[int] = 512


def nested_command(data: Path, model_pt: Path, reordered: Path, save_dir: Path, dense: finetune.Recipe,
                   nested: NestedRecipe, updates: int, classes: int, cpu: bool = True, fp16: bool = False) -> list:
    """fairseq-train's command line for the nested step, from the reordered dense model
    (of the converted encoder ``model_pt``'s size). No --layernorm-eps: the dense model
    was fine-tuned with fairseq's (1e-5), which the nested model keeps so that at full
    width it computes what the dense model computes."""
    flags, _ = finetune.encoder_flags(model_pt)
    return [
        *train_options(data, save_dir, lr=nested.lr, updates=updates, warmup=max(1, round(dense.warmup_share * updates)),
                       seed=dense.seed, num_classes=classes, batch_size=dense.batch_size, max_tokens=dense.max_tokens,
                       log_interval=dense.log_interval, cpu=cpu), *(["--fp16"] if fp16 else []),
        "--task", "budget_sentence_prediction", "--arch", "budgetformer", *flags,
        "--head-selection", "nested", "--min-heads", nested.min_heads, "--router-scale", nested.router_scale,
        "--criterion", "budget_sentence_prediction", "--target-head-ratio", nested.target_head_ratio,
        "--sandwich-widths", nested.sandwich_widths, "--distill-weight", nested.distill_weight,
        *(["--min-ffn-ratio", nested.min_ffn_ratio] if nested.min_ffn_ratio else []),
        "--max-epoch", 10_000, *finetune.checkpoint_options(dense),
        "--restore-file", reordered, "--reset-optimizer", "--reset-dataloader", "--reset-meters",
    ]


def train_step(name: str, command: list, save_dir: Path, log: Callable[[str], None], threads: Optional[int]) -> dict:
    """One fairseq-train run into ``save_dir``; its ``done.json`` (the command and wall
    time, written last) marks it finished."""
    save_dir.mkdir(parents=True, exist_ok=True)
    log(f"{name}: $ {shlex.join(map(str, command))}")
    start = time.time()
    run(command, log_path=save_dir / "train.log", threads=threads, env=finetune.TRAIN_ENV,
        progress=lambda line: any(marker in line for marker in TRAINING_PROGRESS))
    for interval in save_dir.glob("checkpoint_*_*.pt"):  # only the best is kept
        interval.unlink()
    record = {"command": [str(c) for c in command], "train_wall_s": round(time.time() - start, 1)}
    write_json(save_dir / "done.json", record)
    return record


def recorded(command: list) -> list:
    """A fairseq command line as a step's record: strings, without UNRECORDED options."""
    tokens = [str(c) for c in command]
    return [token for i, token in enumerate(tokens) if token not in UNRECORDED and
            (i == 0 or tokens[i - 1] not in UNRECORDED)]


def options_of(spec) -> Dict[str, str]:
    """A step's record as option -> value: a command line's ``--flag value`` pairs (what
    precedes the first flag under ``arguments``), or a dict of settings as it is."""
    if isinstance(spec, dict):
        return {key: json.dumps(value) for key, value in spec.items()}
    found, key = {}, "arguments"
    for token in map(str, spec):
        if token.startswith("--"):
            key = token
            found[key] = ""
        else:
            found[key] = f"{found.get(key, '')} {token}".strip()
    return found


def difference(recorded, planned) -> str:
    """What differs between a step's recorded and planned runs, option by option."""
    old, new = options_of(recorded), options_of(planned)

    def shown(value: Optional[str]) -> str:
        return "(unset)" if value is None else value or "(set)"  # a flag without a value is set

    return "; ".join(f"{key} {shown(old.get(key))} (now {shown(new.get(key))})"
                     for key in sorted(old.keys() | new.keys()) if old.get(key) != new.get(key))


class StepRecord:
    """SAVE_DIR/recipe.json: what each finished step was run with, in step order."""

    def __init__(self, save_dir: Path):
        self.path = save_dir / "recipe.json"
        self.steps = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def done(self, name: str) -> bool:
        return name in self.steps

    def finish(self, name: str, spec) -> None:
        self.steps[name] = spec
        write_json(self.path, self.steps)

    def check(self, planned: Dict[str, object], save_dir: Path, redo: bool, log: Callable[[str], None]) -> None:
        """Refuse the first recorded step whose run differs from the planned one; with
        ``redo``, forget it and every step after it, so that they run again (over their
        old files: each step writes all of its output). A step without a record (cut
        short, or from an older version of the recipe) runs again too."""
        names = list(planned)
        stale = next((n for n in names if n in self.steps and self.steps[n] != planned[n]), None)
        if stale is not None and not redo:
            raise DataError(f"{save_dir}: its {stale} step was run with other options: "
                            f"{difference(self.steps[stale], planned[stale])}; give --redo to run it and the steps "
                            "after it again, or another SAVE_DIR")
        if stale is not None:
            log(f"--redo: the {stale} step's options changed; it and the steps after it run again")
        # the first step to run: every step after it takes its output as input
        first = next((i for i, n in enumerate(names) if self.steps.get(n) != planned[n]), len(names))
        for name in names[first:]:
            self.steps.pop(name, None)
        write_json(self.path, self.steps)


def finetune_nested(model_dir: Path, data: Path, save_dir: Path, dense: finetune.Recipe, nested: NestedRecipe,
                    log: Callable[[str], None], threads: Optional[int] = None, redo: bool = False,
                    cpu: bool = True, fp16: bool = False) -> Dict[str, Path]:
    """The five steps; returns the dense and nested best checkpoints. ``cpu``: train on
    the CPU (else fairseq's default device, the GPU); ``fp16``: half-precision training."""
    classes = num_classes(data)
    examples = count_binarized(data / "input0" / "train")
    updates = dense.updates(examples)
    nested_updates = nested.max_updates or updates
    dense_dir, nested_dir = save_dir / "dense", save_dir / "nested"
    dense_best, nested_best = dense_dir / "checkpoint_best.pt", nested_dir / "checkpoint_best.pt"
    importance_file, reordered, calibrated = save_dir / "importance.json", save_dir / "reordered.pt", \
        nested_dir / "calibration.json"
    neuron_importance_file = save_dir / "neuron_importance.json"
    device = {"cpu": cpu, "fp16": fp16}
    dense_command = finetune.command("dense", data, model_dir, dense_dir, dense, examples, classes, **device)
    nested_run = nested_command(data, model_dir / "model.pt", reordered, nested_dir, dense, nested, nested_updates,
                                classes, **device)
    planned = {  # each step's record: what decides its output
        "dense": recorded(dense_command),
        "importance": {"examples": nested.importance_examples, "batch_size": dense.batch_size, "split": "train"},
        "reorder": {"neurons": bool(nested.min_ffn_ratio)},
        "nested": recorded(nested_run),
        "calibration": {"split": "valid", "allocation": bool(nested.min_ffn_ratio),
                        "examples": nested.calibration_examples or None},
    }
    save_dir.mkdir(parents=True, exist_ok=True)
    steps = StepRecord(save_dir)
    steps.check(planned, save_dir, redo, log)

    def step(name: str, heading: str, body: Callable[[], None]) -> None:
        if steps.done(name):
            log(f"{heading}: done before, with the same options")
            return
        log(heading)
        body()
        steps.finish(name, planned[name])

    step("dense", f"recipe 1/5: dense fine-tuning ({updates} updates)",
         lambda: train_step("dense", dense_command, dense_dir, log, threads))

    def importance() -> None:
        found = layer_importance(dense_best, data, "train", dense.batch_size, nested.importance_examples)
        write_json(neuron_importance_file, found.neurons.tolist())
        write_json(importance_file, found.heads.tolist())

    step("importance", f"recipe 2/5: head and FFN-neuron importance of the dense model on "
         f"{nested.importance_examples} training examples", importance)

    def reorder() -> None:
        state = read(dense_best)
        state["model"], order = reorder_heads(state["model"], torch.tensor(json.loads(importance_file.read_text())))
        if nested.min_ffn_ratio:
            neurons = torch.tensor(json.loads(neuron_importance_file.read_text()))
            state["model"], neuron_order = reorder_neurons(state["model"], neurons)
            write_json(save_dir / "neuron_order.json", neuron_order.tolist())
        state["last_optimizer_state"] = None
        with atomic_path(reordered) as tmp:
            torch.save(state, tmp)
        write_json(save_dir / "order.json", order.tolist())

    step("reorder", "recipe 3/5: heads" + (" and FFN neurons" if nested.min_ffn_ratio else "") +
         " reordered by importance (the same function)", reorder)
    step("nested", f"recipe 4/5: nested fine-tuning ({nested_updates} updates; each trains the router's budgets "
         f"and {nested.sandwich_widths} fixed widths)",
         lambda: train_step("nested", nested_run, nested_dir, log, threads))

    def calibrate() -> None:
        indented = lambda line: log("    " + line)  # noqa: E731
        table = calibrate_checkpoint(nested_best, data, "valid", log=indented,
                                     max_examples=nested.calibration_examples)
        record = {"split": "valid", "table": table.tolist(), "nested": asdict(nested)}
        if nested.min_ffn_ratio:
            heads, neurons = (torch.tensor(json.loads(path.read_text())) for path in (importance_file,
                                                                                     neuron_importance_file))
            record["allocation"] = allocate_checkpoint(nested_best, data, heads, neurons, nested.min_ffn_ratio,
                                                       "valid", log=indented)
        write_json(calibrated, record)

    step("calibration", "recipe 5/5: the budget dial calibrated on dev" +
         (", and the width dial's allocation chosen there" if nested.min_ffn_ratio else ""), calibrate)
    return {"dense": dense_best, "nested": nested_best}
