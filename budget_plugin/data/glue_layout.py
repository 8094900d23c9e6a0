"""Where things are in the TSV files of each GLUE task: column layouts taken from
fairseq's examples/roberta/preprocess_GLUE_tasks.sh, widths from GLUE's files."""

from dataclasses import dataclass
from typing import Dict, Optional, Tuple


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
