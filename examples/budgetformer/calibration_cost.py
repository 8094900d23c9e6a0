#!/usr/bin/env python3
"""The head dial's calibration before and after issue 51, side by side on one nested
checkpoint (budget_research/calibration_cost.py):

    python examples/budgetformer/calibration_cost.py checkpoints/demo --dataset MR

SAVE_DIR is a budget-finetune run (nested/checkpoint_best.pt, and its data folder as
recorded in recipe.json). Writes OUT_DIR/calibration-cost-DATASET.{md,json}. Run it on a
quiet machine: its figures are times taken in turn."""

import argparse
import json
import logging
import sys
from pathlib import Path

logging.basicConfig(level=logging.WARNING)  # before fairseq sets up logging at INFO

from budget_plugin.tools.errors import DataError, run_cli  # noqa: E402
from budget_plugin.tools.files import write_atomic, write_json  # noqa: E402
from budget_research.calibration_cost import BEFORE, compared, report  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("save_dir", type=Path, help="budget-finetune's SAVE_DIR")
    parser.add_argument("--dataset", required=True, help="its data set's name, for the record's file name")
    parser.add_argument("--examples", type=int, default=512, help="(the recipe's: %(default)s)")
    parser.add_argument("--out-dir", type=Path, default=REPO / "results" / "width", help="(default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--again", action="store_true", help="run the bisection again too (default: its recorded run)")
    args = parser.parse_args(argv)

    def body():
        recipe_file = args.save_dir / "recipe.json"
        if not recipe_file.is_file():
            raise DataError(f"{recipe_file}: not found (a budget-finetune SAVE_DIR records its steps there)")
        command = json.loads(recipe_file.read_text())["nested"]
        data = Path(command[command.index("fairseq-train") + 1] if "fairseq-train" in command else command[1])
        stem = args.out_dir / f"calibration-cost-{args.dataset}"
        record = stem.with_suffix(".json")
        kept = json.loads(record.read_text()) if record.is_file() and not args.again else None
        if kept:  # the bisection's figures, kept: its code no longer changes
            kept["calibrations"] = {BEFORE: kept["calibrations"][BEFORE]}
        found = compared(args.save_dir / "nested" / "checkpoint_best.pt", data, args.examples, args.threads,
                         kept=kept)
        write_json(stem.with_suffix(".json"), found)
        text = report(found, f"The head dial's calibration, {args.dataset}")
        write_atomic(stem.with_suffix(".md"), text)
        print(text)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
