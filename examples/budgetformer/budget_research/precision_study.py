"""Does bfloat16 training on the CPU keep fp32's accuracy (issue 51, point 1)? Per data
set and seed, the seeds study's own budget-finetune run (seeds_study.py: the same
schedule, seed and validation) with ``--cpu-precision bf16``, scored on dev in PyTorch
fp32: dense, and the nested model at every width the seeds study serves, with its own
dial. fp32's figures are the seeds study's records of the same runs in fp32 (their
ONNX Runtime fp32 exports' dev accuracy, which budget-export-onnx checks against
fairseq's on dev). Each finished seed's record is kept; test is not read."""

import json
from pathlib import Path
from typing import Callable, Dict, List

from budget_plugin.tools.checkpoints import load_checkpoint
from budget_plugin.tools.evaluation import scored, split_batches
from budget_plugin.tools.files import write_json
from budget_research.seeds_study import DATASETS, finetuned, prepared, train_seconds
from budget_research.width_study import DIAL_WIDTHS

SYSTEMS = ("dense", *(f"width {w}" for w in DIAL_WIDTHS))
WITHIN = 0.3  # the bound on the mean dev loss of each system
SAME_BUT_BF16 = ["--cpu-precision", "bf16", "--router-interval", "1"]


def dev_accuracy(save_dir: Path, data: Path) -> Dict[str, float]:
    """Dev accuracy of the dense model and of the nested one at each width."""
    dense, task = load_checkpoint(save_dir / "dense" / "checkpoint_best.pt", data)
    dev = split_batches(task, 64, "valid")
    found = {"dense": scored(dense, dev).accuracy}
    nested, _ = load_checkpoint(save_dir / "nested" / "checkpoint_best.pt", data)
    found.update({f"width {w}": scored(nested, dev, dial=nested.width_dial(w)).accuracy for w in DIAL_WIDTHS})
    return found


def study_seed(model_dir: Path, dataset: str, seed: int, root: Path, records: Path, cache: Path,
               threads: int = 2, log: Callable[[str], None] = print) -> dict:
    """One data set and seed trained in bfloat16 and scored, unless its record exists."""
    record = records / f"{dataset}-seed{seed}.json"
    if record.is_file():
        return json.loads(record.read_text())
    spec, save_dir = DATASETS[dataset], root / f"{dataset}-seed{seed}"
    prepared(dataset, model_dir, cache, log)
    # the seeds study's recipe in all but the precision (its router's pass on every update)
    finetuned(model_dir, spec, save_dir, seed, threads, log, options=SAME_BUT_BF16)
    recipe = json.loads((save_dir / "recipe.json").read_text())
    found = {"dataset": dataset, "seed": seed, "precision": "bf16", "dev": dev_accuracy(save_dir, spec.data),
             "train_wall_s": train_seconds(save_dir, {}),
             "commands": {step: recipe[step] for step in ("dense", "nested")}}
    write_json(record, found)
    return found


def fp32_dev(seeds_record: dict) -> Dict[str, float]:
    """The seeds study's fp32 dev accuracy of the same systems (ONNX Runtime fp32)."""
    return {name: seeds_record["systems"][f"{name}, ONNX Runtime"]["dev_accuracy"] for name in SYSTEMS}


def report(pairs: Dict[str, List[dict]]) -> str:
    """{dataset: [{"seed", "bf16", "fp32"}]} -> per data set, each system's dev accuracy per
    seed in both precisions and the mean difference, held against WITHIN."""
    lines = ["# bfloat16 training against fp32, dev accuracy", "",
             "The seeds study's runs (same schedule, seed, validation) trained with `--cpu-precision bf16`, "
             "against the seeds study's fp32 records. Dev only; test is not read.", ""]
    for dataset, seeds in pairs.items():
        names = [str(s["seed"]) for s in seeds]
        lines += [f"## {dataset} (seeds {', '.join(names)})", "",
                  "| system | " + " | ".join(f"fp32 / bf16, seed {n}" for n in names) + " | mean bf16 - fp32 | "
                  f"within {WITHIN} |", "|---|" + "---|" * (len(names) + 2)]
        for name in SYSTEMS:
            differences = [s["bf16"][name] - s["fp32"][name] for s in seeds]
            mean = sum(differences) / len(differences)
            cells = " | ".join(f"{s['fp32'][name]:.2f} / {s['bf16'][name]:.2f}" for s in seeds)
            lines.append(f"| {name} | {cells} | {mean:+.2f} | {'held' if mean >= -WITHIN else '**missed**'} |")
        lines.append("")
    return "\n".join(lines)
