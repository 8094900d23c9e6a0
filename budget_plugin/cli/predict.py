"""Predict with a trained BudgetFormer: one example a line (tab-separated pairs), from a
file or standard input, to TSV: label, probability, and the heads run per layer.

    budget-predict --checkpoint-dir checkpoints/mr --data data/MR-bin < texts.txt
    budget-predict --checkpoint-dir checkpoints/mr --data data/MR-bin --input texts.txt --output preds.tsv

Output columns: line, label, probability, heads per layer (e.g. ``3,2,5,4``), and the
selected heads of every layer (``0.3.5|1.2|...``).

The input must be UTF-8: a line that is not is refused, naming the file and line, as
is a line without text; nothing is predicted until every line reads.
"""

import argparse
import sys
from pathlib import Path
from typing import BinaryIO, List, Optional, Sequence

import torch
from fairseq.data import data_utils

from budget_plugin.data.tsv import not_utf8, utf8_lines
from budget_plugin.tools.errors import DataError, run_cli
from budget_plugin.tools.files import write_atomic
from budget_plugin.tools.hub import add_checkpoint_arguments, load_hub

HEADER = "line\tlabel\tprobability\theads_per_layer\tselected_heads"


def read_examples(stream: BinaryIO, name) -> List[List[str]]:
    """One text or two tab-separated texts a line. A line that is not UTF-8 is refused
    rather than decoded with replacement characters: its prediction would be for a text
    the user did not write, in a row that says it is theirs."""
    examples = []
    for number, line in utf8_lines(stream):
        if isinstance(line, UnicodeDecodeError):
            raise DataError(f"{name}:{number}: {not_utf8(line)}; the input must be UTF-8 "
                            "(convert it first, e.g. with iconv -f latin1 -t utf-8)")
        fields = line.split("\t")
        if not all(f.strip() for f in fields) or len(fields) > 2:
            raise DataError(f"{name}:{number}: expected one text or two tab-separated texts, got {line!r}")
        examples.append(fields)
    return examples


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_arguments(parser)
    parser.add_argument("--input", type=Path, help="text file (default: standard input)")
    parser.add_argument("--output", type=Path, help="TSV to write (default: standard output)")
    parser.add_argument("--head", default="sentence_classification_head")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--too-long", choices=["truncate", "refuse"], default="truncate",
                        help="inputs longer than the model's positions: truncate with a warning, or stop")
    parser.add_argument("--cpu", action="store_true", help="stay on the CPU even when a GPU is present")
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        parser.error(f"--batch-size must be >= 1, got {args.batch_size}")
    return args


def predict(args: argparse.Namespace) -> None:
    name = args.input or "<stdin>"
    # the input first: a bad line stops the script before the model loads
    if args.input:
        with open(args.input, "rb") as f:
            examples = read_examples(f, name)
    else:
        examples = read_examples(sys.stdin.buffer, name)

    hub = load_hub(args)
    if torch.cuda.is_available() and not args.cpu:
        hub.cuda()
    labels = hub.task.label_dictionary
    max_positions = hub.model.max_positions()

    encoded = []
    for number, fields in enumerate(examples, 1):
        tokens = hub.encode(*fields)
        if len(tokens) > max_positions:
            if args.too_long == "refuse":
                raise DataError(f"{name}:{number}: {len(tokens)} tokens, over the model's {max_positions}")
            print(f"warning: {name}:{number}: {len(tokens)} tokens, truncated to {max_positions}", file=sys.stderr)
            tokens = torch.cat([tokens[: max_positions - 1], tokens[-1:]])
        encoded.append(tokens)

    rows = [HEADER]
    batches = range(0, len(encoded), args.batch_size)
    if args.input:
        from tqdm import tqdm

        batches = tqdm(batches, desc="predict", unit="batch", file=sys.stderr)
    pad = hub.task.source_dictionary.pad()
    for start in batches:
        chunk = encoded[start:start + args.batch_size]
        batch = data_utils.collate_tokens(chunk, pad_idx=pad)
        with torch.no_grad():
            probs = hub.predict(args.head, batch).exp()
        usage = hub.head_usage(batch)
        for i, example_usage in enumerate(usage):
            best = int(probs[i].argmax())
            label = labels.string([best + labels.nspecial])
            heads = ",".join(str(layer["num_heads"]) for layer in example_usage)
            selected = "|".join(".".join(map(str, layer["heads"])) for layer in example_usage)
            rows.append(f"{start + i + 1}\t{label}\t{probs[i, best]:.4f}\t{heads}\t{selected}")

    text = "".join(row + "\n" for row in rows)
    if args.output:
        write_atomic(args.output, text)
    else:
        sys.stdout.write(text)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    return run_cli(lambda: predict(args))


if __name__ == "__main__":
    sys.exit(main())
