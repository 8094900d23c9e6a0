#!/usr/bin/env python3
"""The latency study: for a given CPU latency, which fine-tuned model is most accurate,
and does a per-input head budget beat the same model with a fixed one?

Per data set (MR, TREC-6, BBC News at 128 pieces) and seed (1-3), all from the converted
all-MiniLM-L6-v2 with the accuracy study's recipe and update budget (scripts/reproduce.py,
whose records are reused, never retrained):

  dense          fairseq's own roberta (the accuracy study's record)
  importance     importance pruning at head ratios 0.5 and 0.3 (records) and 0.2 (new)
  adaprune       fairseq's own magnitude head pruning (--mha-heads-to-keep 4) of the
                 fine-tuned dense model, fine-tuned again as fairseq's AdaPrune describes
  layers4        the first 4 of 6 layers (--encoder-layers-to-keep 0,1,2,3)
  nested         one model by scripts/finetune.py's recipe, dialled to 1, 0.75, 0.5, 0.3
                 and 0.2 with per-input budgets, and at the same per-layer counts fixed
                 (no router), and exported physically pruned at 0.3 and 0.2

then every system's heads, FLOPs and CPU latency at batch 1 and 32 on the real test
inputs, side by side in one process; then results/latency.{md,json} and one plot per data
set (results/latency_DATASET.png) with the targets and a paragraph generated from the
numbers. Each finished step is recorded in results/reproduce/DATASET/ and never redone:
run the script again to go on.

The steps are budget_plugin/tools/study/: nested.py, latency.py and latency_report.py.

    python scripts/latency_study.py                     # ~4 h here
    python scripts/latency_study.py --stop-after 100    # start no group after 100 minutes
    python scripts/latency_study.py --report-only
"""

import argparse
import logging
import time
from pathlib import Path

logging.basicConfig(level=logging.WARNING)  # before fairseq sets up INFO logging

from budget_plugin.tools.study import latency, latency_report  # noqa: E402
from budget_plugin.tools.study.plan import UPDATES, Latency, StudyConfig, parse_updates  # noqa: E402
from budget_plugin.tools.study.prepare import prepare  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["MR", "TREC", "BBC"], help="data sets (DATA_DIR/NAME-bin)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--updates", nargs="*", metavar="NAME=N",
                        help=f"updates per data set (default: the accuracy study's, {UPDATES}; other numbers "
                        "retrain everything, the accuracy study's records included)")
    parser.add_argument("--data-dir", type=Path, default=REPO / "data" / "minilm",
                        help="binarized data sets, prepared with the model's WordPiece vocabulary when missing")
    parser.add_argument("--model-dir", type=Path, help="the converted encoder (default: DATA_DIR/model, "
                        "all-MiniLM-L6-v2 converted there when missing)")
    parser.add_argument("--out-dir", type=Path, default=REPO / "results",
                        help="the report; the records in OUT_DIR/reproduce")
    parser.add_argument("--save-dir", type=Path, default=REPO / "checkpoints" / "reproduce")
    parser.add_argument("--stop-after", type=float, metavar="MINUTES",
                        help="start no data set and seed after this many minutes")
    parser.add_argument("--report-only", action="store_true", help="train and time nothing: the report from the records")
    parser.add_argument("--latency-repeats", type=int, default=latency.TIMING.repeats)
    parser.add_argument("--latency-batches", type=int, default=latency.TIMING.batches,
                        help="batches of 32 timed (the first N of test)")
    parser.add_argument("--latency-examples", type=int, default=latency.TIMING.examples,
                        help="single examples timed (the first N of test)")
    args = parser.parse_args(argv)
    for name in ("latency_repeats", "latency_batches", "latency_examples"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    updates = parse_updates(args.updates, UPDATES)
    missing = [d for d in args.datasets if d not in updates]
    if missing:
        parser.error(f"--updates has no number of updates for {', '.join(missing)} (give NAME=N)")
    cfg = StudyConfig(data_dir=args.data_dir.resolve(), model_dir=(args.model_dir or args.data_dir / "model").resolve(),
                      out_dir=args.out_dir.resolve(), save_dir=args.save_dir.resolve(), datasets=tuple(args.datasets),
                      seeds=tuple(args.seeds), updates=updates, jobs=1,
                      latency=Latency(args.latency_repeats, args.latency_batches, args.latency_examples))
    deadline = None if args.stop_after is None else time.time() + 60 * args.stop_after
    return cfg, args.report_only, deadline


def main(argv=None):
    cfg, report_only, deadline = parse_args(argv)
    cfg = prepare(cfg)
    if not report_only:
        latency.run_all(cfg, deadline)
    latency_report.write_report(cfg)


if __name__ == "__main__":
    main()
