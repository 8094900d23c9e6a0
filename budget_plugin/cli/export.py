"""Export a nested BudgetFormer at a fixed budget as a physically smaller checkpoint.

Each layer keeps only the weights of the heads it runs (its first k, the most
important: the nested model's heads are in importance order) and no router; with
``--width``, only its first FFN neurons too. The
export computes what ``fairseq-validate --head-ratio k1,...,kL`` computes on the
nested checkpoint, loads with ``fairseq-validate`` and the hub, and is the latency
limit of that budget (budget_plugin/nested/export.py). A ratio R exports the counts the
calibrated dial runs at R on the split it was calibrated on (so it needs that data
folder); the export runs them for every input, with no dial of its own.

    budget-export checkpoints/nested/checkpoint_best.pt exported/ --head-ratio 0.3 --data data/MR-bin
    budget-export checkpoints/nested/checkpoint_best.pt exported/ --head-ratio 4,4,3,3,4,4
    budget-export checkpoints/nested/checkpoint_best.pt exported/ --width 0.5
"""

import argparse
import sys
from pathlib import Path

from budget_plugin.nested.export import export_pruned
from budget_plugin.tools.errors import run_cli


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a --head-selection nested checkpoint")
    parser.add_argument("out_dir", type=Path, help="where to write checkpoint_pruned.pt")
    setting = parser.add_mutually_exclusive_group(required=True)
    setting.add_argument("--head-ratio",
                         help="cut the heads alone: a ratio R (the per-layer counts the calibrated dial runs at R on "
                         "its calibration split; needs --data) or one count per layer (4,4,3,3,4,4)")
    setting.add_argument("--width",
                         help="cut heads and FFN neurons: a ratio R (round(R x H) heads and round(R x F) neurons in "
                         "every layer) or one heads:neurons pair per layer (4:461,4:461,...)")
    parser.add_argument("--data", type=Path,
                        help="the binarized data folder the dial was calibrated on (for a ratio --head-ratio)")
    args = parser.parse_args(argv)

    def body():
        out = args.out_dir / "checkpoint_pruned.pt"
        cut = export_pruned(args.checkpoint, out, args.head_ratio, args.data, args.width)
        heads = ",".join(map(str, cut.heads))
        if args.head_ratio is not None and "," not in args.head_ratio:
            print(f"--head-ratio {args.head_ratio}: heads per layer {heads}, what the calibrated dial runs there on "
                  "its calibration split")
        before, after = args.checkpoint.stat().st_size, out.stat().st_size
        print(f"wrote {out}: heads per layer {heads}; FFN neurons per layer {','.join(map(str, cut.neurons))}; "
              f"{after / 2**20:.1f} MiB (the checkpoint read: {before / 2**20:.1f} MiB, with its optimizer state "
              "if saved)")

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
