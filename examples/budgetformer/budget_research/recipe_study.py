"""What the studies of one budget-finetune run share (width_study.py, serving_study.py):
the run's two checkpoints, and their outputs, a record, a report and a figure under one
stem."""

import argparse
from pathlib import Path
from typing import Callable, List, Optional

from budget_plugin.tools.errors import DataError
from budget_plugin.tools.files import write_atomic, write_json


def add_arguments(parser: argparse.ArgumentParser, out_dir: Path) -> None:
    """The run, its data set and the timing, as every such study takes them."""
    parser.add_argument("save_dir", type=Path, help="budget-finetune's SAVE_DIR (dense/, nested/)")
    parser.add_argument("data", type=Path, help="the binarized data set it was trained on")
    parser.add_argument("--dataset", required=True, help="its name (MR, TREC, BBC: the latency study's records)")
    parser.add_argument("--seed", type=int, default=1, help="the seed it was trained with (default: %(default)s)")
    parser.add_argument("--out-dir", type=Path, default=out_dir, help="(default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds (default: %(default)s)")


def replaced(command: List[str], values: dict) -> List[str]:
    """A recorded fairseq command with each option's value replaced (every option named
    must be there): another save dir, another start."""
    out = list(command)
    for flag, value in values.items():
        out[out.index(flag) + 1] = str(value)
    return out


def recipe_checkpoints(save_dir: Path) -> None:
    """Refuse a SAVE_DIR without both of the recipe's checkpoints, naming the missing one."""
    for path in (save_dir / "dense" / "checkpoint_best.pt", save_dir / "nested" / "checkpoint_best.pt"):
        if not path.is_file():
            raise DataError(f"{path}: not found (run budget-finetune into {save_dir} first)")


def write_study(study: dict, stem: Path, report: Callable[[dict], str],
                figure: Callable[[dict, Path], Optional[Path]]) -> str:
    """``stem``.json (the study), .md (its report, returned) and .png (its figure)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    write_json(stem.with_suffix(".json"), study)
    text = report(study)
    write_atomic(stem.with_suffix(".md"), text)
    figure(study, stem.with_suffix(".png"))
    return text
