"""The ``wordpiece`` BPE: BERT's tokenizer through the ``tokenizers`` library, from a
tokenizer.json, a vocab.txt or their folder, without padding or truncation; and a pair
task prepared with a pretrained model's WordPiece vocabulary: it trains and validates
end to end from the converted model, and the hub interface's encode() and
scripts/predict.py tokenize raw text exactly as the prepared data was tokenized."""

import json
import sys
from argparse import Namespace

import pytest
import torch

from budget_plugin import BudgetFormerModel
from budget_plugin.encoders import WordPieceBPE
from budget_plugin.models.hub_interface import tokenizer_options
from helpers import PAIRS, REPO, pair_task_training, run, wordpiece_pair_task

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "good", "film", "cafe", "de", "##ja", "vu", ",",
         "!", "un", "##bel", "##ie", "##va", "##bly", "the", "x", "##q"]


@pytest.fixture
def vocab_txt(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return path


@pytest.fixture
def tokenizer_json(tmp_path, vocab_txt):
    """The tokenizer.json of the same vocabulary, padding and truncating like MiniLM's."""
    from budget_plugin.encoders import load_wordpiece

    tokenizer = load_wordpiece(vocab_txt)
    tokenizer.enable_padding(length=16, pad_token="[PAD]")
    tokenizer.enable_truncation(max_length=16)
    folder = tmp_path / "json"
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


TEXTS = {
    "Café déjà vu, a GOOD film!": "cafe de ##ja vu , a good film !",
    "unbelievably good": "un ##bel ##ie ##va ##bly good",
    "xq zzz 漢": "x ##q [UNK] [UNK]",  # unknown words and characters
    " ".join(["the film"] * 20): " ".join(["the film"] * 20),  # long: never truncated here
}


@pytest.mark.parametrize("source", ["vocab_txt", "tokenizer_json", "folder"])
def test_encode_splits_as_bert_does_and_never_pads_or_truncates(source, request, tmp_path):
    path = {"vocab_txt": lambda: request.getfixturevalue("vocab_txt"),
            "tokenizer_json": lambda: request.getfixturevalue("tokenizer_json"),
            "folder": lambda: request.getfixturevalue("tokenizer_json").parent}[source]()
    bpe = WordPieceBPE(Namespace(wordpiece_vocab=str(path)))
    for text, pieces in TEXTS.items():
        assert bpe.encode(text) == pieces
    assert bpe.decode("un ##bel ##ie ##va ##bly good film") == "unbelievably good film"
    assert bpe.is_beginning_of_word("good") and not bpe.is_beginning_of_word("##ja")


def test_vocab_txt_follows_do_lower_case(vocab_txt):
    (vocab_txt.parent / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    assert WordPieceBPE(Namespace(wordpiece_vocab=str(vocab_txt))).encode("GOOD good") == "[UNK] good"


def test_bad_vocabularies_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such WordPiece vocabulary"):
        WordPieceBPE(Namespace(wordpiece_vocab=str(tmp_path / "missing.txt")))
    with pytest.raises(FileNotFoundError, match="no tokenizer.json or vocab.txt in this folder"):
        WordPieceBPE(Namespace(wordpiece_vocab=str(tmp_path)))
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="tokenizer.json: not a tokenizers tokenizer.json"):
        WordPieceBPE(Namespace(wordpiece_vocab=str(bad)))


def test_from_pretrained_finds_the_tokenizer_or_says_what_to_pass(tmp_path, vocab_txt):
    data, checkpoints = tmp_path / "data", tmp_path / "ckpt"
    data.mkdir(), checkpoints.mkdir()
    assert tokenizer_options([data, checkpoints], None, {}) == {}  # the checkpoint's own --bpe
    (data / "vocab.txt").write_text(vocab_txt.read_text())
    assert tokenizer_options([data, checkpoints], None, {}) == {"bpe": "wordpiece",
                                                                "wordpiece_vocab": str(data / "vocab.txt")}
    (checkpoints / "sentencepiece.bpe.model").write_bytes(b"")
    with pytest.raises(ValueError, match="pass bpe='sentencepiece' or bpe='wordpiece'"):
        tokenizer_options([data, checkpoints], None, {})
    assert tokenizer_options([data, checkpoints], "sentencepiece", {})["sentencepiece_model"].endswith(
        "ckpt/sentencepiece.bpe.model")
    with pytest.raises(ValueError, match="bpe='sentencepiece' needs sentencepiece_model=PATH"):
        tokenizer_options([data], "sentencepiece", {})


# --------------------------------------------------------------------------------------
# A pair task prepared with WordPiece, end to end (converts, prepares and trains with the
# fairseq tools)
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("wordpiece")
    data, model = wordpiece_pair_task(root)
    save = root / "ckpt"
    return data, save, run(pair_task_training(data, model, save))


@pytest.mark.slow
def test_a_pair_task_prepared_with_wordpiece_trains_and_validates(prepared):
    data, save, output = prepared
    assert "Loaded checkpoint" in output and "| valid on 'valid' subset |" in output
    assert (save / "checkpoint_best.pt").is_file()
    assert (data / "tokenizer.json").is_file() is False and (data / "vocab.txt").is_file()


@pytest.mark.slow
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


@pytest.mark.slow
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
