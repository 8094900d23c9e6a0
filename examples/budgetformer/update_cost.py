#!/usr/bin/env python3
"""What an update of the recipe's dense step, its nested step and each named candidate
nested step costs, side by side on the same real batches (budget_research/update_cost.py):

    python examples/budgetformer/update_cost.py checkpoints/demo --dataset MR \
        --candidates "narrow sandwich, no router pass"

SAVE_DIR is a budget-finetune run (its recipe.json and reordered.pt). Writes
OUT_DIR/update-cost-DATASET.{md,json}. Run it on a quiet machine: its figures are
ratios of times taken in turn."""

import argparse
import json
import logging
import sys
from pathlib import Path

logging.basicConfig(level=logging.WARNING)  # before fairseq sets up logging at INFO

from budget_plugin.tools.errors import DataError, run_cli  # noqa: E402
from budget_plugin.tools.files import write_atomic, write_json  # noqa: E402
from budget_research.recipe_candidates import CANDIDATES, TEACHER, candidate_command  # noqa: E402
from budget_research.update_cost import report, update_costs  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FP32 = ["--cpu-precision", "fp32"]  # fairseq's parser keeps an option's last value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("save_dir", type=Path, help="budget-finetune's SAVE_DIR (recipe.json, reordered.pt)")
    parser.add_argument("--dataset", required=True, help="its data set's name, for the record's file name")
    parser.add_argument("--candidates", nargs="*", default=[], metavar="NAME",
                        choices=[name for name, options in CANDIDATES.items() if TEACHER not in options],
                        help="candidates (recipe_candidates.py's) timed beside the dense and nested steps")
    parser.add_argument("--fp32", action="store_true",
                        help="also time the dense and nested steps in fp32 (first: the ratios are of its dense step)")
    parser.add_argument("--rounds", type=int, default=6, help="timed rounds (default: %(default)s)")
    parser.add_argument("--out-dir", type=Path, default=REPO / "results" / "width", help="(default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    def body():
        recipe_file = args.save_dir / "recipe.json"
        if not recipe_file.is_file():
            raise DataError(f"{recipe_file}: not found (a budget-finetune SAVE_DIR records its steps there)")
        recipe = json.loads(recipe_file.read_text())
        commands = {"dense step": recipe["dense"], "nested step (the recipe)": recipe["nested"]}
        options = {"dense step": "fairseq's roberta, sentence_prediction", "nested step (the recipe)": "as recorded"}
        if args.fp32:  # first: what the ratios are of
            commands = {"dense step, fp32": recipe["dense"] + FP32, "nested step, fp32": recipe["nested"] + FP32,
                        **commands}
            options = {"dense step, fp32": "the dense step with `" + " ".join(FP32) + "`",
                       "nested step, fp32": "the nested step with `" + " ".join(FP32) + "`", **options}
        for name in args.candidates:
            commands[name] = candidate_command(recipe, args.save_dir, name, None)
            options[name] = "the nested step with `" + " ".join(CANDIDATES[name]) + "`"
        rows = update_costs(commands, args.rounds, args.threads)
        stem = args.out_dir / f"update-cost-{args.dataset}"
        text = report(rows, f"The cost of an update, {args.dataset}", options)
        write_json(stem.with_suffix(".json"), {"rows": rows, "options": options})
        write_atomic(stem.with_suffix(".md"), text)
        print(text)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
