"""What the studies of one budget-finetune run share (width_study.py, serving_study.py):
the run's two checkpoints, and their outputs, a record, a report and a figure under one
stem."""

from pathlib import Path
from typing import Callable, Optional

from budget_plugin.tools.errors import DataError
from budget_plugin.tools.files import write_atomic, write_json


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
