"""The ``budget-serve-predict`` command: predict with budget-export-onnx's folder on ONNX
Runtime, importing neither torch nor fairseq (``budget-predict --onnx`` runs it too):

    budget-serve-predict --onnx exported/ --input texts.txt --output preds.tsv

One example a line (a text, or two tab-separated texts for a pair model). The same
columns as ``budget-predict`` with a fairseq checkpoint: line, label, probability (a
regression model: score), with --all-scores every label's probability, then the heads
per layer and the heads run (an export runs its first heads for every input)."""

import argparse
import sys
from typing import List, Optional, Sequence

from .predictor import Predictor
from .texts import (
    add_io_arguments,
    check_io_arguments,
    fitted,
    header,
    heads_columns,
    input_texts,
    predict_command,
    prediction_columns,
)


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
    encoded = [fitted(predictor.encoder.encode(*input_texts(fields, predictor.inputs, f"{name}:{number}"), cut=False),
                      predictor.max_positions, args.too_long, name, number)
               for number, fields in enumerate(examples, 1)]
    outputs = predictor.outputs(encoded, args.batch_size) if encoded else []
    heads = predictor.manifest["heads"]
    run = heads_columns(heads, [range(h) for h in heads])  # an export runs its first heads for every input
    labels, regression = predictor.labels, predictor.regression
    columns = header(regression, labels if args.all_scores and not regression else ())
    return [columns] + [f"{number}\t{prediction_columns(row, labels, regression, args.all_scores)}\t{run}"
                        for number, row in enumerate(outputs, 1)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    return predict_command(parse_args(sys.argv[1:] if argv is None else argv), predict_rows)


if __name__ == "__main__":
    sys.exit(main())
