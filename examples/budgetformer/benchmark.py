#!/usr/bin/env python3
"""Side-by-side benchmark: stock fairseq RoBERTa vs BudgetFormer (inference, and a training step).

For every size, batch size and sequence length ("cell") it runs, in one process, on
the same inputs and with identical weights:

* ``fairseq_mha``: an encoder of fairseq's own ``roberta`` architecture
  (``RobertaModel.build_model``, standard ``MultiheadAttention``), and
* ``budgetformer``: the same encoder with budgeted attention (the stock weights are
  copied in), its budget forced to ``round(ratio * H)`` heads per layer for every
  ``--head-ratios`` value, plus, with ``--checkpoint``, the checkpoint's learned budget
  and its static twin: the same weights running, in every layer, the learned budget's
  mean heads (rounded) on the cell's inputs, one head set for every input (the
  yardstick a learned budget must not be slower than).

``--dtype`` casts the models (bfloat16/float16 inference).

Forcing k fixes *how many* heads run; *which* heads an example runs is still picked per
example by the router's relevance scores. An untrained router is near-uniform (std 0.02),
so its relevance weights are redrawn from N(0, 1) (seeded): examples then choose
different heads, as a trained model's do, and the fast path has to group them. A
checkpoint keeps its trained router.

Measured per cell and implementation (eval mode, ``torch.no_grad``):

* FLOPs with ``torch.utils.flop_counter.FlopCounterMode`` for the whole forward pass and
  for the attention blocks (``budget_plugin.modules.flops.measure_flops``, which also
  counts the CPU kernel of ``scaled_dot_product_attention``; on a GPU BudgetedAttention's
  torch path runs for the count, since the counter cannot see Triton kernels);
* latency (milliseconds, median of ``--repeats`` timed runs after warm-up, CUDA events
  on a GPU; the
  implementations are interleaved within each repeat so that they share the machine's
  noise, and the one that goes first rotates from repeat to repeat) of the whole
  forward (``model(tokens, features_only=True)``) and of the
  attention blocks: every layer's attention module run standalone on the hidden states
  that enter that layer in the stock model, called as the layers call it
  (``self_attn(x, x, x, key_padding_mask=m, need_weights=False)``, router included),
  summed over layers;
* peak memory (bytes allocated above what was held before the call): on CPU from
  ``torch.profiler`` memory events (``profile_memory=True``), on CUDA from
  ``torch.cuda.max_memory_allocated``;
* throughput (sequences and non-padding tokens per second of the whole forward);
* training (``--train-repeats``, listed apart under ``training``): milliseconds per
  training step (forward, backward and an AdamW step, train mode, under autocast to
  ``--dtype``) of the stock model and of BudgetFormer, which trains on its all-heads
  path with its learned budget; with ``--fairseq-train-updates N``, ``fairseq-train``'s
  updates/s for both on synthetic data (``--fp16``/``--bf16`` after ``--dtype``);
* with ``--profile N``: a ``torch.profiler`` table (the N operators with the most self
  CPU time) of one run of each implementation's attention blocks, kept in the cell as
  ``attn_profile`` and appended to the markdown: where the time goes when a target is
  missed.

Derived: ideal speed-up (stock FLOPs / budgeted FLOPs), measured speed-up (stock latency
/ budgeted latency), efficiency ``(1 - t_budget / t_stock) / (1 - flops_budget /
flops_stock)`` (the fraction of the ideal saving captured; null when the ideal saving is
under 1%, e.g. at ratio 1.0), each for the whole model and for the attention blocks.

Inputs: random tokens; batch 1 is unpadded; in larger batches example 0 has the full
length and the others a seeded length uniform in [T/2, T] (right padding).

Results go to ``--json`` and ``--markdown`` (written atomically after every cell, so an
interrupted run leaves the cells done so far); the table is printed at the end.

The measurements are examples/budgetformer/budget_research/benchmark/ (config, models, cell, training,
tables, run).

    python examples/budgetformer/benchmark.py --quick
    python examples/budgetformer/benchmark.py --sizes small base --batch-sizes 1 8 32 --seq-lens 64 128 512
"""

import argparse
import sys
from dataclasses import fields
from pathlib import Path

from budget_plugin.tools.errors import DataError
from budget_plugin.tools.files import write_atomic, write_json
from budget_research.benchmark.config import DTYPES, MAX_POSITIONS, QUICK, SIZES, BenchmarkConfig
from budget_research.benchmark.dial import dial_benchmark, dial_table
from budget_research.benchmark.run import run
from budget_research.benchmark.tables import report_markdown

REPO = Path(__file__).resolve().parents[2]  # the repository: examples/budgetformer/ is two below
DEFAULT = BenchmarkConfig()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="CI subset: small, batch 1 8, len 64, 3 repeats")
    p.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=list(DEFAULT.sizes))
    p.add_argument("--batch-sizes", nargs="+", type=int, default=list(DEFAULT.batch_sizes))
    p.add_argument("--seq-lens", nargs="+", type=int, default=list(DEFAULT.seq_lens))
    p.add_argument("--head-ratios", nargs="+", type=float, default=list(DEFAULT.head_ratios))
    p.add_argument("--threads", type=int, default=DEFAULT.threads, help="torch.set_num_threads")
    p.add_argument("--repeats", type=int, default=DEFAULT.repeats, help="timed runs per implementation (median)")
    p.add_argument("--warmup", type=int, default=DEFAULT.warmup, help="untimed rounds after the FLOP/memory runs")
    p.add_argument("--time-budget", type=float, default=DEFAULT.time_budget,
                   help="seconds of timed rounds per cell; slow cells get fewer repeats (>= 3); 0: no cap")
    p.add_argument("--device", default=DEFAULT.device)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32",
                   help="inference in this dtype (the models cast); training steps under autocast to it")
    p.add_argument("--train-repeats", type=int, default=DEFAULT.train_repeats,
                   help="timed training steps per model and cell (median); 0: no training measurement")
    p.add_argument("--fairseq-train-updates", type=int, default=0, metavar="N",
                   help="per size: fairseq-train of stock roberta and of BudgetFormer for N updates on synthetic "
                        "data (the last batch size and length), updates/s side by side; 0: off")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="per cell and implementation, a torch.profiler table of the attention blocks (top N operators)")
    p.add_argument("--checkpoint", help="a BudgetFormer checkpoint: adds its learned budget (own size)")
    p.add_argument("--data", help="with --checkpoint of a calibrated nested model: instead of the cells, the "
                   "budget dial on this data set's test sentences (dense, nested at --dial ratios, fixed counts, "
                   "pruned export; examples/budgetformer/budget_research/benchmark/dial.py)")
    p.add_argument("--dial", nargs="+", default=["1", "0.5", "0.3"], help="with --data: the dialled ratios")
    p.add_argument("--json", help="default: results/benchmark.json (with --data: benchmark_dial.json)")
    p.add_argument("--markdown", help="default: results/benchmark.md (with --data: benchmark_dial.md)")
    p.add_argument("--seed", type=int, default=DEFAULT.seed)
    args = p.parse_args(argv)
    if args.quick:  # its subset, where the command line does not say otherwise
        explicit = {a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:]) if a.startswith("--")}
        for key, value in QUICK.items():
            if f"--{key.replace('_', '-')}" not in explicit:
                setattr(args, key, value)
    for ratio in args.head_ratios:
        if not 0 < ratio <= 1:
            p.error(f"--head-ratios must be in (0, 1], got {ratio}")
    if args.profile < 0:
        p.error(f"--profile must be >= 0, got {args.profile}")
    if args.train_repeats < 0:
        p.error(f"--train-repeats must be >= 0, got {args.train_repeats}")
    if args.fairseq_train_updates and args.fairseq_train_updates < 20:
        p.error(f"--fairseq-train-updates must be 0 (off) or >= 20, got {args.fairseq_train_updates}")
    if max(args.seq_lens) > MAX_POSITIONS:
        p.error(f"--seq-lens must be <= {MAX_POSITIONS}")
    if args.data is not None and args.checkpoint is None:
        p.error("--data needs --checkpoint (a calibrated nested model)")
    stem = "benchmark_dial" if args.data is not None else "benchmark"
    args.json = args.json or str(REPO / "results" / f"{stem}.json")
    args.markdown = args.markdown or str(REPO / "results" / f"{stem}.md")
    args.dtype = DTYPES[args.dtype]
    for key, value in vars(args).items():
        if isinstance(value, list):
            setattr(args, key, tuple(value))
    return args


def main(argv=None):
    args = parse_args(argv)
    cfg = BenchmarkConfig(**{f.name: getattr(args, f.name) for f in fields(BenchmarkConfig)})
    try:
        if args.data is not None:  # the dial on real sentences, not the cells
            report = dial_benchmark(cfg.checkpoint, args.data, args.dial, repeats=cfg.repeats, threads=cfg.threads)
            write_json(cfg.json, report)
            write_atomic(cfg.markdown, dial_table(report) + "\n")
            print(dial_table(report))
            return report
        report = run(cfg)
    except DataError as e:  # a checkpoint that cannot be read or does not fit
        sys.exit(f"error: {e}")
    print(report_markdown(report))
    return report


if __name__ == "__main__":
    main()
