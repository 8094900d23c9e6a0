#!/usr/bin/env python3
"""Does the head dial still learn when the router's pass runs on some updates only
(issue 51, point 2)? Each named nested checkpoint (the recipe's, recipe_candidates.py's)
calibrated on the recipe's 512 dev examples as budget-finetune calibrates it, then
scored on dev at the ratios budget-finetune reports, with the head ratio each runs:

    python examples/budgetformer/head_dial_study.py checkpoints/precision/MR-seed1 data/minilm/MR-bin \\
        --dataset MR --candidates "router every 4th update"

Writes OUT_DIR/head-dial-DATASET.{md,json}; dev only."""

import argparse
import json
import logging
import sys
from pathlib import Path

logging.basicConfig(level=logging.WARNING)  # before fairseq sets up logging at INFO

from budget_plugin.dial.calibration import calibrate, spread  # noqa: E402
from budget_plugin.tools.checkpoints import load_checkpoint  # noqa: E402
from budget_plugin.tools.errors import run_cli  # noqa: E402
from budget_plugin.tools.evaluation import accuracy_and_ratio, split_batches  # noqa: E402
from budget_plugin.tools.files import write_atomic, write_json  # noqa: E402
from budget_plugin.tools.progress import log  # noqa: E402
from budget_research.recipe_candidates import slug  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RATIOS = ("1", "0.75", "0.5", "0.3", "0.2")  # budget-finetune's report


def scored(checkpoint: Path, data: Path) -> dict:
    model, task = load_checkpoint(checkpoint, data)
    dev = split_batches(task, 64, "valid")
    lines = []
    model.store_dial(calibrate(model, spread(dev, 512), log=lines.append))
    found = {"calibration": lines}
    for ratio in RATIOS:
        with model.dialled(ratio):
            accuracy, ran = accuracy_and_ratio(model, dev)
        found[ratio] = {"accuracy": accuracy, "head_ratio": ran}
        log(f"{checkpoint}: --head-ratio {ratio}: {accuracy:.2f} (runs {ran:.3f})")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("save_dir", type=Path, help="budget-finetune's SAVE_DIR")
    parser.add_argument("data", type=Path)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--candidates", nargs="*", default=[], help="recipe_candidates.py's names")
    parser.add_argument("--out-dir", type=Path, default=REPO / "results" / "width" / "precision")
    args = parser.parse_args(argv)

    def body():
        checkpoints = {"recipe": args.save_dir / "nested" / "checkpoint_best.pt"}
        checkpoints.update({n: args.save_dir / "candidates" / slug(n) / "checkpoint_best.pt" for n in args.candidates})
        found = {name: scored(path, args.data) for name, path in checkpoints.items()}
        stem = args.out_dir / f"head-dial-{args.dataset}"
        write_json(stem.with_suffix(".json"), found)
        lines = [f"# The head dial on dev, {args.dataset}", "", "Each checkpoint calibrated on 512 dev examples, "
                 "then scored on all of dev: accuracy (the mean head ratio it ran).", "",
                 "| --head-ratio | " + " | ".join(found) + " |", "|---|" + "---|" * len(found)]
        for ratio in RATIOS:
            lines.append(f"| {ratio} | " + " | ".join(f"{f[ratio]['accuracy']:.2f} ({f[ratio]['head_ratio']:.3f})"
                                                      for f in found.values()) + " |")
        write_atomic(stem.with_suffix(".md"), "\n".join(lines) + "\n")
        print("\n".join(lines))

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
