#!/usr/bin/env python3
"""How many updates the recipe spends, chosen on dev (issue 51, point 3;
budget_research/schedule_study.py says what is run):

    python examples/budgetformer/schedule_study.py --datasets MR2k --seeds 1

Trains into ROOT/DATASET-seedN/ what is not trained yet, scores each finished run once
(RECORDS/DATASET-seedN.json), then writes RECORDS/summary.md. Stop it any time: it resumes."""

import argparse
import json
import logging
import sys
from pathlib import Path

logging.basicConfig(level=logging.WARNING)  # before fairseq sets up logging at INFO

from budget_plugin.tools.errors import run_cli  # noqa: E402
from budget_plugin.tools.files import write_atomic  # noqa: E402
from budget_plugin.tools.progress import log  # noqa: E402
from budget_research.schedule_study import AUGMENTED, SCHEDULES, SMALL, report, study_seed  # noqa: E402
from budget_research.seeds_study import DATASETS  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["MR2k"], choices=[*SMALL, *DATASETS])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1])
    parser.add_argument("--runs", nargs="+", default=[*SCHEDULES, AUGMENTED], choices=[*SCHEDULES, AUGMENTED],
                        help="(default: all)")
    parser.add_argument("--model", type=Path, default=Path("data/minilm/model"), help="(default: %(default)s)")
    parser.add_argument("--cache", type=Path, default=Path("data/cache"), help="(default: %(default)s)")
    parser.add_argument("--root", type=Path, default=Path("checkpoints/schedule"), help="(default: %(default)s)")
    parser.add_argument("--records", type=Path, default=REPO / "results" / "width" / "schedule",
                        help="(default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--report-only", action="store_true", help="train nothing")
    args = parser.parse_args(argv)

    def body():
        for dataset in args.datasets:
            for seed in args.seeds:
                if not args.report_only:
                    study_seed(args.model, dataset, seed, args.root, args.records, args.cache, args.runs,
                               args.threads, log)
        records = [json.loads(p.read_text()) for p in sorted(args.records.glob("*-seed*.json"))]
        write_atomic(args.records / "summary.md", report(records))
        log(f"wrote {args.records / 'summary.md'}")

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
