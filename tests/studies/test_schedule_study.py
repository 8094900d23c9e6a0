"""examples/budgetformer/budget_research: the schedule study's small data set
(small_data.py) and the dense teacher's augmentation (augmentation.py): words of one piece
replaced by their embedding neighbours, the variants labelled by the teacher, dev and
test untouched; and the study's report."""

import filecmp

import pytest
import torch
from fairseq.data import Dictionary, indexed_dataset

from budget_plugin.tools.errors import DataError
from budget_plugin.tools.teacher import teacher_logits
from budget_research import augmentation
from budget_research.schedule_study import NARROW, report
from budget_research.precision_study import SYSTEMS
from budget_research.small_data import cut_training
from helpers import trained_sst_like, write_tsv


def test_the_neighbours_are_the_nearest_other_words_by_cosine():
    embeddings = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9], [1.0, 0.05], [-1.0, 0.0]])
    words = torch.tensor([True, True, True, True, False, True])  # 4 is no word: never chosen
    near = augmentation.neighbours(embeddings, words, torch.tensor([0, 2]), k=2)
    assert near.tolist() == [[1, 3], [3, 1]]


def test_only_single_piece_words_are_replaced_and_by_their_neighbours():
    dictionary = Dictionary()
    ids = [dictionary.add_symbol(s) for s in ("film", "play", "##ful", "good", "!")]
    words = torch.zeros(len(dictionary), dtype=torch.bool)
    words[ids[0]] = words[ids[1]] = words[ids[3]] = True
    continuations = torch.tensor(["##" in s for s in dictionary.symbols])
    text = torch.tensor([ids[0], ids[1], ids[2], ids[3], ids[4], dictionary.eos()])  # film play ##ful good ! </s>
    single = augmentation.single_piece_words(text, words, continuations)
    assert single.tolist() == [True, False, False, True, False, False]  # "play" starts a longer word
    near = torch.zeros(len(dictionary), 2, dtype=torch.long)
    near[ids[0]], near[ids[3]] = torch.tensor([ids[3], ids[3]]), torch.tensor([ids[0], ids[0]])
    generator = torch.Generator().manual_seed(0)
    every, = augmentation.variants(text, single, near, copies=1, p=1.0, generator=generator)
    assert every.tolist() == [ids[3], ids[1], ids[2], ids[0], ids[4], dictionary.eos()]
    none, = augmentation.variants(text, single, near, copies=1, p=0.0, generator=generator)
    assert torch.equal(none, text)


@pytest.mark.slow  # trains the teacher with fairseq-train
def test_the_grown_training_set_holds_the_originals_and_the_teachers_labels(tmp_path_factory, monkeypatch):
    data, save = trained_sst_like(tmp_path_factory)
    # the tiny task's sentencepiece pieces: "▁good" is a whole word there
    monkeypatch.setattr(augmentation, "replaceable", lambda d: torch.tensor(
        [s.startswith("\u2581") and s[1:].isalpha() for s in d.symbols]))
    teacher = save / "checkpoint_best.pt"
    out = augmentation.augment(data, teacher, tmp_path_factory.mktemp("aug") / "grown", copies=3, p=0.5, k=3,
                               log=lambda m: None)
    read = lambda folder, name: indexed_dataset.make_dataset(str(folder / name / "train"), impl="mmap")  # noqa: E731
    texts, labels, before, before_labels = read(out, "input0"), read(out, "label"), read(data, "input0"), \
        read(data, "label")
    n = len(before)
    assert len(texts) == len(labels) == 4 * n
    assert all(torch.equal(texts[i], before[i]) and torch.equal(labels[i], before_labels[i]) for i in range(n))
    changed = sum(not torch.equal(texts[n + 3 * i + c], before[i]) for i in range(n) for c in range(3))
    assert changed > n  # most variants differ from their text
    nspecial = Dictionary.load(str(data / "label" / "dict.txt")).nspecial
    predicted = teacher_logits(teacher, out, "train").argmax(-1)[n:]
    assert [int(labels[i][0]) - nspecial for i in range(n, 4 * n)] == predicted.tolist()
    for name in ("input0/valid.bin", "input0/valid.idx", "label/valid.bin", "input0/dict.txt", "label/dict.txt"):
        assert filecmp.cmp(data / name, out / name, shallow=False), name


def test_a_small_set_keeps_dev_and_test_and_refuses_more_rows_than_there_are(tmp_path, monkeypatch):
    raw = tmp_path / "raw" / "TOY"
    raw.mkdir(parents=True)
    write_tsv(raw / "train.tsv", ["sentence", "label"], [[f"text {i}", str(i % 2)] for i in range(10)])
    for split in ("dev", "test"):
        write_tsv(raw / f"{split}.tsv", ["sentence", "label"], [["a dev text", "1"], ["another", "0"]])
    with pytest.raises(DataError, match=r"train.tsv: 10 training rows, fewer than the 11 asked for"):
        cut_training(raw, tmp_path, "TOY4", 11, seed=1, model_dir=tmp_path)
    rows = lambda path: path.read_text().splitlines()  # noqa: E731
    cut = tmp_path / "raw" / "TOY4"
    prepared = []  # the binarizing is prepare_task's, tested on its own (test_prepare_glue.py)
    monkeypatch.setattr("budget_research.small_data.prepare_task",
                        lambda *a, **k: prepared.append(a) or type("Summary", (), {"format": lambda self: ""})())
    cut_training(raw, tmp_path, "TOY4", 4, seed=1, model_dir=tmp_path, log=lambda m: None)
    assert prepared == [(cut, tmp_path)]
    assert rows(cut / "train.tsv")[0] == "sentence\tlabel" and len(rows(cut / "train.tsv")) == 5
    assert set(rows(cut / "train.tsv")[1:]) < set(rows(raw / "train.tsv")[1:])
    assert rows(cut / "dev.tsv") == rows(raw / "dev.tsv") and rows(cut / "test.tsv") == rows(raw / "test.tsv")


def test_the_report_tables_every_system_and_the_narrow_mean():
    dev = {name: 80.0 for name in SYSTEMS}
    run = lambda acc: {"options": [], "updates": 480, "dev": {**dev, **{w: acc for w in NARROW}},  # noqa: E731
                       "train_wall_s": {"dense": 1.0, "nested": 2.0, "augmentation": 0.0}}
    text = report([{"dataset": "MR2k", "seed": 1, "runs": {"a": run(70.0), "b": run(75.0)}}])
    assert "## MR2k, seed 1" in text and "| widths 0.4 and below, mean | 70.00 | 75.00 |" in text
    assert all(f"| {name} |" in text for name in SYSTEMS)
