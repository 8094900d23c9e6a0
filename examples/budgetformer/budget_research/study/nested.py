"""The latency study's nested model: one per data set and seed, made by
budget-finetune's recipe (dense -> importance -> reorder -> nested -> the dial
calibrated on dev) with the study's recipe, seed and update budget, then scored on dev
and test at every dial setting twice: with its per-input budgets, and at the fixed
per-layer counts those budgets ran on dev (made whole with the same total: chosen on
dev), every input alike and no router (the static twin). The recipe's dense step is scored too: it retrains the
study's ``dense`` run, whose checkpoint was not kept, so its accuracy must equal the record's.

The record (results/reproduce/DATASET/nested-seedN.json) is written last and atomically;
a record of today's recipe is never redone."""

import time
from dataclasses import asdict
from typing import Dict, List

import torch

from budget_plugin.nested.recipe import NestedRecipe, finetune_nested
from budget_plugin.tools.checkpoints import load_checkpoint
from budget_plugin.tools.evaluation import accuracy_and_heads, accuracy_and_ratio, split_batches
from budget_plugin.tools.files import write_json
from budget_plugin.tools.progress import log
from budget_research.benchmark.dial import whole_counts
from budget_research.study.plan import Run, StudyConfig, cached_record, recipe_of

DIAL = ("1", "0.75", "0.5", "0.3", "0.2")  # the head ratios the nested model is dialled to
SPLITS = ("valid", "test")


def scored(model, batches: Dict[str, List[dict]], head_ratio: str) -> dict:
    """Accuracy on dev and test and heads per layer (dev, test) at one dial setting."""
    with model.dialled(head_ratio):
        found = {}
        for split, split_batches_ in batches.items():
            accuracy, heads = accuracy_and_heads(model, split_batches_)
            found[split] = {"accuracy": accuracy, "heads_per_layer": heads}
    return found


def train_nested(run: Run, cfg: StudyConfig) -> dict:
    """The nested model of ``run`` (system ``nested``), trained once and scored at every
    dial setting; its record."""
    # the heads alone, calibrated on all of dev, as the study measured them (its records
    # predate the FFN's widths and the calibration's sample)
    recipe, nested = recipe_of(run.dense(), cfg), NestedRecipe(min_ffn_ratio=0.0, calibration_examples=None)
    settings = {key: value for key, value in asdict(nested).items()
                if key not in ("min_ffn_ratio", "calibration_examples")}
    expected = {"recipe": asdict(recipe), "nested": settings, "dial": list(DIAL)}
    record = cached_record(run.record(cfg), **expected)
    if record is not None:
        return record
    start = time.time()
    best = finetune_nested(cfg.model_dir, run.data(cfg), run.checkpoints(cfg), recipe, nested,
                           log=lambda line: log(f"{run.dataset} seed {run.seed} {line}"),
                           threads=cfg.threads_per_job)
    torch.set_num_threads(cfg.threads_per_job)
    model, task = load_checkpoint(best["nested"], run.data(cfg))
    batches = {split: split_batches(task, 32, split) for split in SPLITS}
    dense, _ = load_checkpoint(best["dense"], run.data(cfg))
    dial, fixed = {}, {}
    for ratio in DIAL:
        dial[ratio] = scored(model, batches, ratio)
        if ratio != "1":
            counts = whole_counts(dial[ratio]["valid"]["heads_per_layer"])
            fixed[ratio] = {"counts": counts, **scored(model, batches, ",".join(map(str, counts)))}
    record = {
        "dataset": run.dataset, "system": "nested", "seed": run.seed, **expected,
        "dense_step": {split: accuracy_and_ratio(dense, batches[split])[0] for split in SPLITS},
        "dial_per_input": dial, "dial_fixed": fixed, "wall_s": round(time.time() - start, 1),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    write_json(run.record(cfg), record)
    log(f"{run.dataset} nested seed {run.seed}: dev " + ", ".join(
        f"{r} {dial[r]['valid']['accuracy']:.1f}" for r in DIAL) + f" ({record['wall_s']:.0f} s)")
    return record


def twin_counts(record: dict, ratio: str) -> List[int]:
    """The static twin's per-layer counts at ``ratio`` (chosen on dev), from a nested record."""
    return record["dial_fixed"][ratio]["counts"]
