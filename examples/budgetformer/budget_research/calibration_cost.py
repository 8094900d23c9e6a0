"""What the head dial's calibration costs, and how well its table dials (issue 51: "the
head dial's calibration in a fraction of today's time"): the product's calibration
(modelled proposals, dial/calibration.py) and the bisection it replaced
(bisection_calibration.py), each run on the same checkpoint and examples (the recipe's:
about 512 dev examples spread over their lengths), timed, and their tables each dialled
at the calibrated ratios and between them on the whole split."""

import copy
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

from budget_plugin.dial.calibration import calibrate, mean_ratio, spread
from budget_plugin.tools.checkpoints import load_checkpoint
from budget_plugin.tools.evaluation import split_batches
from budget_research.bisection_calibration import bisection_calibrate

CALIBRATIONS: Dict[str, Callable] = {"bisection (before)": bisection_calibrate, "modelled (now)": calibrate}
BEFORE = "bisection (before)"
BETWEEN = (0.35, 0.45, 0.55, 0.675, 0.825)  # ratios between the table's rows: its interpolation


def compared(checkpoint: Path, data: Path, examples: int = 512, threads: int = 2,
             log: Callable[[str], None] = print, kept: Optional[dict] = None) -> dict:
    """Each calibration run, timed and dialled, but those in ``kept`` (an earlier record
    of the same checkpoint and examples: the bisection, which no longer changes, is not
    run twice)."""
    torch.set_num_threads(threads)
    model, task = load_checkpoint(checkpoint, data)
    split = split_batches(task, 64, "valid")
    batches = spread(split, examples)
    found = {"examples": sum(s["nsentences"] for s in batches), "split_examples": sum(s["nsentences"] for s in split),
             "calibrations": {}}
    for name, calibration in CALIBRATIONS.items():
        if kept and name in kept["calibrations"] and kept["examples"] == found["examples"]:
            found["calibrations"][name] = kept["calibrations"][name]
            continue
        lines: List[str] = []
        start = time.perf_counter()
        table = calibration(model, batches, log=lines.append)
        seconds = time.perf_counter() - start
        log(f"{name}: {seconds:.1f} s, {lines[-1]}")
        dialled = copy.deepcopy(model)
        dialled.store_dial(table)
        aims = [round(r, 4) for r in table[:, 0].tolist()] + list(BETWEEN)
        achieved = {}
        for aim in sorted(set(aims)):
            with dialled.dialled(str(aim)):
                achieved[str(aim)] = {"split": mean_ratio(dialled, split)}
        found["calibrations"][name] = {"seconds": seconds, "runs": int(lines[-1].split()[0]),
                                       "table": table.tolist(), "achieved": achieved}
    return found


def report(found: dict, title: str) -> str:
    names = list(found["calibrations"])
    first = found["calibrations"][names[0]]
    lines = [f"# {title}", "", f"Each calibration on the same {found['examples']} dev examples (of "
             f"{found['split_examples']}) of the same checkpoint on 2 threads, on a quiet machine (the bisection "
             "once: its run is kept in the record, its code no longer changes); each table then "
             "dialled at its calibrated ratios and between them on the whole dev split (the mean head ratio it "
             "runs, against the ratio asked for).",
             "", "| calibration | seconds | vs " + names[0] + " | runs over the examples | worst miss on dev |",
             "|---|---|---|---|---|"]
    for name in names:
        c = found["calibrations"][name]
        miss = max(abs(v["split"] - float(aim)) for aim, v in c["achieved"].items())
        lines.append(f"| {name} | {c['seconds']:.1f} | {c['seconds'] / first['seconds']:.2f}x | {c['runs']} | "
                     f"{miss:.4f} |")
    aims = sorted({a for n in names for a in found["calibrations"][n]["achieved"]}, key=float)
    lines += ["", "The mean head ratio each table's dial gives on dev:", "",
              "| --head-ratio | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for aim in aims:
        cells = []
        for n in names:
            v = found["calibrations"][n]["achieved"].get(aim)
            cells.append("" if v is None else f"{v['split']:.4f}")
        lines.append(f"| {aim} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
