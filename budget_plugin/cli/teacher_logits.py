"""A teacher's class logits for every example of a split, for distillation
(``--criterion budget_sentence_prediction --distill-logits FILE``).

Loads a fine-tuned checkpoint (a dense ``roberta`` or any model with a
``sentence_classification_head``) as fairseq-validate does, runs it in evaluation mode
over every example of the split of a binarized sentence-classification data set and
saves an N x classes float tensor whose row i is the example of id i (the dataset
index that fairseq's batches carry as ``sample["id"]``). Computed once, the logits cost
the student's training nothing but a lookup. Written atomically
(budget_plugin/tools/teacher.py).

    budget-teacher-logits --checkpoint checkpoints/dense/checkpoint_best.pt \\
        --data data/minilm/MR-bin --out checkpoints/dense/teacher_train.pt
"""

import argparse
import sys
from pathlib import Path

from budget_plugin.tools.errors import run_cli
from budget_plugin.tools.teacher import save_logits, teacher_logits


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="the teacher (fairseq checkpoint)")
    parser.add_argument("--data", type=Path, required=True, help="the binarized data set (input0/, label/)")
    parser.add_argument("--split", default="train", help="the split to score (default: %(default)s)")
    parser.add_argument("--out", type=Path, required=True, help="the .pt file to write")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)

    def body():
        logits = teacher_logits(args.checkpoint, args.data, args.split, args.batch_size)
        save_logits(args.out, logits)
        print(f"wrote {args.out}: {logits.size(0)} examples x {logits.size(1)} classes "
              f"(teacher accuracy is not computed here; fairseq-validate scores it)")

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
