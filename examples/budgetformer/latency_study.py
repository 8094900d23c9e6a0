#!/usr/bin/env python3
"""The latency study: for a given CPU latency, which fine-tuned model is most accurate,
and does a per-input head budget beat the same model with a fixed one?

Per data set (MR, TREC-6, BBC News at 128 pieces) and seed (1-3), all from the converted
all-MiniLM-L6-v2 with the accuracy study's recipe and update budget (examples/budgetformer/reproduce.py,
whose records are reused, never retrained):

  dense          fairseq's own roberta (the accuracy study's record)
  importance     importance pruning at head ratios 0.5 and 0.3 (records) and 0.2 (new)
  adaprune       fairseq's own magnitude head pruning (--mha-heads-to-keep 4) of the
                 fine-tuned dense model, fine-tuned again as fairseq's AdaPrune describes
  layers4        the first 4 of 6 layers (--encoder-layers-to-keep 0,1,2,3)
  nested         one model by budget-finetune's recipe, dialled to 1, 0.75, 0.5, 0.3
                 and 0.2 with per-input budgets, and at the same per-layer counts fixed
                 (no router), and exported physically pruned at 0.3 and 0.2

then every system's heads, FLOPs and CPU latency at batch 1 and 32 on the real test
inputs, side by side in one process; then results/latency.{md,json} and one plot per data
set (results/latency_DATASET.png) with the targets and a paragraph generated from the
numbers. Each finished step is recorded in results/reproduce/DATASET/ and never redone:
run the script again to go on.

The steps are examples/budgetformer/budget_research/study/: nested.py, latency.py and latency_report.py.

    python examples/budgetformer/latency_study.py                     # ~4 h here
    python examples/budgetformer/latency_study.py --stop-after 100    # start no group after 100 minutes
    python examples/budgetformer/latency_study.py --report-only
"""

import argparse
import logging
from pathlib import Path

logging.basicConfig(level=logging.WARNING)  # before fairseq sets up INFO logging

from budget_research.study import (
    latency,
    latency_report,  # noqa: E402
)
from budget_research.study.options import add_study_options, study_config  # noqa: E402
from budget_research.study.prepare import prepare  # noqa: E402

REPO = Path(__file__).resolve().parents[2]  # the repository: examples/budgetformer/ is two below


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_study_options(parser, REPO, latency.TIMING)
    # one training at a time on every core, the accuracy study's recipe
    return study_config(parser, parser.parse_args(argv), jobs=1)


def main(argv=None):
    cfg, report_only, deadline = parse_args(argv)
    cfg = prepare(cfg)
    if not report_only:
        latency.run_all(cfg, deadline)
    latency_report.write_report(cfg)


if __name__ == "__main__":
    main()
