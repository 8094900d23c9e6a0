#!/usr/bin/env python3
"""Requests and texts per second that budget_serve's Predictor serves, for the dense
model and every width of the dial, fp32 and int8 (budget_research/serving_throughput.py
says what is measured and how):

    python examples/budgetformer/serving_throughput.py checkpoints/demo data/minilm/MR-bin --dataset MR \
        --texts data/minilm/MR/test.tsv

Writes OUT_DIR/throughput-DATASET-seedN.{json,md}."""

import argparse
import logging
import sys
from pathlib import Path

logging.basicConfig(level=logging.WARNING)  # before fairseq sets up logging at INFO

from budget_plugin.tools.errors import DataError, run_cli  # noqa: E402
from budget_plugin.tools.files import write_atomic, write_json  # noqa: E402
from budget_plugin.tools.progress import log  # noqa: E402
from budget_research.recipe_study import add_arguments, recipe_checkpoints  # noqa: E402
from budget_research.serving_throughput import predictors_of, report, throughput  # noqa: E402
from budget_research.width_study import DIAL_WIDTHS  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def test_sentences(path: Path) -> list:
    """The first column of a TSV with a header (budget-prepare's raw layout)."""
    if not path.is_file():
        raise DataError(f"--texts {path}: not found")
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0] for line in lines if line.strip()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, REPO / "results" / "serving")
    parser.add_argument("--texts", type=Path, required=True, help="the raw test split (TSV, text first)")
    parser.add_argument("--singles", type=int, default=200, help="texts sent one at a time (default: %(default)s)")
    parser.add_argument("--widths", nargs="+", default=list(DIAL_WIDTHS), help="(default: every width of the dial)")
    args = parser.parse_args(argv)

    def body():
        recipe_checkpoints(args.save_dir)
        texts = test_sentences(args.texts)
        predictors = predictors_of(args.save_dir, args.data, args.widths, args.threads, log)
        study = {"dataset": args.dataset, "seed": args.seed, "threads": args.threads, "rounds": args.repeats,
                 "singles": min(args.singles, len(texts)), "batch_texts": len(texts),
                 "throughput": throughput(predictors, texts[:args.singles], texts, args.repeats, log)}
        stem = args.out_dir / f"throughput-{args.dataset}-seed{args.seed}"
        write_json(stem.with_suffix(".json"), study)
        write_atomic(stem.with_suffix(".md"), report(study))
        print(report(study))

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
