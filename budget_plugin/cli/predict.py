"""Predict with a trained BudgetFormer: one example a line (tab-separated pairs), from a
file or standard input, to TSV: label, probability, and the heads run per layer.

    budget-predict --checkpoint-dir checkpoints/mr --data data/MR-bin < texts.txt
    budget-predict --checkpoint-dir checkpoints/mr --data data/MR-bin --input texts.txt --output preds.tsv
    budget-predict --onnx exported/ --input texts.txt        (an ONNX export: budget-serve-predict)

Output columns: line, label, probability, heads per layer (e.g. ``3,2,5,4``), and the
selected heads of every layer (``0.3.5|1.2|...``).

The input must be UTF-8: a line that is not is refused, naming the file and line, as
is a line without text; nothing is predicted until every line reads.
"""

import argparse
import sys
from typing import List, Optional, Sequence

import torch
from fairseq.data import data_utils

from budget_plugin.tools.hub import add_checkpoint_arguments, load_hub
from budget_serve.predict import main as onnx_main
from budget_serve.texts import add_io_arguments, check_io_arguments, fitted, predict_command, progress


def parse_args(argv: Optional[Sequence[str]] = None) -> Optional[argparse.Namespace]:
    parser = argparse.ArgumentParser(prog="budget-predict", description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_arguments(parser)
    add_io_arguments(parser)
    parser.add_argument("--head", default="sentence_classification_head")
    parser.add_argument("--cpu", action="store_true", help="stay on the CPU even when a GPU is present")
    parser.add_argument("--onnx", metavar="DIR", help="predict with budget-export-onnx's folder instead, as "
                        "budget-serve-predict does (budget-predict --onnx DIR --help: its options)")
    if asks_for_onnx(sys.argv[1:] if argv is None else argv):
        return None  # the ONNX path's, parsed there
    args = parser.parse_args(argv)
    check_io_arguments(parser, args)
    return args


def asks_for_onnx(argv: Sequence[str]) -> bool:
    """Whether a command line names an ONNX export (--onnx DIR)."""
    return any(arg == "--onnx" or arg.startswith("--onnx=") for arg in argv)


def predict_rows(args: argparse.Namespace, name: str, examples: List[List[str]]) -> List[str]:
    hub = load_hub(args)
    if torch.cuda.is_available() and not args.cpu:
        hub.cuda()
    labels = hub.task.label_dictionary
    max_positions = hub.model.max_positions()
    encoded = [torch.as_tensor(fitted(hub.encode(*fields).tolist(), max_positions, args.too_long, name, number))
               for number, fields in enumerate(examples, 1)]
    rows = []
    pad = hub.task.source_dictionary.pad()
    for start in progress(range(0, len(encoded), args.batch_size), args):
        batch = data_utils.collate_tokens(encoded[start:start + args.batch_size], pad_idx=pad)
        with torch.no_grad():
            probs = hub.predict(args.head, batch).exp()
        for i, example_usage in enumerate(hub.head_usage(batch)):
            best = int(probs[i].argmax())
            label = labels.string([best + labels.nspecial])
            heads = ",".join(str(layer["num_heads"]) for layer in example_usage)
            selected = "|".join(".".join(map(str, layer["heads"])) for layer in example_usage)
            rows.append(f"{start + i + 1}\t{label}\t{probs[i, best]:.4f}\t{heads}\t{selected}")
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args is None:  # --onnx: the torch-free command's options and path
        return onnx_main(argv)
    return predict_command(args, predict_rows)


if __name__ == "__main__":
    sys.exit(main())
