#!/usr/bin/env python3
"""One nested fine-tuning against one model per width, over seeds (issue 42;
budget_research/seeds_study.py says what is run and measured):

    python examples/budgetformer/seeds_study.py --datasets TREC MR BBC --seeds 1 2 3

Prepares the encoder and the data sets when missing (MR and TREC under data/minilm/,
BBC News cut at 254 pieces under data/bbc256/), trains into ROOT/DATASET-seedN/ what is
not trained yet, measures each finished data set
and seed once (RECORDS/DATASET-seedN.json), then writes RECORDS/summary.{md,json} and
RECORDS/DATASET.png from every record there. Stop it any time: it resumes."""

import argparse
import json
import logging
import sys
from pathlib import Path

logging.basicConfig(level=logging.WARNING)  # before fairseq sets up logging at INFO

from budget_plugin.tools.errors import run_cli  # noqa: E402
from budget_plugin.tools.files import write_atomic, write_json  # noqa: E402
from budget_plugin.tools.progress import log  # noqa: E402
from budget_research.seeds_report import figure, report, summarize, targets  # noqa: E402
from budget_research.seeds_study import DATASETS, study_seed  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--model", type=Path, default=Path("data/minilm/model"),
                        help="the converted encoder (default: %(default)s)")
    parser.add_argument("--cache", type=Path, default=Path("data/cache"),
                        help="the pinned packages' downloads (default: %(default)s)")
    parser.add_argument("--root", type=Path, default=Path("checkpoints/study"),
                        help="where each run's SAVE_DIR goes (default: %(default)s)")
    parser.add_argument("--records", type=Path, default=REPO / "results" / "width" / "seeds",
                        help="the measured records and the report (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--report-only", action="store_true", help="train and measure nothing")
    args = parser.parse_args(argv)

    def body():
        if not args.report_only:
            for dataset in args.datasets:
                for seed in args.seeds:
                    study_seed(args.model, dataset, seed, args.root, args.records, args.cache, args.threads, log)
        summaries = []
        for dataset in DATASETS:
            records = [json.loads(p.read_text()) for p in sorted(args.records.glob(f"{dataset}-seed*.json"))]
            if records:
                summaries.append(summarize(records))
                figure(summaries[-1], args.records / f"{dataset}.png")
        write_json(args.records / "summary.json", [dict(s, targets=targets(s)) for s in summaries])
        text = report(summaries)
        write_atomic(args.records / "summary.md", text)
        print(text)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
