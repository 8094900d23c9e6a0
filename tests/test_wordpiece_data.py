"""A pair task prepared with a pretrained model's WordPiece vocabulary: it trains and
validates end to end from the converted model, and the hub interface's encode() and
scripts/predict.py tokenize raw text exactly as the prepared data was tokenized."""

import sys

import pytest
import torch

from budget_plugin import BudgetFormerModel
from conftest import PAIRS, REPO, pair_task_training, run, wordpiece_pair_task

pytestmark = pytest.mark.slow  # converts, prepares and trains with the fairseq tools


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("wordpiece")
    data, model = wordpiece_pair_task(root)
    save = root / "ckpt"
    return data, save, run(pair_task_training(data, model, save))


def test_a_pair_task_prepared_with_wordpiece_trains_and_validates(prepared):
    data, save, output = prepared
    assert "Loaded checkpoint" in output and "| valid on 'valid' subset |" in output
    assert (save / "checkpoint_best.pt").is_file()
    assert (data / "tokenizer.json").is_file() is False and (data / "vocab.txt").is_file()


def test_hub_encode_equals_the_prepared_tokens(prepared):
    data, save, _ = prepared
    hub = BudgetFormerModel.from_pretrained(str(save), "checkpoint_best.pt", str(data))
    assert type(hub.bpe).__name__ == "WordPieceBPE"  # found next to the data
    hub.task.load_dataset("valid")
    dataset = hub.task.dataset("valid")
    for i, (a, b) in enumerate(PAIRS):
        prepared_tokens = dataset[i]["net_input.src_tokens"]
        assert torch.equal(hub.encode(a, b), prepared_tokens), (a, b, hub.decode(prepared_tokens))
        assert (prepared_tokens == 3).any() == (i in (1, 3))  # unknown words and characters: <unk>
    assert hub.decode(hub.encode("Café déjà vu!")) == "cafe deja vu!"


def test_predict_script_scores_what_the_prepared_data_holds(prepared, tmp_path):
    data, save, _ = prepared
    texts = tmp_path / "pairs.txt"
    texts.write_text("".join(f"{a}\t{b}\n" for a, b in PAIRS), encoding="utf-8")
    out = tmp_path / "preds.tsv"
    run([sys.executable, REPO / "scripts" / "predict.py", "--checkpoint-dir", save, "--data", data,
         "--input", texts, "--output", out, "--batch-size", 1])
    rows = [row.split("\t") for row in out.read_text().splitlines()[1:]]
    hub = BudgetFormerModel.from_pretrained(str(save), "checkpoint_best.pt", str(data))
    hub.task.load_dataset("valid")
    dataset = hub.task.dataset("valid")
    for i, row in enumerate(rows):
        with torch.no_grad():
            probs = hub.predict("sentence_classification_head", dataset[i]["net_input.src_tokens"]).exp()[0]
        label = hub.task.label_dictionary.string([probs.argmax().item() + hub.task.label_dictionary.nspecial])
        assert row[1] == label and float(row[2]) == pytest.approx(probs.max().item(), abs=1e-4)
