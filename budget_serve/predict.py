"""The ``budget-serve-predict`` command: predict with budget-export-onnx's folder on ONNX
Runtime, importing neither torch nor fairseq (``budget-predict --onnx`` runs it too):

    budget-serve-predict --onnx exported/ --input texts.txt --output preds.tsv

The same columns as ``budget-predict`` with a fairseq checkpoint: line, label,
probability, heads per layer and the heads run (an export runs the same heads, its
first ones, for every input)."""

import argparse
import sys
from typing import List, Optional, Sequence

from budget_serve.predictor import Predictor
from budget_serve.texts import add_io_arguments, check_io_arguments, fitted, predict_command


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="budget-serve-predict", description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--onnx", required=True, metavar="DIR", help="budget-export-onnx's folder")
    parser.add_argument("--int8", action="store_true", help="its int8 model (exported with --int8; activations are "
                        "quantized per batch, so an example's probabilities can move slightly with its batch)")
    parser.add_argument("--threads", type=int, help="ONNX Runtime's threads (default: its own choice)")
    add_io_arguments(parser)
    args = parser.parse_args(argv)
    check_io_arguments(parser, args)
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    return args


def predict_rows(args: argparse.Namespace, name: str, examples: List[List[str]]) -> List[str]:
    predictor = Predictor(args.onnx, int8=args.int8, threads=args.threads)
    encoded = [fitted(predictor.encode(*fields), predictor.max_positions, args.too_long, name, number)
               for number, fields in enumerate(examples, 1)]
    probs = predictor.probabilities(encoded, args.batch_size)
    heads = predictor.manifest["heads"]
    counts = ",".join(map(str, heads))
    selected = "|".join(".".join(map(str, range(h))) for h in heads)
    return [f"{number}\t{predictor.labels[int(p.argmax())]}\t{p.max():.4f}\t{counts}\t{selected}"
            for number, p in enumerate(probs, 1)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    return predict_command(parse_args(sys.argv[1:] if argv is None else argv), predict_rows)


if __name__ == "__main__":
    sys.exit(main())
