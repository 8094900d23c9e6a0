#!/usr/bin/env python3
"""Binarize GLUE tasks (or any folder in a GLUE task's layout) for fairseq.

For each task this script

1. reads the train/dev/test TSV files with the column layout of fairseq's
   ``examples/roberta/preprocess_GLUE_tasks.sh`` and checks every row;
2. trains a sentencepiece model on the training text (or reuses ``--spm-model``);
3. encodes every split exactly as fairseq's ``--bpe sentencepiece`` does at
   inference time, and writes one fairseq dictionary taken from the
   sentencepiece vocabulary (shared by input0 and input1);
4. runs the real ``fairseq-preprocess`` for input0, input1 and the labels,

into ``OUT_DIR/<TASK>-bin/``, ready for::

    fairseq-train OUT_DIR/SST-2-bin --task sentence_prediction --init-token 0 \\
        --separator-token 2 --bpe sentencepiece \\
        --sentencepiece-model OUT_DIR/SST-2-bin/sentencepiece.bpe.model ...

Each folder is built under a hidden temporary name next to the target and only
renamed into place once complete, so an interrupted run never leaves a folder
that looks finished.

Other scripts can prepare their own data sets in a GLUE layout::

    prepare_task("data/raw/MR", "data", layout="SST-2", name="MR", labelled_test=True)
"""

import argparse
import contextlib
import csv
import functools
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

# fairseq's Dictionary always starts with these four symbols (ids 0-3).
FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
SPM_MODEL_NAME = "sentencepiece.bpe.model"  # the name fairseq's RoBERTa/XLM-R releases use

# GLUE texts hold long fields; the csv module's default limit (128 KiB) is not enough in general.
csv.field_size_limit(2**31 - 1)


class DataError(Exception):
    """A problem with the user's input; reported as one line, without a traceback."""


class PreprocessError(Exception):
    """fairseq-preprocess failed; carries the tail of its output."""


# --------------------------------------------------------------------------------------
# Task layouts
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Columns:
    """Where things are in one kind of TSV file. Column numbers are 1-based, as in `cut -f`."""

    width: int  # number of tab-separated fields every row must have
    text: Tuple[int, ...]  # one column per model input (input0, input1)
    label: Optional[int] = None  # None: unlabelled (GLUE test files)
    header: bool = True


@dataclass(frozen=True)
class Layout:
    """The files of one task and how to read them."""

    train: Columns
    dev: Columns
    test: Columns
    # (file stem, fairseq split name). Several dev/test files become valid, valid1, ...
    files: Tuple[Tuple[str, str], ...] = (("train", "train"), ("dev", "valid"), ("test", "test"))
    regression: bool = False

    @property
    def num_inputs(self) -> int:
        return len(self.train.text)

    def columns(self, stem: str, labelled_test: bool = False) -> Columns:
        if stem == "train":
            return self.train
        if stem.startswith("dev") or labelled_test:
            # A labelled test set (our own held-out split) looks like dev.
            return self.dev
        return self.test


def _glue(train: Columns, test: Columns, **kwargs) -> Layout:
    """Most GLUE tasks: dev.tsv has the same columns as train.tsv."""
    return Layout(train=train, dev=train, test=test, **kwargs)


# Column numbers from fairseq's examples/roberta/preprocess_GLUE_tasks.sh; widths from GLUE's files.
LAYOUTS: Dict[str, Layout] = {
    # CoLA: source, label, original label, sentence; train/dev have no header. Test: index, sentence.
    "CoLA": _glue(Columns(4, (4,), 2, header=False), Columns(2, (2,))),
    # SST-2: sentence, label. Test: index, sentence.
    "SST-2": _glue(Columns(2, (1,), 2), Columns(2, (2,))),
    # MRPC: Quality, #1 ID, #2 ID, #1 String, #2 String. Test: index instead of Quality.
    "MRPC": _glue(Columns(5, (4, 5), 1), Columns(5, (4, 5))),
    # STS-B: index, genre, filename, year, old_index, source1, source2, sentence1, sentence2, score.
    "STS-B": _glue(Columns(10, (8, 9), 10), Columns(9, (8, 9)), regression=True),
    # QQP: id, qid1, qid2, question1, question2, is_duplicate. Test: id, question1, question2.
    "QQP": _glue(Columns(6, (4, 5), 6), Columns(3, (2, 3))),
    # MNLI: 8 id/parse columns, sentence1, sentence2, then label1 + gold_label (train) or
    # label1..label5 + gold_label (dev); test stops after sentence2.
    "MNLI": Layout(
        train=Columns(12, (9, 10), 12),
        dev=Columns(16, (9, 10), 16),
        test=Columns(10, (9, 10)),
        files=(
            ("train", "train"),
            ("dev_matched", "valid"),
            ("dev_mismatched", "valid1"),
            ("test_matched", "test"),
            ("test_mismatched", "test1"),
        ),
    ),
    # QNLI/RTE/WNLI: index, sentence1 (question), sentence2, label. Test: no label.
    "QNLI": _glue(Columns(4, (2, 3), 4), Columns(3, (2, 3))),
    "RTE": _glue(Columns(4, (2, 3), 4), Columns(3, (2, 3))),
    "WNLI": _glue(Columns(4, (2, 3), 4), Columns(3, (2, 3))),
}


# --------------------------------------------------------------------------------------
# Reading and checking TSV files
# --------------------------------------------------------------------------------------


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


def _tsv_lines(path: Path) -> Iterator[Tuple[int, Union[str, UnicodeDecodeError]]]:
    """Yield (line number, decoded line) without the line ending; a decode error instead of text."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            raw = raw.rstrip(b"\n").rstrip(b"\r")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield lineno, e
                continue
            if lineno == 1:
                line = line.lstrip("\ufeff")  # tolerate a byte-order mark
            yield lineno, line


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

    for lineno, line in _tsv_lines(path):
        if isinstance(line, UnicodeDecodeError):
            byte = line.object[line.start]
            bad(lineno, "not UTF-8", f"invalid UTF-8 byte 0x{byte:02x} at byte {line.start + 1}")
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
    for (stem, name), path in zip(layout.files, paths):
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
        if stem == "train":
            if not split.texts:
                raise DataError(f"{path}: no usable training rows")
            if not layout.regression:
                known_labels = set(split.labels)
        splits.append(split)
    return splits


# --------------------------------------------------------------------------------------
# Sentencepiece and dictionaries
# --------------------------------------------------------------------------------------


def train_sentencepiece(
    text_path: Path, model_prefix: Path, vocab_size: int, model_type: str, log: Callable[[str], None]
) -> None:
    """Train a sentencepiece model; falls back to a soft vocabulary limit on too little text."""
    import sentencepiece as spm

    options = dict(
        input=str(text_path),
        model_prefix=str(model_prefix),
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=1.0,  # sentencepiece's advice for small alphabets such as English
        # Give the control symbols fairseq's ids, so sentencepiece ids and dictionary ids coincide.
        bos_id=0,
        pad_id=1,
        eos_id=2,
        unk_id=3,
        num_threads=os.cpu_count() or 1,
        minloglevel=2,  # keep the trainer's very chatty log quiet
    )
    try:
        spm.SentencePieceTrainer.train(**options)
    except RuntimeError as e:
        if "vocab" not in str(e).lower():
            raise DataError(f"sentencepiece training failed on {text_path}: {e}") from None
        # Small data sets cannot fill the requested vocabulary; let sentencepiece stop early.
        limit = re.search(r"value <= (\d+)", str(e))
        room = f" (room for {limit.group(1)})" if limit else ""
        log(f"too little text for {vocab_size} pieces{room}; retrying with hard_vocab_limit=False")
        try:
            spm.SentencePieceTrainer.train(**options, hard_vocab_limit=False)
        except RuntimeError as e2:
            raise DataError(f"sentencepiece training failed even with a soft vocabulary limit: {e2}") from None


def load_sentencepiece(path: Path):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor()
    try:
        sp.Load(str(path))
    except (OSError, RuntimeError) as e:
        raise DataError(f"{path}: not a sentencepiece model ({e})") from None
    return sp


def write_vocab_file(sp, path: Path) -> None:
    """The `.vocab` companion file sentencepiece writes when training: piece<TAB>score."""
    with open(path, "w", encoding="utf-8") as f:
        for i in range(sp.GetPieceSize()):
            f.write(f"{sp.IdToPiece(i)}\t{sp.GetScore(i):g}\n")


def write_source_dict(sp, path: Path) -> List[str]:
    """Write fairseq's dict.txt from the sentencepiece vocabulary and return its pieces.

    Every piece but the control symbols and <unk> (fairseq's Dictionary has its own four) is
    listed in sentencepiece order with a dummy count, so any text that fairseq's sentencepiece
    BPE produces later maps to the same ids as the preprocessed data.
    """
    pieces = []
    for i in range(sp.GetPieceSize()):
        if sp.IsControl(i) or sp.IsUnknown(i):
            continue
        piece = sp.IdToPiece(i)
        if piece in FAIRSEQ_SPECIALS:
            continue
        if any(c.isspace() for c in piece):
            # fairseq splits lines on whitespace, so such a piece could never be looked up.
            raise DataError(f"sentencepiece piece {i} ({piece!r}) contains whitespace; fairseq cannot use it")
        pieces.append(piece)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"{p} 1\n" for p in pieces)
    return pieces


def label_order(labels: Sequence[str]) -> List[Tuple[str, int]]:
    """Labels with counts in the order fairseq-preprocess would give them (count desc, then name).

    Keeping fairseq's order means class indices match what its own GLUE recipe produces.
    """
    return sorted(Counter(labels).items(), key=lambda kv: (-kv[1], kv[0]))


# --------------------------------------------------------------------------------------
# Encoding and binarizing
# --------------------------------------------------------------------------------------


@dataclass
class SplitSummary:
    name: str
    source: str
    examples: int
    tokens: int = 0  # model input length incl. <s>/</s>/separator, summed over examples
    too_long: int = 0
    unk_pieces: int = 0
    skipped: Counter = field(default_factory=Counter)
    first_skipped_line: Optional[int] = None
    labelled: bool = True


@dataclass
class TaskSummary:
    name: str
    out_dir: Path
    spm_source: str
    vocab_size: int  # sentencepiece pieces
    dict_size: int  # fairseq source dictionary incl. its 4 specials (fairseq-train adds <mask>)
    max_positions: int
    labels: Optional[List[Tuple[str, int]]]  # (label, train count) in class-index order
    splits: List[SplitSummary]

    def format(self) -> str:
        lines = [f"{self.name}: wrote {self.out_dir}"]
        lines.append(
            f"  sentencepiece: {self.spm_source}, {self.vocab_size} pieces;"
            f" dictionary: {self.dict_size} types incl. 4 specials"
        )
        if self.labels is None:
            lines.append("  labels: regression (float targets, score / 5)")
        else:
            listing = ", ".join(f"{i} -> {lab!r} ({n})" for i, (lab, n) in enumerate(self.labels))
            lines.append(f"  labels ({len(self.labels)}; class index -> label (train count)): {listing}")
        row = "  {:8}{:22}{:>9}{:>9}{:>8}{:>7}{:>9}".format
        lines.append(row("split", "file", "examples", "avg len", f">{self.max_positions}", "<unk>", "skipped"))
        for s in self.splits:
            avg = f"{s.tokens / s.examples:.1f}" if s.examples else "-"
            source = s.source + ("" if s.labelled else " (no labels)")
            lines.append(row(s.name, source, s.examples, avg, s.too_long, s.unk_pieces, sum(s.skipped.values())))
        for s in self.splits:
            if s.skipped:
                reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(s.skipped.items()))
                lines.append(f"  skipped in {s.source}: {reasons} (first at line {s.first_skipped_line})")
                if not s.labelled:
                    lines.append(f"  note: rows of unlabelled {s.source} no longer match its index column")
        lines.append(
            f"  '>{self.max_positions}' counts examples longer than --max-positions as the model sees them"
            " (<s> a </s> or <s> a </s> </s> b </s>)"
        )
        return "\n".join(lines)


def _progress(iterable, desc: str, total: int):
    """tqdm on a terminal; silent otherwise (the log lines mark each step)."""
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm comes with fairseq, but the reading/encoding code does not need it
        return iterable
    return tqdm(iterable, desc=desc, total=total, file=sys.stderr, unit=" rows", leave=False,
                mininterval=1.0, disable=not sys.stderr.isatty())


def encode_split(sp, split: Split, work: Path, vocab: set, num_inputs: int, max_positions: int) -> SplitSummary:
    """Write `<name>.input0` (and `.input1`) as sentencepiece pieces, one example per line.

    The pieces are exactly what fairseq's SentencepieceBPE.encode produces for the raw text.
    """
    summary = SplitSummary(split.name, split.path.name, len(split.texts), skipped=split.skipped,
                           first_skipped_line=split.first_skipped_line, labelled=split.labels is not None)
    with contextlib.ExitStack() as stack:
        outs = [stack.enter_context(open(work / f"{split.name}.input{i}", "w", encoding="utf-8"))
                for i in range(num_inputs)]
        for texts in _progress(split.texts, f"encoding {split.path.name}", len(split.texts)):
            # RoBERTa's sentence_prediction input: <s> a </s> for one input; for two the
            # second gets the separator prepended: <s> a </s> </s> b </s>.
            length = num_inputs
            for out, text in zip(outs, texts):
                line = " ".join(sp.EncodeAsPieces(text))
                out.write(line + "\n")
                tokens = line.split()  # what fairseq's tokenize_line will see
                length += len(tokens) + 1
                summary.unk_pieces += sum(t not in vocab for t in tokens)
            summary.tokens += length
            summary.too_long += length > max_positions
    return summary


def _preprocess_command() -> List[str]:
    """The fairseq-preprocess of the running interpreter's environment."""
    exe = Path(sys.executable).parent / "fairseq-preprocess"  # no resolve(): keep the venv's bin/
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-m", "fairseq_cli.preprocess"]


@dataclass
class BinarizeJob:
    """One fairseq-preprocess run: `<split>.<prefix>` text files in `work` -> `dest`."""

    prefix: str  # input0, input1 or label
    dest: Path
    srcdict: Path
    splits: List[Split]


def fairseq_preprocess(work: Path, job: BinarizeJob, workers: int) -> None:
    """Binarize one job's files with a fixed dictionary, then check nothing was lost."""
    # Relative prefixes (cwd=work), because fairseq splits --validpref/--testpref on commas.
    by_kind: Dict[str, List[str]] = {"train": [], "valid": [], "test": []}
    for s in job.splits:
        by_kind[s.name.rstrip("0123456789")].append(f"{s.name}.{job.prefix}")
    cmd = _preprocess_command() + [
        "--only-source",
        "--srcdict", str(job.srcdict.resolve()),  # absolute: it runs in work/
        "--trainpref", by_kind["train"][0],
        "--destdir", str(job.dest.resolve()),
        "--workers", str(workers),
    ]
    if by_kind["valid"]:
        cmd += ["--validpref", ",".join(by_kind["valid"])]
    if by_kind["test"]:
        cmd += ["--testpref", ",".join(by_kind["test"])]
    result = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stdout + result.stderr).strip().splitlines()[-15:]
        raise PreprocessError(
            f"fairseq-preprocess failed for {job.prefix} (exit {result.returncode}):\n" + "\n".join(tail))
    for s in job.splits:
        found = count_binarized(job.dest / s.name)
        if found != len(s.texts):  # never hand over misaligned inputs and labels
            raise PreprocessError(f"{job.dest / s.name}: {found} examples binarized, expected {len(s.texts)}")


def run_binarize_jobs(work: Path, jobs: Sequence[BinarizeJob], workers: int, log: Callable[[str], None]) -> None:
    """Run the fairseq-preprocess jobs side by side: each one spends seconds just importing torch."""
    log(f"fairseq-preprocess {', '.join(j.prefix for j in jobs)}")
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = [pool.submit(fairseq_preprocess, work, job, workers) for job in jobs]
        _indexed_dataset()  # import fairseq here, once, while the subprocesses run
    for future in futures:
        future.result()  # re-raises the first failure


@functools.lru_cache(maxsize=None)
def _indexed_dataset():
    """fairseq.data.indexed_dataset, imported on first use (it pulls in torch)."""
    logging.disable(logging.INFO)  # importing fairseq logs noise (e.g. about tensorboardX)
    try:
        from fairseq.data import indexed_dataset
    finally:
        logging.disable(logging.NOTSET)
    return indexed_dataset


def count_binarized(prefix: Path) -> Optional[int]:
    """Number of examples in a binarized split, read with fairseq's own reader (None if absent)."""
    indexed_dataset = _indexed_dataset()
    if not indexed_dataset.MMapIndexedDataset.exists(str(prefix)):
        return None
    return len(indexed_dataset.MMapIndexedDataset(str(prefix)))


# --------------------------------------------------------------------------------------
# Building a task folder
# --------------------------------------------------------------------------------------


def relax_permissions(path: Path) -> None:
    """Give a mkdtemp/mkstemp result the permissions a plain mkdir/open would have had."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


@contextlib.contextmanager
def building_dir(target: Path) -> Iterator[Path]:
    """Yield a temporary folder next to `target`; rename it to `target` only if the block succeeds.

    A previous `target` is replaced only once the new folder is complete; a failure (or Ctrl-C)
    removes the temporary folder, so nothing half-written ever carries the target's name.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        relax_permissions(tmp)
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not target.exists():
        os.rename(tmp, target)
        return
    # Swap: move the old folder aside (under a hidden name), then move the new one in.
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    os.rename(target, old / target.name)
    try:
        os.rename(tmp, target)
    except BaseException:
        os.rename(old / target.name, target)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


def _log(message: str) -> None:
    print(f"[prepare] {message}", file=sys.stderr, flush=True)


def prepare_task(
    task_dir: Union[str, Path],
    out_dir: Union[str, Path],
    *,
    layout: Union[str, Layout, None] = None,
    name: Optional[str] = None,
    labelled_test: bool = False,
    spm_model: Union[str, Path, None] = None,
    vocab_size: int = 8000,
    model_type: str = "unigram",
    max_positions: int = 512,
    workers: int = 1,
    skip_bad_rows: bool = False,
    log: Callable[[str], None] = _log,
) -> TaskSummary:
    """Prepare one task folder into `out_dir/<name>-bin/` and return what was written.

    `layout` is a GLUE task name (default: the folder's name) or a Layout; `name` names the
    output (default: the folder's name). With `labelled_test`, test files carry labels in the
    dev columns and are binarized with their labels (for our own held-out splits).
    """
    task_dir, out_dir = Path(task_dir), Path(out_dir)
    name = name or task_dir.name
    if not isinstance(layout, Layout):
        key = layout or task_dir.name
        if key not in LAYOUTS:
            raise DataError(f"unknown task layout {key!r}; known: {', '.join(LAYOUTS)}")
        layout = LAYOUTS[key]
    if not task_dir.is_dir():
        raise DataError(f"missing input folder: {task_dir}")
    if spm_model is not None and not Path(spm_model).is_file():
        raise DataError(f"missing sentencepiece model: {spm_model}")

    splits = read_task(task_dir, layout, labelled_test=labelled_test, skip_bad_rows=skip_bad_rows, log=log)
    train = splits[0]
    target = out_dir / f"{name}-bin"

    with building_dir(target) as tmp:
        work = tmp / "work"  # plain-text intermediates, removed before the rename
        work.mkdir()

        # 1. Sentencepiece model, stored next to the data.
        model_path = tmp / SPM_MODEL_NAME
        if spm_model is None:
            text_path = work / "spm_train.txt"
            with open(text_path, "w", encoding="utf-8") as f:
                for texts in train.texts:
                    f.writelines(t + "\n" for t in texts)
            log(f"training a {model_type} sentencepiece model ({vocab_size} pieces) on {train.path}")
            train_sentencepiece(text_path, model_path.with_suffix(""), vocab_size, model_type, log)
            sp = load_sentencepiece(model_path)
            spm_source = f"{model_type} trained on {train.path.name} (requested {vocab_size})"
        else:
            shutil.copyfile(spm_model, model_path)
            sp = load_sentencepiece(model_path)
            spm_source = f"reused {spm_model}"
        vocab_file = model_path.with_suffix(".vocab")
        if not vocab_file.exists():
            write_vocab_file(sp, vocab_file)

        # 2. One source dictionary for input0 and input1.
        dict_path = work / "dict.txt"
        vocab = set(write_source_dict(sp, dict_path))

        # 3. Encode every split, keeping every line.
        summaries = []
        for split in splits:
            log(f"encoding {split.path.name} ({len(split.texts)} rows)")
            summaries.append(encode_split(sp, split, work, vocab, layout.num_inputs, max_positions))

        # 4. Label files: classes for fairseq-preprocess, or plain floats for regression
        #    (sentence_prediction reads `label/<split>.label` itself).
        jobs = [BinarizeJob(f"input{i}", tmp / f"input{i}", dict_path, splits) for i in range(layout.num_inputs)]
        labelled = [s for s in splits if s.labels is not None]
        label_dir = tmp / "label"
        if layout.regression:
            label_dir.mkdir()
            for s in labelled:
                # STS-B scores are 0-5; fairseq's recipe prints `$1 / 5.0` with awk (%.6g).
                with open(label_dir / f"{s.name}.label", "w", encoding="utf-8") as f:
                    f.writelines(f"{float(y) / 5.0:.6g}\n" for y in s.labels)
            labels = None
        else:
            labels = label_order(train.labels)
            label_dict = work / "label_dict.txt"
            with open(label_dict, "w", encoding="utf-8") as f:
                f.writelines(f"{lab} {n}\n" for lab, n in labels)
            for s in labelled:
                with open(work / f"{s.name}.label", "w", encoding="utf-8") as f:
                    f.writelines(y + "\n" for y in s.labels)
            jobs.append(BinarizeJob("label", label_dir, label_dict, labelled))

        # 5. Binarize with the real fairseq-preprocess.
        run_binarize_jobs(work, jobs, workers, log)
        shutil.rmtree(work)

    return TaskSummary(
        name=name,
        out_dir=target,
        spm_source=spm_source,
        vocab_size=sp.GetPieceSize(),
        dict_size=len(vocab) + len(FAIRSEQ_SPECIALS),
        max_positions=max_positions,
        labels=labels,
        splits=summaries,
    )


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


def add_prepare_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared with scripts/get_data.py."""
    group = parser.add_argument_group("preparation")
    group.add_argument("--spm-model", type=Path,
                       help="reuse this sentencepiece model instead of training one per task")
    group.add_argument("--vocab-size", type=int, default=8000,
                       help="sentencepiece vocabulary size; less if the text is too small (default: %(default)s)")
    group.add_argument("--model-type", default="unigram", choices=["unigram", "bpe", "char", "word"],
                       help="sentencepiece model type (default: %(default)s)")
    group.add_argument("--max-positions", type=int, default=512,
                       help="report examples longer than this, counting <s>/</s> (default: %(default)s)")
    group.add_argument("--workers", type=int, default=1, help="fairseq-preprocess workers (default: %(default)s)")
    group.add_argument("--skip-bad-rows", action="store_true",
                       help="skip and count malformed rows instead of stopping at the first one")


def prepare_options(args: argparse.Namespace) -> dict:
    """The keyword arguments of prepare_task() taken from add_prepare_arguments()'s options."""
    return dict(
        spm_model=args.spm_model,
        vocab_size=args.vocab_size,
        model_type=args.model_type,
        max_positions=args.max_positions,
        workers=args.workers,
        skip_bad_rows=args.skip_bad_rows,
    )


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--glue-dir", type=Path, required=True, help="GLUE folder (CoLA/, SST-2/, ...)")
    parser.add_argument("--out-dir", type=Path, required=True, help="where <TASK>-bin/ folders are written")
    parser.add_argument("--tasks", nargs="+", choices=list(LAYOUTS), metavar="TASK",
                        help=f"tasks to prepare (default: all present; choices: {' '.join(LAYOUTS)})")
    add_prepare_arguments(parser)
    return parser.parse_args(argv)


def run_cli(body: Callable[[], None], failures: Tuple[type, ...] = (PreprocessError,)) -> int:
    """Run a script's body; a user error (DataError) exits 2, a tool failure 1, Ctrl-C 130,
    each with a one-line message and no traceback."""
    try:
        body()
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except failures as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; no partial output was kept", file=sys.stderr)
        return 130
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)

    def body():
        if not args.glue_dir.is_dir():
            raise DataError(f"missing GLUE folder: {args.glue_dir}")
        tasks = args.tasks or [t for t in LAYOUTS if (args.glue_dir / t).is_dir()]
        if not tasks:
            raise DataError(f"no GLUE task folders in {args.glue_dir} (expected some of: {' '.join(LAYOUTS)})")
        for task in tasks:
            summary = prepare_task(args.glue_dir / task, args.out_dir, layout=task, name=task,
                                   **prepare_options(args))
            print(summary.format(), flush=True)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
