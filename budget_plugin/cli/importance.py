"""Head importance of a fine-tuned model (Michel et al. 2019, "Are Sixteen Heads Really
Better than One?") and the heads to keep at a given budget: the static pruning baseline.

Importance (budget_plugin/nested/importance.py) is averaged over the examples of a split
(the training set by default, or its first --max-examples). The checkpoint (a dense ``roberta`` or a BudgetFormer)
is loaded into a BudgetFormer of its size running every head on its reference path, so
that each head's output is a tensor of its own (stock fairseq's fused attention has none).

Writes ``--out`` (JSON: the importance, L x H, and for ``--heads-per-layer`` the kept
heads) atomically and prints the option that fine-tunes with them:
``--head-selection kept --kept-heads '...'``.

    budget-importance --checkpoint checkpoints/dense/checkpoint_best.pt \\
        --data data/minilm/MR-bin --heads-per-layer 6 --out checkpoints/dense/importance.json
"""

import argparse
import sys
from pathlib import Path

from budget_plugin.dial.parsing import parse_counts
from budget_plugin.nested.importance import head_importance, kept_heads, kept_heads_option
from budget_plugin.tools.errors import run_cli
from budget_plugin.tools.files import write_json


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="the fine-tuned model")
    parser.add_argument("--data", type=Path, required=True, help="its binarized data set")
    parser.add_argument("--split", default="train", help="the examples to average over (default: %(default)s)")
    parser.add_argument("--heads-per-layer", required=True,
                        help="heads to keep: one number, or one per layer separated by commas")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-examples", type=int, help="average over the split's first N examples only")
    args = parser.parse_args(argv)

    def body():
        importance = head_importance(args.checkpoint, args.data, args.split, args.batch_size, args.max_examples)
        L, H = importance.shape
        counts = parse_counts(args.heads_per_layer, "heads_per_layer", L, 1, H)
        kept = kept_heads(importance, counts)
        option = kept_heads_option(kept)
        write_json(args.out, {"checkpoint": str(args.checkpoint), "split": args.split,
                              "max_examples": args.max_examples,
                              "importance": importance.tolist(), "heads_per_layer": counts, "kept_heads": option},
                   indent=1)
        for layer, row in enumerate(importance):
            print(f"layer {layer}: " + " ".join(f"{v:.2f}" for v in row.tolist()) + f"  keep {kept[layer]}")
        print(f"--head-selection kept --kept-heads '{option}'")

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
