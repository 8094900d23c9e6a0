"""A small data set cut from a large one (issue 51, point 3): the first N training rows of
a seeded shuffle of its training split, with the same dev and test splits, binarized with
the same vocabulary as the full set. MR cut to 2,000 training sentences is what a user
with a few thousand labelled texts brings."""

import random
import shutil
from pathlib import Path
from typing import Callable

from budget_plugin.data.prepare import prepare_task
from budget_plugin.tools.errors import DataError
from budget_plugin.tools.files import building_dir


def cut_training(raw: Path, out_dir: Path, name: str, examples: int, seed: int, model_dir: Path,
                 log: Callable[[str], None] = print) -> Path:
    """``raw``'s data set (train/dev/test.tsv) with ``examples`` training rows, written to
    ``out_dir``/raw/NAME and binarized into ``out_dir``/NAME-bin; returns the binarized folder
    (made once: a second call finds it)."""
    data = out_dir / f"{name}-bin"
    if (data / "label" / "test.idx").is_file():
        return data
    header, *rows = (raw / "train.tsv").read_text(encoding="utf-8").splitlines()
    if examples > len(rows):
        raise DataError(f"{raw / 'train.tsv'}: {len(rows)} training rows, fewer than the {examples} asked for")
    random.Random(seed).shuffle(rows)
    dest = out_dir / "raw" / name
    with building_dir(dest) as tmp:
        (tmp / "train.tsv").write_text("\n".join([header, *rows[:examples]]) + "\n", encoding="utf-8")
        for split in ("dev.tsv", "test.tsv"):
            shutil.copyfile(raw / split, tmp / split)
        (tmp / "README").write_text(f"{raw.name} with {examples} of its {len(rows)} training rows (the first of a "
                                    f"shuffle seeded {seed}); dev and test as in {raw}.\n", encoding="utf-8")
    summary = prepare_task(dest, out_dir, layout="SST-2", name=name, labelled_test=True, wordpiece=model_dir,
                           log=lambda message: log(f"    [prepare] {message}"))
    log(summary.format())
    return data
