#!/usr/bin/env python3
"""Which importance orders heads and FFN neurons better for the nested recipe: the mask
gradient or DynaBERT's |w . dL/dw| (budget_research/importance_study.py says how):

    python examples/budgetformer/importance_study.py checkpoints/width-MR data/minilm/MR-bin --dataset MR

Writes OUT_DIR/importance-DATASET.{json,md}."""

import argparse
import logging
import sys
from pathlib import Path

logging.basicConfig(level=logging.WARNING)  # before fairseq sets up logging at INFO

from budget_plugin.tools.errors import DataError, run_cli  # noqa: E402
from budget_plugin.tools.progress import log  # noqa: E402
from budget_research.importance_study import importance_study, save  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("save_dir", type=Path, help="budget-finetune's SAVE_DIR (its dense/ model is read)")
    parser.add_argument("data", type=Path, help="the binarized data set it was trained on")
    parser.add_argument("--dataset", required=True, help="its name, for the file names")
    parser.add_argument("--examples", type=int, default=2048, help="training examples (the recipe's: %(default)s)")
    parser.add_argument("--out-dir", type=Path, default=REPO / "results" / "width")
    args = parser.parse_args(argv)

    def body():
        if not (args.save_dir / "dense" / "checkpoint_best.pt").is_file():
            raise DataError(f"{args.save_dir}/dense/checkpoint_best.pt: not found (run budget-finetune first)")
        print(save(importance_study(args.save_dir, args.data, args.examples, log=log), args.dataset, args.out_dir))

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
