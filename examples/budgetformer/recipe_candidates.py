#!/usr/bin/env python3
"""The recipe's candidate nested steps, each trained from a budget-finetune run's
reordered model and scored on dev at every width (budget_research/recipe_candidates.py):

    python examples/budgetformer/recipe_candidates.py checkpoints/demo data/minilm/MR-bin --dataset MR

Resumable: a finished candidate is neither trained nor scored again. Writes
OUT_DIR/candidates-DATASET-seedN.{json,md}."""

import argparse
import logging
import sys
from pathlib import Path

logging.basicConfig(level=logging.WARNING)  # before fairseq sets up logging at INFO

from budget_plugin.tools.errors import DataError, run_cli  # noqa: E402
from budget_plugin.tools.files import write_atomic  # noqa: E402
from budget_plugin.tools.progress import log  # noqa: E402
from budget_research.recipe_candidates import CANDIDATES, report, run_candidates  # noqa: E402
from budget_research.recipe_study import recipe_checkpoints  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("save_dir", type=Path, help="budget-finetune's SAVE_DIR (dense/, reordered.pt, nested/)")
    parser.add_argument("data", type=Path, help="the binarized data set it was trained on")
    parser.add_argument("--dataset", required=True, help="its name, for the record's file name")
    parser.add_argument("--seed", type=int, default=1, help="the seed it was trained with (default: %(default)s)")
    parser.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES),
                        metavar="NAME", help=f"(default: all of {', '.join(CANDIDATES)})")
    parser.add_argument("--out-dir", type=Path, default=REPO / "results" / "width", help="(default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shared", action="store_true",
                        help="other work runs on the machine meanwhile: the record marks the training times so")
    args = parser.parse_args(argv)

    def body():
        recipe_checkpoints(args.save_dir)
        if not (args.save_dir / "reordered.pt").is_file():
            raise DataError(f"{args.save_dir / 'reordered.pt'}: not found (the recipe's reorder step)")
        stem = args.out_dir / f"candidates-{args.dataset}-seed{args.seed}"
        found = run_candidates(args.save_dir, args.data, args.candidates, stem.with_suffix(".json"), args.threads,
                               log, args.shared)
        text = report(found, f"The recipe's candidates, {args.dataset} (seed {args.seed})")
        write_atomic(stem.with_suffix(".md"), text)
        print(text)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
