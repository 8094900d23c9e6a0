"""Issue 42's study: does one nested fine-tuning give, at each width, what a model
fine-tuned for that width alone gives, and how fast is each against the dense model on
ONNX Runtime int8? Per data set and seed (SAVE_DIR = ROOT/DATASET-seedN):

1. ``budget-finetune`` as a user runs it (the default recipe, the study's update budget);
2. the baselines (per_width.py): the dense model cut to widths 0.5 and 0.3 and fine-tuned
   for each alone, and its first 4 of 6 layers fine-tuned so, each with the dense step's
   command;
3. every system measured side by side in one process on the real test sentences: dense
   in PyTorch eager and PyTorch dynamic int8; dense, every width of the nested model, the
   per-width models and the 4-layer model in ONNX Runtime fp32 and int8 (exported as a
   user exports them, budget-export-onnx's folders under SAVE_DIR/onnx/); accuracy on
   dev and test, latency at batch 1 and 32 (serving_study.measured).

Each step's output is kept (training: done.json; measurement: the record
``RECORDS/DATASET-seedN.json``, committed): a second run does only what is missing, so
the study spans sessions. seeds_report.py reads the records."""

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch

from budget_plugin.serving.width_latency import onnx_folder
from budget_plugin.tools.checkpoints import load_checkpoint
from budget_plugin.tools.fairseq_cli import run
from budget_plugin.tools.files import write_json
from budget_research.per_width import train_baselines
from budget_research.pretrained import get_data, pretrained_minilm
from budget_research.serving_study import dense_runs, measured, onnx_runs
from budget_research.timing import machine_info
from budget_research.width_study import DIAL_WIDTHS

ALONE = ("0.5", "0.3")  # the widths fine-tuned alone


@dataclass(frozen=True)
class Dataset:
    data: Path  # binarized (OUT/NAME-bin), relative to the repository
    updates: int  # each fine-tuning's update budget
    validate: int  # dev scored every this many updates
    truncate: Optional[int] = None  # each text's first pieces (get_data.py --truncate-tokens)


# MR and TREC at the earlier studies' budgets (study/plan.py); BBC News cut at 254 pieces
# (256 positions with <s> and </s>), not at the latency study's 126
DATASETS = {
    "MR": Dataset(Path("data/minilm/MR-bin"), 240, 80),
    "TREC": Dataset(Path("data/minilm/TREC-bin"), 270, 90),
    "BBC": Dataset(Path("data/bbc256/BBC-bin"), 60, 20, truncate=254),
}
# timing: the first 64 test sentences one at a time, the first 4 batches of 32, median of 5
# interleaved rounds after a warm-up round
SINGLES, BATCHES, ROUNDS = 64, 4, 5


def prepared(name: str, model_dir: Path, cache: Path, log: Callable[[str], None]) -> None:
    """The converted encoder and the data set, made when missing (as get_data.py makes them)."""
    pretrained_minilm(model_dir, cache, log)
    data = DATASETS[name].data
    if not (data / "label" / "test.idx").is_file():
        truncate = DATASETS[name].truncate
        log(f"preparing {name} into {data}")
        get_data([name], data.parent, cache, model_dir, *(["--truncate-tokens", truncate] if truncate else []))


def finetuned(model_dir: Path, dataset: Dataset, save_dir: Path, seed: int, threads: int,
              log: Callable[[str], None], options: Sequence = ()) -> None:
    """budget-finetune into ``save_dir`` with the study's schedule and ``options``."""
    recipe_run(model_dir, dataset.data, save_dir, seed, threads, log,
               ["--max-updates", dataset.updates, "--validate-interval-updates", dataset.validate, *options])


def recipe_run(model_dir: Path, data: Path, save_dir: Path, seed: int, threads: int,
               log: Callable[[str], None], options: Sequence = ()) -> None:
    """budget-finetune into ``save_dir`` on the CPU with ``options``, its log beside it
    (it resumes; skipped once calibrated)."""
    if (save_dir / "nested" / "calibration.json").is_file():
        return
    log(f"budget-finetune -> {save_dir}")
    save_dir.parent.mkdir(parents=True, exist_ok=True)
    run([Path(sys.executable).with_name("budget-finetune"), model_dir, data, save_dir, "--seed", seed,
         "--threads", threads, "--cpu", "--no-latency", *options], log_path=save_dir.parent / f"{save_dir.name}.log",
        progress=lambda line: "[budget-finetune" in line or "valid on 'valid'" in line)


def checkpoints(save_dir: Path, baselines: Dict[str, Path]) -> Dict[str, Tuple[Path, str]]:
    """Every system served through ONNX Runtime: (its checkpoint, its width or None)."""
    nested = save_dir / "nested" / "checkpoint_best.pt"
    found = {"dense": (save_dir / "dense" / "checkpoint_best.pt", None)}
    found.update({f"width {w}": (nested, w) for w in DIAL_WIDTHS})
    found.update({name: (path, None) for name, path in baselines.items()})
    return found


def systems(save_dir: Path, data: Path, baselines: Dict[str, Path], threads: int,
            log: Callable[[str], None]) -> Tuple[Dict[str, Callable], Dict[str, dict], object]:
    """Each system's run (tokens -> logits) by name, the ONNX manifests by name, the task."""
    dense, task = load_checkpoint(save_dir / "dense" / "checkpoint_best.pt", data)
    runs, manifests = dense_runs(dense), {}
    for name, (checkpoint, width) in checkpoints(save_dir, baselines).items():
        folder = save_dir / "onnx" / name.replace(" ", "-")
        manifests[name] = onnx_folder(checkpoint, data, folder, width, log)
        runs.update(onnx_runs(name, folder, threads))
    return runs, manifests, task


def train_seconds(save_dir: Path, baselines: Dict[str, Path]) -> Dict[str, float]:
    steps = {"dense": save_dir / "dense", "nested": save_dir / "nested",
             **{name: path.parent for name, path in baselines.items()}}
    return {name: json.loads((folder / "done.json").read_text())["train_wall_s"] for name, folder in steps.items()}


def study_seed(model_dir: Path, dataset: str, seed: int, root: Path, records: Path, cache: Path,
               threads: int = 2, log: Callable[[str], None] = print) -> dict:
    """One data set and seed, trained and measured unless its record exists."""
    record = records / f"{dataset}-seed{seed}.json"
    if record.is_file():
        return json.loads(record.read_text())
    spec, save_dir = DATASETS[dataset], root / f"{dataset}-seed{seed}"
    prepared(dataset, model_dir, cache, log)
    finetuned(model_dir, spec, save_dir, seed, threads, log)
    baselines = train_baselines(save_dir, list(ALONE), log, threads)
    torch.set_num_threads(threads)
    runs, manifests, task = systems(save_dir, spec.data, baselines, threads, log)
    found = measured(runs, task, SINGLES, BATCHES, ROUNDS, log)
    study = {"dataset": dataset, "seed": seed, "save_dir": str(save_dir), "threads": threads,
             "timing": {"singles": SINGLES, "batches": BATCHES, "rounds": ROUNDS},
             "machine": machine_info(torch.device("cpu")), "train_wall_s": train_seconds(save_dir, baselines),
             "systems": found,
             "exports": {name: {key: m[key] for key in ("heads", "neurons", "model_flops_ratio", "full")}
                         for name, m in manifests.items()}}
    write_json(record, study)
    return study
