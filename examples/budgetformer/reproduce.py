#!/usr/bin/env python3
"""The accuracy study on a pretrained encoder: does a per-input head budget match the
dense model at a fraction of the heads, and beat the best fixed head subset?

Every system is fine-tuned from the same converted all-MiniLM-L6-v2 (6 layers, 12 heads),
with the same data order, seed, learning rate (1e-4, batch 32, 6% warmup) and update
budget per data set (UPDATES: 270 on TREC, 240 on MR, 60 on BBC News cut to 128 tokens,
so that the 99 runs, 11 per data set and seed, fit about 4 hours on 2 cores):

  dense       fairseq's own ``roberta``: every head (the model users ship today)
  budget      BudgetFormer as the README recommends (learned per-input budget and
              relevance, --router-scale 10, target head ratio r), its router started
              at the target budget, budget term weight 10 (chosen on TREC's dev split
              before the study: results/reproduce/trials.json, in the report)
  distill     the same, distilled from ``dense`` of the same seed (the teacher's
              logits on the training set, cached once: --distill-logits)
  prior       the same as ``budget``, its relevance started from the head importance of
              ``dense`` of the same seed (--relevance-prior): the importance ranking is
              every input's first choice, and what depends on the input is learned on
              top (added after the first seed's runs showed importance pruning ahead)
  importance  static pruning (Michel et al. 2019): the heads of highest importance of
              ``dense`` of the same seed (|dL/dgate| on the first 2048 training
              examples), fine-tuned from the pretrained weights like the others
  static      --head-selection static: one learned head subset per layer
  random      --head-selection random: per input, uniformly random heads

At head ratio r = 0.5: all of them. At r = 0.3: the best of the learned systems
(by dev accuracy at 0.5, on the first seed) and the three fixed baselines. The fixed
baselines run, per layer, the mean number of heads that the learned system of the same
seed and budget ran on dev (importance and static round it; random meets it on average).

Per run: train, keep the best checkpoint on dev, score dev and test once with
fairseq-validate; the record (results/reproduce/DATASET/RUN-seedN.json) is written last
and atomically, and committed: a run with a record is never trained again. Per data set
and seed, once all its runs are done: FLOPs (whole model and attention, routers included),
the heads each test input ran, and CPU latency at batch 1 and 32 against ``dense`` (the
models interleaved, median of repeats), and which heads the learned runs chose per test
input against the dense model's importance ranking, cached beside the records. Then
results/reproduce.{md,json} and results/reproduce_accuracy_vs_flops.png, with the
targets and a paragraph generated from the numbers. Runs not yet done are reported as
missing; run the script again to go on (``--stop-after`` ends a session cleanly).

The steps are examples/budgetformer/budget_research/study/: plan.py (the runs, read from the records),
train.py, measure.py, report.py (the values) and render.py (the files).

    python examples/budgetformer/reproduce.py                       # MR, TREC, BBC News x 3 seeds (~4 h here)
    python examples/budgetformer/reproduce.py --stop-after 120      # start no training after 120 minutes
    python examples/budgetformer/reproduce.py --report-only         # the report from the records so far
"""

import argparse
import logging
from pathlib import Path

logging.basicConfig(level=logging.WARNING)  # before fairseq sets up INFO logging

from budget_plugin.tools.progress import log  # noqa: E402
from budget_research.study import (
    measure,
    render,
    report,
    train,  # noqa: E402
)
from budget_research.study.options import add_study_options, study_config  # noqa: E402
from budget_research.study.plan import Latency, Plan, StudyConfig  # noqa: E402
from budget_research.study.prepare import prepare  # noqa: E402

REPO = Path(__file__).resolve().parents[2]  # the repository: examples/budgetformer/ is two below


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_study_options(parser, REPO, Latency())
    parser.add_argument("--lr", type=float, default=StudyConfig.lr)
    parser.add_argument("--jobs", type=int, default=StudyConfig.jobs,
                        help="trainings at a time (each on cores / jobs threads)")
    parser.add_argument("--no-measure", dest="measure", action="store_false",
                        help="report accuracies only (no FLOPs or latency)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    return study_config(parser, args, lr=args.lr, jobs=args.jobs, measure=args.measure)


def main(argv=None):
    cfg, report_only, deadline = parse_args(argv)
    cfg = prepare(cfg)
    if not report_only:
        log(f"{len(cfg.datasets)} data sets x {len(cfg.seeds)} seeds, updates {cfg.updates}, {cfg.jobs} trainings "
            f"at a time; finished runs are read from {cfg.records}")
        train.train_all(cfg, deadline)
    plan = Plan.read(cfg)
    measured = measure.measure_all(plan) if cfg.measure else {}
    render.write_report(plan, report.results(plan, measured))


if __name__ == "__main__":
    main()
