"""Reading and checking GLUE-style TSV files: every row has the layout's columns,
non-empty texts and a known label, or it is reported (file and line) or skipped."""

import csv
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple, Union

from budget_plugin.data.glue_layout import Columns, Layout
from budget_plugin.tools.errors import DataError
from budget_serve.texts import not_utf8, utf8_lines

# GLUE texts hold long fields; the csv module's default limit (128 KiB) is not enough in general.
csv.field_size_limit(2**31 - 1)


@dataclass
class Split:
    """One input file, read and checked."""

    stem: str  # file stem, e.g. "dev_matched"
    name: str  # fairseq split name, e.g. "valid"
    path: Path
    texts: List[Tuple[str, ...]] = field(default_factory=list)
    labels: Optional[List[str]] = None  # None for unlabelled test files
    skipped: Counter = field(default_factory=Counter)  # reason -> rows skipped
    first_skipped_line: Optional[int] = None


def _file_lines(path: Path) -> Iterator[Tuple[int, Union[str, UnicodeDecodeError]]]:
    with open(path, "rb") as f:
        yield from utf8_lines(f)


def _split_fields(line: str) -> List[str]:
    # GLUE files are unquoted TSV: quotes are ordinary characters (QUOTE_NONE).
    return next(csv.reader([line], delimiter="\t", quoting=csv.QUOTE_NONE), [])


def _row_problem(
    fields: List[str], columns: Columns, regression: bool, known_labels: Optional[set]
) -> Optional[Tuple[str, str]]:
    """Return (reason, detail) if the row is unusable, else None."""
    if len(fields) != columns.width:
        return "wrong column count", f"expected {columns.width} tab-separated columns, found {len(fields)}"
    for col in columns.text:
        if not fields[col - 1].strip():
            return "empty text", f"empty text in column {col}"
    if columns.label is None:
        return None
    label = fields[columns.label - 1].strip()
    if regression:
        try:
            ok = math.isfinite(float(label))
        except ValueError:
            ok = False
        if not ok:
            return "bad label", f"label {label!r} in column {columns.label} is not a number"
    elif not label or any(c.isspace() for c in label):
        return "bad label", f"label {label!r} in column {columns.label} is empty or contains spaces"
    elif known_labels is not None and label not in known_labels:
        seen = ", ".join(sorted(known_labels))
        return "unseen label", f"label {label!r} never occurs in train.tsv (train labels: {seen})"
    return None


def read_split(
    path: Path,
    stem: str,
    name: str,
    columns: Columns,
    *,
    regression: bool,
    known_labels: Optional[set],
    skip_bad_rows: bool,
) -> Split:
    """Read one TSV file, keeping the text columns (and the label column, if any) of every row.

    A bad row raises DataError naming the file and line, or is counted and skipped.
    """
    split = Split(stem, name, path, labels=[] if columns.label is not None else None)

    def bad(lineno: int, reason: str, detail: str) -> None:
        if not skip_bad_rows:
            raise DataError(f"{path}:{lineno}: {detail} (use --skip-bad-rows to skip such rows)")
        split.skipped[reason] += 1
        if split.first_skipped_line is None:
            split.first_skipped_line = lineno

    for lineno, line in _file_lines(path):
        if isinstance(line, UnicodeDecodeError):
            bad(lineno, "not UTF-8", not_utf8(line))
            continue
        try:
            fields = _split_fields(line)
        except csv.Error as e:  # e.g. a stray carriage return inside a field
            bad(lineno, "malformed line", f"malformed line: {e}")
            continue
        if columns.header and lineno == 1:
            # A header of the wrong width means the wrong file or the wrong layout: never skip it.
            if len(fields) != columns.width:
                raise DataError(
                    f"{path}:1: header has {len(fields)} columns, expected {columns.width}"
                    " (is this the right task layout?)"
                )
            continue
        problem = _row_problem(fields, columns, regression, known_labels)
        if problem:
            bad(lineno, *problem)
            continue
        split.texts.append(tuple(fields[c - 1] for c in columns.text))
        if split.labels is not None:
            split.labels.append(fields[columns.label - 1].strip())
    return split


def _header(path: Path) -> Optional[List[str]]:
    """The first line's fields (None for an empty file or an unreadable line: read_split reports why)."""
    with open(path, "rb") as f:
        _, line = next(utf8_lines(f), (1, None))
    try:
        return _split_fields(line) if isinstance(line, str) else None
    except csv.Error:
        return None


def _check_test_header(path: Path, dev: Path, labelled_test: bool) -> None:
    """A test file with the dev file's header is labelled, one without it is not: the wrong
    choice would read texts as labels, or binarize a labelled test set without its labels."""
    header, dev_header = _header(path), _header(dev)
    if header is None or dev_header is None or (header == dev_header) == labelled_test:
        return
    shown, dev_shown = "\t".join(header), "\t".join(dev_header)
    if labelled_test:
        raise DataError(f"{path}:1: header {shown!r} is not {dev.name}'s {dev_shown!r}, but --labelled-test "
                        "reads test files with the dev file's columns")
    raise DataError(f"{path}:1: header {shown!r} is {dev.name}'s, so the file looks labelled: prepare with "
                    "--labelled-test (or give it the task's test columns)")


def read_task(
    task_dir: Path, layout: Layout, *, labelled_test: bool, skip_bad_rows: bool, log: Callable[[str], None]
) -> List[Split]:
    """Read every file of a task. Training labels are read first: dev labels must be among them."""
    paths = [task_dir / f"{stem}.tsv" for stem, _ in layout.files]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise DataError(f"missing input file: {', '.join(missing)}")

    splits: List[Split] = []
    known_labels = None
    dev = next((p for (stem, _), p in zip(layout.files, paths) if stem.startswith("dev")), None)
    for (stem, name), path in zip(layout.files, paths):
        if stem.startswith("test") and dev is not None and layout.dev.header:
            _check_test_header(path, dev, labelled_test)
        log(f"reading {path}")
        split = read_split(
            path,
            stem,
            name,
            layout.columns(stem, labelled_test),
            regression=layout.regression,
            known_labels=known_labels,
            skip_bad_rows=skip_bad_rows,
        )
        if not split.texts:  # fairseq cannot binarize or load an empty split
            skipped = f" ({sum(split.skipped.values())} skipped)" if split.skipped else ""
            raise DataError(f"{path}: no usable rows{skipped}")
        if stem == "train" and not layout.regression:
            known_labels = set(split.labels)
        splits.append(split)
    return splits
