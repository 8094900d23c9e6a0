"""Binarize GLUE tasks (or any folder in a GLUE task's layout) for fairseq.

For each task this script

1. reads the train/dev/test TSV files with the column layout of fairseq's
   ``examples/roberta/preprocess_GLUE_tasks.sh`` and checks every row;
2. trains a sentencepiece model on the training text (or reuses ``--spm-model``);
3. encodes every split exactly as fairseq's ``--bpe sentencepiece`` does at
   inference time, and writes one fairseq dictionary taken from the
   sentencepiece vocabulary (shared by input0 and input1);
4. runs the real ``fairseq-preprocess`` for input0, input1 and the labels,

into ``OUT_DIR/<TASK>-bin/``, ready for::

    fairseq-train OUT_DIR/SST-2-bin --task sentence_prediction --init-token 0 \\
        --separator-token 2 --bpe sentencepiece \\
        --sentencepiece-model OUT_DIR/SST-2-bin/sentencepiece.bpe.model ...

Each folder is built under a hidden temporary name next to the target and only
renamed into place once complete, so an interrupted run never leaves a folder
that looks finished.

Your own labelled data: train.tsv, dev.tsv and test.tsv in a folder named after the GLUE
task whose layout they follow (``mydata/SST-2/``, each file ``sentence<TAB>label``), and
``--glue-dir mydata --labelled-test``: test.tsv is then read with dev.tsv's columns and
binarized with its labels, so ``fairseq-validate --valid-subset test`` scores it.

Other scripts prepare their own data sets in a GLUE layout with the same code::

    from budget_plugin.data.prepare import prepare_task
    prepare_task("data/raw/MR", "data", layout="SST-2", name="MR", labelled_test=True)
"""

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

# before fairseq (imported with the plugin) sets up logging at INFO and greets with
# noise: this script reports in its own lines
from budget_plugin.data.glue_layout import LAYOUTS
from budget_plugin.data.prepare import add_prepare_arguments, prepare_options, prepare_task
from budget_plugin.tools.errors import DataError, run_cli


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--glue-dir", type=Path, required=True, help="GLUE folder (CoLA/, SST-2/, ...)")
    parser.add_argument("--out-dir", type=Path, required=True, help="where <TASK>-bin/ folders are written")
    parser.add_argument("--tasks", nargs="+", choices=list(LAYOUTS), metavar="TASK",
                        help=f"tasks to prepare (default: all present; choices: {' '.join(LAYOUTS)})")
    parser.add_argument("--labelled-test", action="store_true",
                        help="test files are labelled, in the dev files' columns (your own held-out split, as "
                        "examples/budgetformer/get_data.py writes them): binarize their labels too, so that "
                        "fairseq-validate "
                        "--valid-subset test scores them")
    add_prepare_arguments(parser)
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)

    def body():
        if not args.glue_dir.is_dir():
            raise DataError(f"missing GLUE folder: {args.glue_dir}")
        tasks = args.tasks or [t for t in LAYOUTS if (args.glue_dir / t).is_dir()]
        if not tasks:
            raise DataError(f"no GLUE task folders in {args.glue_dir} (expected some of: {' '.join(LAYOUTS)})")
        for task in tasks:
            summary = prepare_task(args.glue_dir / task, args.out_dir, layout=task, name=task,
                                   labelled_test=args.labelled_test, **prepare_options(args))
            print(summary.format(), flush=True)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
