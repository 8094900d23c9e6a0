"""Binarizing a task's encoded text with the real fairseq-preprocess, and what was
written (per split: examples, tokens, too long, unknown pieces, skipped rows)."""

import contextlib
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from fairseq.data import indexed_dataset

from budget_plugin.data.tsv import Split
from budget_plugin.tools.errors import PreprocessError
from budget_plugin.tools.fairseq_cli import CommandFailed, run


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
    tokenizer: str
    vocab_size: int  # pieces the tokenizer knows
    dict_size: int  # fairseq source dictionary incl. its 4 specials (fairseq-train adds <mask>)
    max_positions: int
    labels: Optional[List[Tuple[str, int]]]  # (label, train count) in class-index order
    splits: List[SplitSummary]

    def format(self) -> str:
        lines = [f"{self.name}: wrote {self.out_dir}"]
        lines.append(
            f"  tokenizer: {self.tokenizer}, {self.vocab_size} pieces;"
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


def encode_split(encode, split: Split, work: Path, vocab: set, num_inputs: int, max_positions: int,
                 truncate: Optional[int] = None) -> SplitSummary:
    """Write `<name>.input0` (and `.input1`) as pieces, one example per line.

    The pieces are exactly what fairseq's BPE (sentencepiece, or the plugin's wordpiece)
    produces for the raw text: `encode` is that BPE's split, cut to its first `truncate`
    pieces when given.
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
                line = " ".join(encode(text)[:truncate])
                out.write(line + "\n")
                tokens = line.split()  # what fairseq's tokenize_line will see
                length += len(tokens) + 1
                summary.unk_pieces += sum(t not in vocab for t in tokens)
            summary.tokens += length
            summary.too_long += length > max_positions
    return summary


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
    cmd = [
        "fairseq-preprocess", "--only-source",
        "--srcdict", str(job.srcdict.resolve()),  # absolute: it runs in work/
        "--trainpref", by_kind["train"][0],
        "--destdir", str(job.dest.resolve()),
        "--workers", str(workers),
    ]
    if by_kind["valid"]:
        cmd += ["--validpref", ",".join(by_kind["valid"])]
    if by_kind["test"]:
        cmd += ["--testpref", ",".join(by_kind["test"])]
    try:
        run(cmd, cwd=work)
    except CommandFailed as e:
        tail = e.output.strip().splitlines()[-15:]
        raise PreprocessError(f"fairseq-preprocess failed for {job.prefix} (exit {e.returncode}):\n"
                              + "\n".join(tail)) from None
    for s in job.splits:
        found = count_binarized(job.dest / s.name)
        if found != len(s.texts):  # never hand over misaligned inputs and labels
            raise PreprocessError(f"{job.dest / s.name}: {found} examples binarized, expected {len(s.texts)}")


def run_binarize_jobs(work: Path, jobs: Sequence[BinarizeJob], workers: int, log: Callable[[str], None]) -> None:
    """Run the fairseq-preprocess jobs side by side: each one spends seconds just importing torch."""
    log(f"fairseq-preprocess {', '.join(j.prefix for j in jobs)}")
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = [pool.submit(fairseq_preprocess, work, job, workers) for job in jobs]
    for future in futures:
        future.result()  # re-raises the first failure


def count_binarized(prefix: Path) -> Optional[int]:
    """Number of examples in a binarized split, read with fairseq's own reader (None if absent)."""
    if not indexed_dataset.MMapIndexedDataset.exists(str(prefix)):
        return None
    return len(indexed_dataset.MMapIndexedDataset(str(prefix)))


def num_classes(data: Path) -> int:
    """The classes of a binarized classification data set: its label dictionary's entries."""
    return sum(1 for line in (data / "label" / "dict.txt").read_text().splitlines() if line.strip())
