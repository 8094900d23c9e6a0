#!/usr/bin/env python3
"""bfloat16 training against fp32, over seeds (issue 51, point 1;
budget_research/precision_study.py says what is run):

    python examples/budgetformer/precision_study.py --datasets MR TREC --seeds 1 2 3

Trains into ROOT/DATASET-seedN/ what is not trained yet, scores each finished run once
(RECORDS/DATASET-seedN.json), then writes RECORDS/summary.md against the seeds study's
fp32 records. Stop it any time: it resumes."""

import argparse
import json
import logging
import sys
from pathlib import Path

logging.basicConfig(level=logging.WARNING)  # before fairseq sets up logging at INFO

from budget_plugin.tools.errors import run_cli  # noqa: E402
from budget_plugin.tools.files import write_atomic  # noqa: E402
from budget_plugin.tools.progress import log  # noqa: E402
from budget_research.precision_study import fp32_dev, report, study_seed  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["MR", "TREC"], choices=["MR", "TREC", "BBC"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--model", type=Path, default=Path("data/minilm/model"), help="(default: %(default)s)")
    parser.add_argument("--cache", type=Path, default=Path("data/cache"), help="(default: %(default)s)")
    parser.add_argument("--root", type=Path, default=Path("checkpoints/precision"), help="(default: %(default)s)")
    parser.add_argument("--records", type=Path, default=REPO / "results" / "width" / "precision",
                        help="(default: %(default)s)")
    parser.add_argument("--fp32-records", type=Path, default=REPO / "results" / "width" / "seeds",
                        help="the seeds study's records (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--report-only", action="store_true", help="train nothing")
    args = parser.parse_args(argv)

    def body():
        pairs = {}
        for dataset in args.datasets:
            for seed in args.seeds:
                found = (study_seed(args.model, dataset, seed, args.root, args.records, args.cache, args.threads, log)
                         if not args.report_only else None)
                record = args.records / f"{dataset}-seed{seed}.json"
                if found is None and record.is_file():
                    found = json.loads(record.read_text())
                if found is not None:
                    fp32 = json.loads((args.fp32_records / f"{dataset}-seed{seed}.json").read_text())
                    pairs.setdefault(dataset, []).append({"seed": seed, "bf16": found["dev"], "fp32": fp32_dev(fp32)})
        text = report(pairs)
        write_atomic(args.records / "summary.md", text)
        print(text)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
