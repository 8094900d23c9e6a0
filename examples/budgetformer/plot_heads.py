#!/usr/bin/env python3
"""Pictures of head usage: which heads a trained BudgetFormer runs, and how many.

    python examples/budgetformer/plot_heads.py --checkpoint-dir checkpoints/mr --data data/MR-bin \\
        --split test --out-dir results/heads

Writes, for the split:
  heads_overall.png    layer x head: how often each head is selected
  heads_by_class.png   the same map for every gold class, side by side
  budgets.png          per layer, the distribution of per-example head counts
and heads.json with the numbers behind them. Needs matplotlib (pip install -e .[viz]).
With --tensorboard-logdir it also writes, per layer, a TensorBoard histogram of the
per-example head counts (tag budget_heads/layer<i>, step = the checkpoint's update).
"""

import argparse
import logging
import sys
from pathlib import Path

# before fairseq (imported with the plugin) sets up logging at INFO: errors are one line
logging.basicConfig(level=logging.WARNING)

from budget_plugin.tools.checkpoints import read  # noqa: E402
from budget_plugin.tools.errors import run_cli  # noqa: E402
from budget_plugin.tools.files import write_json  # noqa: E402
from budget_plugin.tools.hub import add_checkpoint_arguments, load_hub  # noqa: E402
from budget_research.head_pictures import head_pictures  # noqa: E402


def updates(checkpoint: Path) -> int:
    """The checkpoint's update number: the step of its TensorBoard histograms."""
    history = read(checkpoint).get("optimizer_history") or [{}]
    return history[-1].get("num_updates", 0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_arguments(parser)
    parser.add_argument("--split", default="valid")
    parser.add_argument("--out-dir", required=True, type=Path)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--tensorboard-logdir", type=Path, help="also write per-layer budget histograms here")
    args = parser.parse_args(argv)

    def body():
        step = updates(args.checkpoint_dir / args.checkpoint_file) if args.tensorboard_logdir else 0
        summary = head_pictures(load_hub(args), args.split, args.out_dir, args.batch_size, args.tensorboard_logdir,
                                step)
        write_json(args.out_dir / "heads.json", summary)
        print(f"wrote {args.out_dir}/heads_overall.png, heads_by_class.png, budgets.png, heads.json "
              f"({summary['examples']} inputs)")

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
