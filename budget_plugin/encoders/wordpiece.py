"""WordPiece, the tokenizer of BERT-family models, as a fairseq BPE (``--bpe wordpiece
--wordpiece-vocab PATH``), so that preparation, the hub interface's ``encode()`` and
budget-predict split raw text exactly as the pretrained model's own tokenizer does.

It uses the Hugging Face ``tokenizers`` library (the reference implementation of BERT's
normalisation: lower-casing, accent stripping, Chinese characters, punctuation) rather
than a re-implementation."""

import json
from dataclasses import dataclass, field
from pathlib import Path

from fairseq.data.encoders import register_bpe
from fairseq.dataclass import FairseqDataclass

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")  # in order of preference
# BERT's specials that become fairseq's <s> <pad> </s> <unk> (ids 0-3)
SPECIALS = ("[CLS]", "[PAD]", "[SEP]", "[UNK]")


def fairseq_symbols(vocab):
    """dict.txt's symbols for a WordPiece vocabulary (in id order): every token but
    :data:`SPECIALS`, in order, so fairseq's id of token t is 4 + its place here."""
    return [t for t in vocab if t not in SPECIALS]


@dataclass
class WordPieceConfig(FairseqDataclass):
    wordpiece_vocab: str = field(
        default="???",
        metadata={
            "help": "the model's tokenizer.json (its normalisation included), its "
            "vocab.txt (lower-cased unless a tokenizer_config.json beside it says "
            "do_lower_case false), or a folder holding one (budget-convert's output)"
        },
    )


def tokenizer_file(path) -> Path:
    """``path`` itself, or the tokenizer file found in the folder ``path``."""
    path = Path(path)
    if path.is_dir():
        for name in TOKENIZER_FILES:
            if (path / name).is_file():
                return path / name
        raise FileNotFoundError(f"{path}: no {' or '.join(TOKENIZER_FILES)} in this folder")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such WordPiece vocabulary")
    return path


def vocabulary(tokenizer):
    """The tokenizer's tokens in id order."""
    by_id = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return [token for token, _ in by_id]


def load_wordpiece(path):
    """A ``tokenizers.Tokenizer`` from a tokenizer.json, a vocab.txt or their folder."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import WordPiece

    path = tokenizer_file(path)
    if path.suffix == ".json":
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as error:  # tokenizers raises plain Exceptions
            raise ValueError(f"{path}: not a tokenizers tokenizer.json ({error})") from None
        if type(tokenizer.model).__name__ != "WordPiece":
            raise ValueError(f"{path}: model.type is {type(tokenizer.model).__name__}, not WordPiece")
        # a tokenizer.json may pad and truncate (MiniLM's to 128): lengths are the
        # task's business (--max-positions, --shorten-method), as for any fairseq BPE
        tokenizer.no_padding()
        tokenizer.no_truncation()
        return tokenizer
    config = path.with_name("tokenizer_config.json")
    lowercase = json.loads(config.read_text()).get("do_lower_case", True) if config.is_file() else True
    tokenizer = Tokenizer(WordPiece.from_file(str(path), unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


@register_bpe("wordpiece", dataclass=WordPieceConfig)
class WordPieceBPE:
    def __init__(self, cfg):
        self.tokenizer = load_wordpiece(cfg.wordpiece_vocab)

    def encode(self, x: str) -> str:
        """Raw text -> space-separated pieces (no [CLS]/[SEP]: the task adds <s> and </s>)."""
        return " ".join(self.tokenizer.encode(x, add_special_tokens=False).tokens)

    def decode(self, x: str) -> str:
        return self.tokenizer.decoder.decode(x.split())

    def is_beginning_of_word(self, x: str) -> bool:
        return not x.startswith("##")
