"""The ``wordpiece`` BPE: BERT's tokenizer through the ``tokenizers`` library, from a
tokenizer.json, a vocab.txt or their folder, without padding or truncation."""

import json
from argparse import Namespace

import pytest

from budget_plugin.encoders import WordPieceBPE
from budget_plugin.models.hub_interface import tokenizer_options

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
