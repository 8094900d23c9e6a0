"""The command-line options both studies share (examples/budgetformer/reproduce.py and
examples/budgetformer/latency_study.py) and the StudyConfig they make."""

import argparse
import time
from pathlib import Path
from typing import Optional, Tuple

from budget_research.study.plan import UPDATES, Latency, StudyConfig, parse_updates


def add_study_options(parser: argparse.ArgumentParser, repo: Path, latency: Latency) -> None:
    parser.add_argument("--datasets", nargs="+", default=list(StudyConfig.datasets),
                        help="data sets (DATA_DIR/NAME-bin)")
    parser.add_argument("--seeds", nargs="+", type=int, default=list(StudyConfig.seeds))
    parser.add_argument("--updates", nargs="*", metavar="NAME=N", help=f"updates per data set (default {UPDATES})")
    parser.add_argument("--data-dir", type=Path, default=repo / "data" / "minilm",
                        help="binarized data sets, prepared with the model's WordPiece vocabulary when missing")
    parser.add_argument("--model-dir", type=Path, help="the converted encoder (default: DATA_DIR/model, "
                        "all-MiniLM-L6-v2 converted there when missing)")
    parser.add_argument("--out-dir", type=Path, default=repo / "results",
                        help="the report; the run records in OUT_DIR/reproduce")
    parser.add_argument("--save-dir", type=Path, default=repo / "checkpoints" / "reproduce")
    parser.add_argument("--stop-after", type=float, metavar="MINUTES", help="start no training after this many minutes")
    parser.add_argument("--report-only", action="store_true", help="train nothing: the report from the records")
    parser.add_argument("--latency-repeats", type=int, default=latency.repeats)
    parser.add_argument("--latency-batches", type=int, default=latency.batches,
                        help="batches of 32 timed (the first N of test)")
    parser.add_argument("--latency-examples", type=int, default=latency.examples,
                        help="single examples timed (the first N of test)")


def study_config(parser: argparse.ArgumentParser, args: argparse.Namespace,
                 **fields) -> Tuple[StudyConfig, bool, Optional[float]]:
    """The config from the shared options (and ``fields``), whether only to report, and
    the deadline (a time.time(), or None); a bad option ends in parser.error."""
    updates = parse_updates(args.updates, UPDATES)
    missing = [d for d in args.datasets if d not in updates]
    if missing:
        parser.error(f"--updates has no number of updates for {', '.join(missing)} (give NAME=N)")
    for name in ("latency_repeats", "latency_batches", "latency_examples"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    cfg = StudyConfig(
        data_dir=args.data_dir.resolve(), model_dir=(args.model_dir or args.data_dir / "model").resolve(),
        out_dir=args.out_dir.resolve(), save_dir=args.save_dir.resolve(), datasets=tuple(args.datasets),
        seeds=tuple(args.seeds), updates=updates,
        latency=Latency(args.latency_repeats, args.latency_batches, args.latency_examples), **fields)
    deadline = None if args.stop_after is None else time.time() + 60 * args.stop_after
    return cfg, args.report_only, deadline
