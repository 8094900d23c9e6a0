"""What budget-predict reads and writes, whichever model predicts (a fairseq checkpoint
or an ONNX export): one example a line (a text, or two tab-separated texts) in UTF-8,
and one TSV row a prediction."""

import argparse
import sys
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, List, Optional, Sequence, Tuple, Union

from .errors import DataError, run_cli
from .files import write_atomic


def header(regression: bool, all_scores: Sequence[str] = ()) -> str:
    """The TSV's columns: the line, its label and probability (a regression model: its
    score), with ``all_scores`` each of these labels' probability, and the heads each
    example ran in each layer."""
    scores = "".join(f"\tprobability:{label}" for label in all_scores)
    return ("line\tscore" if regression else "line\tlabel\tprobability") + scores + \
        "\theads_per_layer\tselected_heads"


def input_texts(item, inputs: Optional[int], where: str) -> List[str]:
    """An input as its texts (a text, or a pair: a tuple or list of two), refused naming
    ``where`` if it is neither or the model takes another number (``inputs``: 1 or 2;
    None: not known)."""
    texts = [item] if isinstance(item, str) else list(item) if isinstance(item, (tuple, list)) else [None]
    if not 1 <= len(texts) <= 2 or not all(isinstance(t, str) for t in texts):
        raise DataError(f"{where}: expected a text or a pair of texts, got {item!r}")
    if inputs is not None and len(texts) != inputs:
        raise DataError(f"{where}: {'a pair' if len(texts) == 2 else 'one text'}, but this model takes "
                        f"{'a pair of texts (tab-separated on a line)' if inputs == 2 else 'one text (no tab)'}")
    return texts


def prediction_columns(probabilities: Sequence[float], labels: Sequence[str], regression: bool,
                       all_scores: bool) -> str:
    """One row's label and probability (regression: its score), and with ``all_scores``
    every label's probability, tab-separated."""
    if regression:
        return f"{probabilities[0]:.4f}"
    best = max(range(len(labels)), key=lambda i: probabilities[i])
    columns = [labels[best], f"{probabilities[best]:.4f}"]
    return "\t".join(columns + ([f"{p:.4f}" for p in probabilities] if all_scores else []))


def heads_columns(counts: Sequence[int], selected: Sequence[Sequence[int]]) -> str:
    """The heads each layer ran (``3,2,5,4``) and which (``0.3.5|1.2|...``): two TSV columns."""
    return ",".join(map(str, counts)) + "\t" + "|".join(".".join(map(str, heads)) for heads in selected)


def utf8_lines(stream: BinaryIO) -> Iterator[Tuple[int, Union[str, UnicodeDecodeError]]]:
    """Yield (line number, line) from a binary stream, without the line ending: the
    line decoded as UTF-8, or the decode error, so that the caller names the line."""
    for lineno, raw in enumerate(stream, start=1):
        raw = raw.rstrip(b"\n").rstrip(b"\r")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            yield lineno, e
            continue
        if lineno == 1:
            line = line.lstrip("\ufeff")  # tolerate a byte-order mark
        yield lineno, line


def not_utf8(error: UnicodeDecodeError) -> str:
    """Where a line stops being UTF-8, for a message that names its file and line."""
    return f"invalid UTF-8 byte 0x{error.object[error.start]:02x} at byte {error.start + 1}"


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


def add_io_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", type=Path, help="text file (default: standard input)")
    parser.add_argument("--output", type=Path, help="TSV to write (default: standard output)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--too-long", choices=["truncate", "refuse"], default="truncate",
                        help="inputs longer than the model's positions: cut as in training, with a warning, or stop")
    parser.add_argument("--all-scores", action="store_true", help="also every label's probability, a column each")


def check_io_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.batch_size < 1:
        parser.error(f"--batch-size must be >= 1, got {args.batch_size}")


def read_input(args: argparse.Namespace) -> Tuple[str, List[List[str]]]:
    """The input's name (for messages) and its examples, all read before any model loads:
    a bad line stops the command first."""
    if args.input:
        with open(args.input, "rb") as f:
            return str(args.input), read_examples(f, args.input)
    return "<stdin>", read_examples(sys.stdin.buffer, "<stdin>")


def fitted(tokens: Sequence[int], max_positions: int, too_long: str, name: str, number: int) -> Sequence[int]:
    """An encoded example within the model's positions: refused, or cut as fairseq's
    ``--shorten-method truncate`` cut it in training (its first pieces; the closing </s>
    goes too), with a warning."""
    if len(tokens) <= max_positions:
        return tokens
    if too_long == "refuse":
        raise DataError(f"{name}:{number}: {len(tokens)} tokens, over the model's {max_positions}")
    print(f"warning: {name}:{number}: {len(tokens)} tokens, truncated to {max_positions}", file=sys.stderr)
    return list(tokens[:max_positions])


def write_rows(args: argparse.Namespace, rows: Sequence[str]) -> None:
    """The header (the first row) and rows to --output (atomically) or standard output."""
    text = "".join(row + "\n" for row in rows)
    if args.output:
        write_atomic(args.output, text)
    else:
        sys.stdout.write(text)


def predict_command(args: argparse.Namespace,
                    rows_of: Callable[[argparse.Namespace, str, List[List[str]]], Sequence[str]]) -> int:
    """budget-predict's body, whichever model predicts: the input read (a bad line stops
    the command before the model loads), ``rows_of(args, name, examples)`` (the header,
    then a row per example) written."""
    def body():
        name, examples = read_input(args)
        write_rows(args, rows_of(args, name, examples))

    return run_cli(body)
