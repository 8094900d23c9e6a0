"""Calibrate a BudgetFormer checkpoint's budget dial (``--head-ratio R``) on a split.

For mean head ratios over the whole range the dial accepts (--min-heads / H, 0.15 ...
0.9, 1, and a middle row wherever interpolating would miss it), finds the shift of the
budget logits that gives that ratio on the split's examples (a ratio the split cannot
reach is reported as a warning), and stores the table in the checkpoint (rewritten
atomically) with the split's name (what budget-export reads for a ratio), so that
``fairseq-validate --head-ratio R``, the hub's ``predict(..., head_ratio=R)`` and
``budget-predict --head-ratio R`` need no data (budget_plugin/dial/calibration.py;
budget-finetune runs it on dev).

    budget-calibrate checkpoints/nested/checkpoint_best.pt data/minilm/MR-bin
"""

import argparse
import sys
from pathlib import Path

from budget_plugin.dial.calibration import calibrate_checkpoint
from budget_plugin.tools.errors import run_cli


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a nested (or learned) BudgetFormer checkpoint")
    parser.add_argument("data", type=Path, help="its binarized data set")
    parser.add_argument("--split", default="valid", help="the split to calibrate on (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    return run_cli(lambda: calibrate_checkpoint(args.checkpoint, args.data, args.split, args.batch_size))


if __name__ == "__main__":
    sys.exit(main())
