"""How many updates should the recipe spend on a data set (issue 51, point 3)? Per data
set and seed, ``budget-finetune`` as a user runs it (no cap on its updates) under each
schedule of SCHEDULES: the dense step and the nested step get the same updates, so that
dense and every width are compared at equal training. Then, on the rule's run, the
nested step again from the same reordered dense model and with the same command, on the
training set grown by teacher-labelled augmentation (augmentation.py). Each is scored on
dev, dense and every width the seeds study serves (precision_study.dev_accuracy); test
is not read. Every finished run is kept (its folder under ROOT, its scores in the record
RECORDS/DATASET-seedN.json, rewritten after each): a second run trains nothing twice."""

import json
import os
import time
from pathlib import Path
from typing import Callable, Dict, List

from budget_plugin.nested.recipe import NestedRecipe, RecipePaths, calibration_step, train_step
from budget_plugin.tools.files import write_json
from budget_research.augmentation import augment
from budget_research.precision_study import SYSTEMS, dev_accuracy
from budget_research.recipe_candidates import slug
from budget_research.recipe_study import replaced
from budget_research.seeds_study import DATASETS, prepared, recipe_run, train_seconds
from budget_research.small_data import cut_training
from budget_research.width_study import DIAL_WIDTHS

SCHEDULES: Dict[str, List[str]] = {
    "two epochs": ["--min-updates", "0"],  # the recipe before: 126 updates for 2,000 texts
    "at least 480 updates": ["--min-updates", "480"],  # MR's narrow widths held at 480 (issue 51)
}
RULE = "at least 480 updates"
AUGMENTED = "at least 480 updates, teacher-labelled word replacement"
NARROW = [f"width {w}" for w in DIAL_WIDTHS if float(w) <= 0.4]
SMALL = {"MR2k": ("MR", 2000)}  # a small data set: the named one's training split cut to N texts


def data_folder(dataset: str, model_dir: Path, cache: Path, log: Callable[[str], None]) -> Path:
    """The binarized data set, made when missing (a small one cut from its full set)."""
    full, examples = SMALL.get(dataset, (dataset, None))
    prepared(full, model_dir, cache, log)
    data = DATASETS[full].data
    if examples is None:
        return data
    return cut_training(data.parent / "raw" / full, data.parent, dataset, examples, seed=1, model_dir=model_dir,
                        log=log)


def augmented_nested(rule_dir: Path, data: Path, out: Path, threads: int, log: Callable[[str], None]) -> float:
    """The rule's nested step and calibration again in ``out``, on ``data``'s training set
    grown by the dense step's labelled variants; the dense step, importance and reordered
    model are the rule's own (linked). Returns the augmentation's seconds."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("dense", "importance.json", "neuron_importance.json", "reordered.pt"):
        if not (out / name).exists():
            os.symlink((rule_dir / name).resolve(), out / name)
    start = time.time()
    grown = augment(data, rule_dir / "dense" / "checkpoint_best.pt", out / "data", log=log)
    seconds = time.time() - start
    paths = RecipePaths(out)
    if not (paths.nested / "done.json").is_file():
        recipe = json.loads((rule_dir / "recipe.json").read_text())
        command = replaced(recipe["nested"], {"--save-dir": paths.nested.resolve(),
                                              "--tensorboard-logdir": (paths.nested / "tensorboard").resolve()})
        command[command.index(str(data))] = str(grown)  # the data folder: fairseq-train's first argument
        train_step("nested on augmented data", command, paths.nested, log, threads)
    if not paths.calibration.is_file():
        calibration_step(paths, data, NestedRecipe(), log)
    return seconds


def updates(save_dir: Path) -> int:
    command = json.loads((save_dir / "recipe.json").read_text())["nested"]
    return int(command[command.index("--max-update") + 1])


def study_seed(model_dir: Path, dataset: str, seed: int, root: Path, records: Path, cache: Path,
               names: List[str], threads: int = 2, log: Callable[[str], None] = print) -> dict:
    """Each named schedule (and AUGMENTED) of one data set and seed, trained and scored
    unless its record holds it."""
    path = records / f"{dataset}-seed{seed}.json"
    found = json.loads(path.read_text()) if path.is_file() else {"dataset": dataset, "seed": seed, "runs": {}}
    data = data_folder(dataset, model_dir, cache, log)
    for name in names:
        if name in found["runs"]:
            continue
        save_dir = root / f"{dataset}-seed{seed}" / slug(name)
        if name == AUGMENTED:
            rule_dir = root / f"{dataset}-seed{seed}" / slug(RULE)
            recipe_run(model_dir, data, rule_dir, seed, threads, log, SCHEDULES[RULE])
            extra = augmented_nested(rule_dir, data, save_dir, threads, log)
            options = [*SCHEDULES[RULE], "(nested step on the augmented training set)"]
        else:
            recipe_run(model_dir, data, save_dir, seed, threads, log, SCHEDULES[name])
            extra, options = 0.0, SCHEDULES[name]
        found["runs"][name] = {
            "options": options, "updates": updates(save_dir if name != AUGMENTED else rule_dir),
            "dev": dev_accuracy(save_dir, data),
            "train_wall_s": {**train_seconds(save_dir, {}), "augmentation": round(extra, 1)}}
        write_json(path, found)
    return found


def report(records: List[dict]) -> str:
    """Dev accuracy of dense and each width under each schedule, per data set and seed."""
    lines = ["# How many updates: dev accuracy under each schedule", "",
             "`budget-finetune` with each schedule; the dense and nested steps get the same updates. "
             "Dev accuracy (%) of dense and the nested model at each width (its own dial); the wall "
             "times of the steps on 2 cores (augmentation: making and labelling the variants).", ""]
    for record in records:
        names = list(record["runs"])
        runs = record["runs"]
        lines += [f"## {record['dataset']}, seed {record['seed']}", "",
                  "| system | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        lines.append("| updates | " + " | ".join(str(runs[n]["updates"]) for n in names) + " |")
        for system in SYSTEMS:
            lines.append(f"| {system} | " + " | ".join(f"{runs[n]['dev'][system]:.2f}" for n in names) + " |")
        lines.append("| widths 0.4 and below, mean | " + " | ".join(
            f"{sum(runs[n]['dev'][s] for s in NARROW) / len(NARROW):.2f}" for n in names) + " |")
        for step in ("dense", "nested", "augmentation"):
            lines.append(f"| {step} (s) | " + " | ".join(f"{runs[n]['train_wall_s'][step]:.0f}" for n in names) + " |")
        lines += ["", "Options: " + "; ".join(f"{n}: `{' '.join(runs[n]['options'])}`" for n in names), ""]
    return "\n".join(lines)
