#!/usr/bin/env python3
"""The width dial against dense and the latency study's baselines, on one data set and
seed (budget_research/width_study.py says what is measured and how):

    budget-finetune data/minilm/model data/minilm/MR-bin checkpoints/width-MR --max-updates 240 --cpu
    python examples/budgetformer/width_study.py checkpoints/width-MR data/minilm/MR-bin --dataset MR

Writes OUT_DIR/DATASET-seedN.{json,md,png}: every system's accuracy, FLOPs and latency,
the cascades, the issue's targets held or missed, and the frontier figure."""

import argparse
import logging
import sys
from pathlib import Path

logging.basicConfig(level=logging.WARNING)  # before fairseq sets up logging at INFO

from budget_plugin.tools.errors import run_cli  # noqa: E402
from budget_plugin.tools.progress import log  # noqa: E402
from budget_research.recipe_study import add_arguments, recipe_checkpoints, write_study  # noqa: E402
from budget_research.width_study import figure, report, targets, width_study  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, REPO / "results" / "width")
    parser.add_argument("--records", type=Path, default=REPO / "results" / "reproduce",
                        help="the latency study's records (default: %(default)s)")
    args = parser.parse_args(argv)

    def body():
        recipe_checkpoints(args.save_dir)
        study = width_study(args.save_dir, args.data, args.dataset, args.seed, args.records, args.threads,
                            repeats=args.repeats, log=log)
        study["targets"] = targets(study)
        print(write_study(study, args.out_dir / f"{args.dataset}-seed{args.seed}", report, figure))

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
