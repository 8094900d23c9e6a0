"""Tests for scripts/prepare_glue.py (and budget_plugin.tools' data preparation behind
it) on tiny GLUE-layout folders (offline); the bad input it refuses: test_bad_input.py.

The module fixture prepares SST-2, RTE, STS-B and MNLI once with the real fairseq-preprocess
(the slow part: its tests are marked slow); the other tests fail before any binarizing
starts, or binarize with a stand-in.
"""

import contextlib
import importlib
import io
import random
import sys
from collections import Counter
from pathlib import Path

import pytest
from fairseq.data import Dictionary, data_utils

from budget_plugin.data import prepare as prepare_module
from budget_plugin.data.glue_layout import LAYOUTS
from budget_plugin.data.prepare import prepare_task
from budget_plugin.data.tsv import read_task
from budget_plugin.data.vocabulary import SPM_MODEL_NAME, load_sentencepiece
from budget_plugin.tools import fairseq_cli
from budget_plugin.tools.errors import DataError, PreprocessError
from helpers import assert_close, make_rte, make_sst2, sentence, write_tsv

prepare_glue = importlib.import_module("budget_plugin.cli.prepare")  # budget-prepare (scripts/prepare_glue.py)

MAX_POSITIONS = 16  # small, so that some fixture examples are "too long"


# --------------------------------------------------------------------------------------
# Fixture builders
# --------------------------------------------------------------------------------------


def make_stsb(root: Path, rng: random.Random, n=(20, 6, 4)):
    header = "index genre filename year old_index source1 source2 sentence1 sentence2 score".split()
    scores = ["5.000", "3.800", "0.000", "2.5", "4.333", "1.2"]

    def row(i, with_score=True):
        r = [i, "main-news", "2012", "2012test", i, "none", "none", sentence(rng), sentence(rng)]
        return r + [scores[i % len(scores)]] if with_score else r

    rows = {"train": [row(i) for i in range(n[0])], "dev": [row(i) for i in range(n[1])],
            "test": [row(i, False) for i in range(n[2])]}
    write_tsv(root / "STS-B" / "train.tsv", header, rows["train"])
    write_tsv(root / "STS-B" / "dev.tsv", header, rows["dev"])
    write_tsv(root / "STS-B" / "test.tsv", header[:9], rows["test"])
    return rows


def make_mnli(root: Path, rng: random.Random):
    ids = ("index promptID pairID genre sentence1_binary_parse sentence2_binary_parse sentence1_parse "
           "sentence2_parse").split()
    labels = ["entailment", "neutral", "contradiction", "neutral"]

    def row(i, extra_labels):
        label = labels[i % len(labels)]
        base = [i, i, f"{i}e", "fiction", "( a )", "( b )", "(ROOT a)", "(ROOT b)", sentence(rng), sentence(rng)]
        return base + [label] * extra_labels

    rows = {
        "train": [row(i, 2) for i in range(24)],  # label1, gold_label -> 12 columns
        "dev_matched": [row(i, 6) for i in range(6)],  # label1..label5, gold_label -> 16
        "dev_mismatched": [row(i, 6) for i in range(7)],
        "test_matched": [row(i, 0) for i in range(5)],
        "test_mismatched": [row(i, 0) for i in range(4)],
    }
    rows["dev_mismatched"][3][-1] = "contradiction"  # gold label (col 16) differs from label1
    header = ids + ["sentence1", "sentence2"]
    write_tsv(root / "MNLI" / "train.tsv", header + ["label1", "gold_label"], rows["train"])
    for split in ("dev_matched", "dev_mismatched"):
        write_tsv(root / "MNLI" / f"{split}.tsv",
                  header + [f"label{i}" for i in range(1, 6)] + ["gold_label"], rows[split])
    for split in ("test_matched", "test_mismatched"):
        write_tsv(root / "MNLI" / f"{split}.tsv", header, rows[split])
    return rows


class Prepared:
    """What the module fixture made: inputs, outputs, summaries, printed text."""

    def __init__(self, glue, out, rows, summaries, stdout):
        self.glue, self.out, self.rows, self.summaries, self.stdout = glue, out, rows, summaries, stdout

    def bin(self, task: str) -> Path:
        return self.out / f"{task}-bin"

    def dictionary(self, task: str, key: str = "input0") -> Dictionary:
        return Dictionary.load(str(self.bin(task) / key / "dict.txt"))

    def dataset(self, task: str, key: str, split: str):
        dictionary = self.dictionary(task, key)
        return data_utils.load_indexed_dataset(str(self.bin(task) / key / split), dictionary), dictionary

    def sp(self, task: str):
        return load_sentencepiece(self.bin(task) / SPM_MODEL_NAME)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    glue = tmp_path_factory.mktemp("glue")
    out = tmp_path_factory.mktemp("out")
    rng = random.Random(0)
    rows = {"SST-2": make_sst2(glue, rng), "RTE": make_rte(glue, rng),
            "STS-B": make_stsb(glue, rng), "MNLI": make_mnli(glue, rng)}
    summaries = {}
    real_prepare_task = prepare_glue.prepare_task

    def recording_prepare_task(*args, **kwargs):
        summary = real_prepare_task(*args, **kwargs)
        summaries[summary.name] = summary
        return summary

    stdout = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(stdout):
        mp.setattr(prepare_glue, "prepare_task", recording_prepare_task)
        rc = prepare_glue.main(["--glue-dir", str(glue), "--out-dir", str(out),
                                "--vocab-size", "200", "--max-positions", str(MAX_POSITIONS)])
    assert rc == 0
    return Prepared(glue, out, rows, summaries, stdout.getvalue())


def text_columns(task: str, split_file: str):
    layout = LAYOUTS[task]
    return [c - 1 for c in layout.columns(split_file).text]


# --------------------------------------------------------------------------------------
# Successful preparation
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_prepares_every_task_present(prepared):
    assert sorted(p.name for p in prepared.out.iterdir()) == ["MNLI-bin", "RTE-bin", "SST-2-bin", "STS-B-bin"]
    for task in ("SST-2", "RTE", "STS-B", "MNLI"):
        assert f"{task}: wrote {prepared.bin(task)}" in prepared.stdout
        assert (prepared.bin(task) / "sentencepiece.bpe.model").is_file()
        assert (prepared.bin(task) / "sentencepiece.bpe.vocab").is_file()
        assert not (prepared.bin(task) / "work").exists()


SPLITS = {
    "SST-2": [("train", "train"), ("dev", "valid"), ("test", "test")],
    "RTE": [("train", "train"), ("dev", "valid"), ("test", "test")],
    "STS-B": [("train", "train"), ("dev", "valid"), ("test", "test")],
    "MNLI": [("train", "train"), ("dev_matched", "valid"), ("dev_mismatched", "valid1"),
             ("test_matched", "test"), ("test_mismatched", "test1")],
}


@pytest.mark.slow
@pytest.mark.parametrize("task", list(SPLITS))
def test_every_row_becomes_one_example(prepared, task):
    n_inputs = LAYOUTS[task].num_inputs
    for split_file, split in SPLITS[task]:
        n_rows = len(prepared.rows[task][split_file])
        for i in range(n_inputs):
            dataset, _ = prepared.dataset(task, f"input{i}", split)
            assert len(dataset) == n_rows, (task, split, i)
        assert not (prepared.bin(task) / "input2").exists()
    summary = prepared.summaries[task]
    assert [(s.name, s.examples) for s in summary.splits] == [
        (split, len(prepared.rows[task][f])) for f, split in SPLITS[task]
    ]


@pytest.mark.slow
@pytest.mark.parametrize("task", ["RTE", "MNLI", "STS-B"])
def test_pair_inputs_share_one_dictionary(prepared, task):
    d0 = (prepared.bin(task) / "input0" / "dict.txt").read_text(encoding="utf-8")
    d1 = (prepared.bin(task) / "input1" / "dict.txt").read_text(encoding="utf-8")
    assert d0 == d1
    # Dictionary ids coincide with sentencepiece ids (same specials at 0-3, same order after).
    sp, dictionary = prepared.sp(task), prepared.dictionary(task)
    assert len(dictionary) == sp.GetPieceSize() == prepared.summaries[task].dict_size
    for i in range(4, sp.GetPieceSize()):
        assert dictionary.index(sp.IdToPiece(i)) == i


@pytest.mark.slow
def test_vocabulary_falls_back_when_text_is_small(prepared):
    summary = prepared.summaries["SST-2"]
    assert summary.vocab_size < 200  # requested 200; the fixture has ~25 distinct words
    assert f"{summary.vocab_size} pieces" in prepared.stdout


def decode(dictionary, tokens) -> str:
    return dictionary.string(tokens)  # drops the </s> that fairseq-preprocess appends


@pytest.mark.slow
@pytest.mark.parametrize("split_file,split,row", [("train", "train", 5), ("dev", "valid", 3), ("test", "test", 2)])
def test_pair_rows_stay_aligned(prepared, split_file, split, row):
    source = prepared.rows["RTE"][split_file][row]
    sp = prepared.sp("RTE")
    cols = text_columns("RTE", split_file)
    for i, col in enumerate(cols):
        dataset, dictionary = prepared.dataset("RTE", f"input{i}", split)
        assert decode(dictionary, dataset[row]) == " ".join(sp.EncodeAsPieces(source[col]))
    if split != "test":
        labels, label_dict = prepared.dataset("RTE", "label", split)
        assert decode(label_dict, labels[row]) == source[3]


@pytest.mark.slow
def test_fairseq_sentencepiece_bpe_encodes_like_the_data(prepared):
    """Raw text through fairseq's own `--bpe sentencepiece` gives exactly the binarized ids."""
    from fairseq.data.encoders.sentencepiece_bpe import SentencepieceBPE, SentencepieceConfig

    model = prepared.bin("SST-2") / "sentencepiece.bpe.model"
    bpe = SentencepieceBPE(SentencepieceConfig(sentencepiece_model=str(model)))
    dataset, dictionary = prepared.dataset("SST-2", "input0", "valid")
    for row in (0, 1):  # row 1 has the unbalanced quote
        raw = prepared.rows["SST-2"]["dev"][row][0]
        ids = dictionary.encode_line(bpe.encode(raw), append_eos=True, add_if_not_exist=False)
        assert ids.tolist() == dataset[row].tolist()


@pytest.mark.slow
def test_label_dictionary_built_from_training_labels(prepared):
    # fairseq-preprocess's order: most frequent first, ties alphabetical.
    assert (prepared.bin("RTE") / "label" / "dict.txt").read_text().split("\n")[:2] == [
        "not_entailment 16", "entailment 8"]
    assert prepared.summaries["RTE"].labels == [("not_entailment", 16), ("entailment", 8)]
    assert [lab for lab, _ in prepared.summaries["MNLI"].labels] == ["neutral", "contradiction", "entailment"]
    assert "0 -> 'not_entailment' (16), 1 -> 'entailment' (8)" in prepared.stdout
    # Unlabelled GLUE test sets get inputs only.
    for task in ("SST-2", "RTE", "MNLI"):
        assert not list((prepared.bin(task) / "label").glob("test*"))


@pytest.mark.slow
def test_regression_labels_are_floats_divided_by_five(prepared):
    label_dir = prepared.bin("STS-B") / "label"
    assert sorted(p.name for p in label_dir.iterdir()) == ["train.label", "valid.label"]
    for split_file, split in (("train", "train"), ("dev", "valid")):
        lines = (label_dir / f"{split}.label").read_text().splitlines()
        expected = [float(r[9]) / 5 for r in prepared.rows["STS-B"][split_file]]
        assert_close([float(x) for x in lines], expected, rtol=1e-12)  # decimals read back, in float64
    assert (label_dir / "train.label").read_text().splitlines()[:5] == ["1", "0.76", "0", "0.5", "0.8666"]
    assert prepared.summaries["STS-B"].labels is None


@pytest.mark.slow
def test_mnli_has_two_dev_and_two_test_sets(prepared):
    for split, rows in (("valid", "dev_matched"), ("valid1", "dev_mismatched")):
        labels, label_dict = prepared.dataset("MNLI", "label", split)
        # Dev labels come from gold_label (column 16), not label1.
        assert [decode(label_dict, labels[i]) for i in range(len(labels))] == [
            r[15] for r in prepared.rows["MNLI"][rows]]
    dataset, dictionary = prepared.dataset("MNLI", "input1", "test1")
    sp = prepared.sp("MNLI")
    assert decode(dictionary, dataset[2]) == " ".join(sp.EncodeAsPieces(prepared.rows["MNLI"]["test_mismatched"][2][9]))


@pytest.mark.slow
@pytest.mark.parametrize("task,num_classes", [("SST-2", 2), ("RTE", 2)])
def test_too_long_counts_match_fairseq_sentence_prediction(prepared, task, num_classes):
    """Lengths as fairseq's sentence_prediction task builds inputs (<s> a </s> [</s> b </s>])."""
    from fairseq.tasks.sentence_prediction import SentencePredictionConfig, SentencePredictionTask

    cfg = SentencePredictionConfig(
        data=str(prepared.bin(task)), num_classes=num_classes, init_token=0, separator_token=2,
        max_positions=MAX_POSITIONS, regression_target=False, classification_head_name="head", seed=1,
    )
    fairseq_task = SentencePredictionTask.setup_task(cfg)
    for split in prepared.summaries[task].splits:
        fairseq_task.load_dataset(split.name)
        sizes = fairseq_task.datasets[split.name].sizes[0]  # NestedDictionaryDataset: one array per field
        assert split.too_long == int((sizes > MAX_POSITIONS).sum()), (task, split.name)
        assert split.tokens == int(sizes.sum())
    assert sum(s.too_long for s in prepared.summaries["RTE"].splits) > 0  # the check is not vacuous


@pytest.mark.slow
def test_relative_paths_work_from_any_directory(tmp_path, monkeypatch):
    """fairseq-preprocess runs inside a work folder: relative --out-dir / --glue-dir must
    still name the caller's folders (it once looked for dict.txt relative to work/)."""
    make_sst2(tmp_path / "glue", random.Random(3))
    monkeypatch.chdir(tmp_path)
    with contextlib.redirect_stdout(io.StringIO()):
        rc = prepare_glue.main(["--glue-dir", "glue", "--out-dir", "out", "--tasks", "SST-2", "--vocab-size", "200"])
    assert rc == 0
    for name in ("input0", "label"):
        assert (tmp_path / "out" / "SST-2-bin" / name / "train.bin").stat().st_size > 0


def test_cola_has_no_header_in_train_and_dev(tmp_path):
    rows = [["gj04", "1", "", "The cat sat ."], ["gj04", "0", "*", "Cat the sat ."]]
    write_tsv(tmp_path / "CoLA" / "train.tsv", None, rows)
    write_tsv(tmp_path / "CoLA" / "dev.tsv", None, rows[:1])
    write_tsv(tmp_path / "CoLA" / "test.tsv", ["index", "sentence"], [[0, "A test ."]])
    splits = read_task(tmp_path / "CoLA", LAYOUTS["CoLA"], labelled_test=False, skip_bad_rows=False,
                       log=lambda m: None)
    assert [s.texts for s in splits] == [
        [("The cat sat .",), ("Cat the sat .",)], [("The cat sat .",)], [("A test .",)]]
    assert [s.labels for s in splits] == [["1", "0"], ["1"], None]


@pytest.mark.slow
def test_skip_bad_rows_counts_per_file(prepared, tmp_path):
    """A custom folder in SST-2 layout (labelled test), reusing the SST-2 sentencepiece model."""
    rng = random.Random(3)
    task = tmp_path / "raw" / "MR"
    header = ["sentence", "label"]
    train = [[sentence(rng), str(i % 2)] for i in range(12)]
    write_tsv(task / "train.tsv", header, train[:1] + [b"too\tmany\tcolumns\n", b"\t1\n", b"\xff\xfe\t0\n"] + train[1:])
    write_tsv(task / "dev.tsv", header, [[sentence(rng), "1"], [sentence(rng), "neutral"], [sentence(rng), "0"]])
    write_tsv(task / "test.tsv", header, [[sentence(rng), "0"], [" ", "1"], [sentence(rng), "1"], [sentence(rng), "0"]])
    model = prepared.bin("SST-2") / "sentencepiece.bpe.model"

    summary = prepare_task(task, tmp_path / "out", layout="SST-2", name="MR", labelled_test=True,
                                        spm_model=model, skip_bad_rows=True, log=lambda m: None)

    train_s, dev_s, test_s = summary.splits
    assert train_s.skipped == Counter({"wrong column count": 1, "empty text": 1, "not UTF-8": 1})
    assert train_s.first_skipped_line == 3
    assert dev_s.skipped == Counter({"unseen label": 1})
    assert test_s.skipped == Counter({"empty text": 1})
    assert [s.examples for s in summary.splits] == [12, 2, 3]
    text = summary.format()
    assert "skipped in train.tsv: 1 empty text, 1 not UTF-8, 1 wrong column count (first at line 3)" in text
    assert "skipped in dev.tsv: 1 unseen label (first at line 3)" in text

    out = tmp_path / "out" / "MR-bin"
    # A labelled test split is binarized with its labels.
    labels = data_utils.load_indexed_dataset(str(out / "label" / "test"),
                                             Dictionary.load(str(out / "label" / "dict.txt")))
    assert len(labels) == 3
    assert summary.tokenizer.startswith("sentencepiece reused")
    assert (out / "input0" / "dict.txt").read_text() == (prepared.bin("SST-2") / "input0" / "dict.txt").read_text()
    assert (out / "sentencepiece.bpe.model").read_bytes() == model.read_bytes()


@pytest.mark.slow
def test_truncate_tokens_keeps_the_first_pieces_of_every_input(prepared, tmp_path):
    """--truncate-tokens N: every binarized input is its first N pieces (then </s>)."""
    rng = random.Random(5)
    task = tmp_path / "raw" / "LONG"
    header = ["sentence", "label"]
    for split, n in (("train", 8), ("dev", 3), ("test", 3)):
        write_tsv(task / f"{split}.tsv", header, [[" ".join(sentence(rng) for _ in range(4)), str(i % 2)]
                                                  for i in range(n)])
    model = prepared.bin("SST-2") / "sentencepiece.bpe.model"
    full = prepare_task(task, tmp_path / "full", layout="SST-2", labelled_test=True, spm_model=model,
                        log=lambda m: None)
    cut = prepare_task(task, tmp_path / "cut", layout="SST-2", labelled_test=True, spm_model=model, truncate=3,
                       log=lambda m: None)
    dictionary = Dictionary.load(str(tmp_path / "cut" / "LONG-bin" / "input0" / "dict.txt"))
    long = data_utils.load_indexed_dataset(str(tmp_path / "full" / "LONG-bin" / "input0" / "train"), dictionary)
    short = data_utils.load_indexed_dataset(str(tmp_path / "cut" / "LONG-bin" / "input0" / "train"), dictionary)
    assert len(short) == len(long) == 8
    for a, b in zip(long, short):
        assert len(a) > 4 and b.tolist() == a[:3].tolist() + [dictionary.eos()]
    assert cut.splits[0].tokens < full.splits[0].tokens
    with pytest.raises(DataError, match="--truncate-tokens must be >= 1, got 0"):
        prepare_task(task, tmp_path / "zero", layout="SST-2", spm_model=model, truncate=0, log=lambda m: None)


# --------------------------------------------------------------------------------------
# Interrupted and failed runs
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("error", [PreprocessError("boom"), KeyboardInterrupt()])
def test_failed_run_keeps_previous_folder_and_no_temp(tmp_path, monkeypatch, error):
    glue, out = tmp_path / "glue", tmp_path / "out"
    make_sst2(glue, random.Random(4))
    previous = out / "SST-2-bin"
    previous.mkdir(parents=True)
    (previous / "marker").write_text("complete earlier run")

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(prepare_module, "run_binarize_jobs", fail)
    with pytest.raises(type(error)):
        prepare_task(glue / "SST-2", out, vocab_size=50, log=lambda m: None)
    assert [p.name for p in out.iterdir()] == ["SST-2-bin"]
    assert (previous / "marker").read_text() == "complete earlier run"


def test_fairseq_preprocess_failure_is_reported(tmp_path, monkeypatch, capsys):
    glue, out = tmp_path / "glue", tmp_path / "out"
    make_sst2(glue, random.Random(5))
    fake = [sys.executable, "-c", "import sys; print('something broke'); sys.exit(3)"]
    monkeypatch.setattr(fairseq_cli, "console_script", lambda name: fake)
    rc = prepare_glue.main(["--glue-dir", str(glue), "--out-dir", str(out), "--vocab-size", "50"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "fairseq-preprocess failed for" in err and "something broke" in err
    assert list(out.iterdir()) == []
