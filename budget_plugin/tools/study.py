"""What the accuracy study (scripts/reproduce.py) and its sweep (scripts/sweep.py)
share: the training recipe, the systems, their command-line options, and run records
cached on disk, so that nothing is trained twice."""

import argparse
import json
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from .building import size_flags
from .fairseq_cli import train_options
from .fairseq_cli import run as run_command

UPDATES = {"MR": 500, "TREC": 500}  # MR: 1.6 epochs, TREC: 3.7 epochs (batch 32)
QUICK_UPDATES = 20  # --quick: keeps the scripts working in the tests, says nothing about accuracy
EXPLORATION_SHARE = 0.4  # share of the updates over which exploration anneals
SYSTEMS = ("full", "budget", "no_explore", "static", "random")


def log(message: str) -> None:
    """A timestamped progress line, named after the running script."""
    print(f"[{Path(sys.argv[0]).stem} {time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass(frozen=True)
class Run:
    dataset: str
    system: str  # one of SYSTEMS, or a sweep's variant
    seed: int

    def dir(self, root: Path) -> Path:
        return root / self.dataset / self.system / f"seed{self.seed}"


def train_command(data: Path, save_dir: Path, *, lr: float, updates: int, seed: int, num_classes: int = 2) -> list:
    """fairseq-train's command line shared by every system: the model options follow."""
    return [
        *train_options(data, save_dir, lr=lr, updates=updates, warmup=max(1, updates // 10), seed=seed,
                       num_classes=num_classes),
        "--max-positions", 128, "--required-batch-size-multiple", 1, "--dropout", 0.1, "--attention-dropout", 0.1,
    ]


def task_of(system: str) -> str:
    """The task (and criterion) a system trains and is scored with."""
    return "sentence_prediction" if system == "full" else "budget_sentence_prediction"


def system_args(system: str, updates: int, quick: bool, fixed_heads: Optional[List[float]] = None,
                exploration_share: float = EXPLORATION_SHARE) -> list:
    """The model options of one of the study's SYSTEMS, all of one size
    (``budgetformer_small``, ``budgetformer_tiny`` with ``quick``)."""
    size = "budgetformer_tiny" if quick else "budgetformer_small"
    task = ["--task", task_of(system), "--criterion", task_of(system)]
    if system == "full":  # fairseq's own roberta, at the same size
        return ["--arch", "roberta", *size_flags(size), *task]
    # explicit: the model's default is no exploration
    exploration = 0 if system == "no_explore" else int(exploration_share * updates)
    args = ["--arch", size, *task, "--exploration-updates", str(exploration)]
    if system in ("static", "random"):
        args += ["--head-selection", system, "--fixed-heads", ",".join(f"{h:.2f}" for h in fixed_heads)]
    return args


def num_classes(data: Path) -> int:
    return sum(1 for line in (data / "label" / "dict.txt").read_text().splitlines() if line.strip())


def heads_per_layer(metrics: dict) -> List[float]:
    """The ``heads_l0``, ``heads_l1``, ... of a validation's metrics, in layer order."""
    layers = sum(1 for key in metrics if re.fullmatch(r"heads_l\d+", key))
    return [metrics[f"heads_l{i}"] for i in range(layers)]


def cached_record(path: Path, **expected) -> Optional[dict]:
    """The record of a finished run, if it was made with the ``expected`` settings
    (a missing key counts as None). Records are written last and atomically, so a
    half-done run has none and is redone."""
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    return record if all(record.get(key) == value for key, value in expected.items()) else None


def fairseq_train(run: Run, cfg, model_args: Sequence) -> Tuple[str, float]:
    """Train ``run`` into its folder with the study's recipe, ``cfg``'s updates,
    learning rate and threads; its log is kept in ``train.log``. Returns the log and
    the wall-clock seconds."""
    run_dir = run.dir(cfg.save_dir)
    data = cfg.data_dir / f"{run.dataset}-bin"
    updates = cfg.updates[run.dataset]
    cmd = [*train_command(data, run_dir, lr=cfg.lr, updates=updates, seed=run.seed, num_classes=num_classes(data)),
           *model_args]
    start = time.time()
    output = run_command(cmd, log_path=run_dir / "train.log", threads=cfg.threads_per_job)
    return output, round(time.time() - start, 1)


def mean_std(values: Sequence[float], ndigits: Optional[int] = None) -> Tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    mean, std = statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)
    return (mean, std) if ndigits is None else (round(mean, ndigits), round(std, ndigits))


# ----------------------------------------------------------------- command line


def parse_updates(items: Optional[Sequence[str]], defaults: Optional[dict] = None) -> dict:
    """``NAME=N`` items over the ``defaults`` (this study's UPDATES unless given)."""
    updates = dict(UPDATES if defaults is None else defaults)
    for item in items or []:
        name, _, value = item.partition("=")
        if not value.isdigit() or int(value) < 1:
            raise SystemExit(f"error: --updates expects NAME=N with N >= 1, got {item!r}")
        updates[name] = int(value)
    return updates


def add_study_arguments(parser: argparse.ArgumentParser, repo: Path, *, datasets: List[str], save_dir: str):
    """The options reproduce.py and sweep.py share (``--seeds`` is each one's own)."""
    parser.add_argument("--datasets", nargs="+", default=datasets, help="data sets under --data-dir (NAME-bin)")
    parser.add_argument("--updates", nargs="*", metavar="NAME=N", help=f"updates per data set (default {UPDATES})")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--jobs", type=int, default=2, help="trainings at a time (each on cores / jobs threads)")
    parser.add_argument("--data-dir", type=Path, default=repo / "data")
    parser.add_argument("--out-dir", type=Path, default=repo / "results")
    parser.add_argument("--save-dir", type=Path, default=repo / "checkpoints" / save_dir)


def check_study_arguments(parser: argparse.ArgumentParser, cfg: argparse.Namespace) -> argparse.Namespace:
    """Updates per data set (``--quick``: QUICK_UPDATES), the threads of each job,
    and absolute paths (the trainings run elsewhere)."""
    cfg.updates = parse_updates(cfg.updates)
    if cfg.quick:
        cfg.updates = {d: QUICK_UPDATES for d in cfg.datasets}
    missing = [d for d in cfg.datasets if d not in cfg.updates]
    if missing:
        parser.error(f"--updates has no number of updates for {', '.join(missing)} (give NAME=N)")
    if cfg.jobs < 1:
        parser.error("--jobs must be >= 1")
    cfg.threads_per_job = max(1, (os.cpu_count() or 1) // cfg.jobs)
    for name, value in vars(cfg).items():
        if isinstance(value, Path):
            setattr(cfg, name, value.resolve())
    return cfg
