"""Text to the model's ids, as the training data was made: the data's WordPiece pieces
mapped to fairseq's ids, each input cut to its first pieces where budget-prepare cut it
(``--truncate-tokens``), ``<s> a </s>`` or ``<s> a </s> </s> b </s>``, and the whole cut
to the model's positions as fairseq's ``--shorten-method truncate`` cut it in training
(the end goes, a closing ``</s>`` included)."""

import json
from pathlib import Path
from typing import List, Optional

from .errors import DataError


class Encoder:
    def __init__(self, folder: Path, manifest: dict):
        from tokenizers import Tokenizer

        path = folder / "tokenizer.json"
        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as error:  # tokenizers raises a bare Exception for a file it cannot parse
            raise DataError(f"{path}: not a tokenizer ({str(error).splitlines()[0]})") from None
        self.tokenizer.no_padding()  # lengths are the encoder's business, as for the training data
        self.tokenizer.no_truncation()
        path = folder / "vocabulary.json"
        try:
            self.ids = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise DataError(f"{path}: not a vocabulary ({error})") from None
        if not isinstance(self.ids, dict):
            raise DataError(f"{path}: not a vocabulary (a JSON object of piece -> id)")
        special = manifest["special"]
        self.bos, self.pad, self.eos, self.unk = (special[k] for k in ("bos", "pad", "eos", "unk"))
        self.pieces_per_input: Optional[int] = manifest["truncation"].get("pieces_per_input")
        self.max_positions: int = manifest["max_positions"]

    def pieces(self, text: str) -> List[int]:
        """One input's ids, cut where the training data's inputs were cut."""
        pieces = self.tokenizer.encode(text, add_special_tokens=False).tokens[:self.pieces_per_input]
        return [self.ids.get(piece, self.unk) for piece in pieces]

    def encode(self, text: str, pair: Optional[str] = None, cut: bool = True) -> List[int]:
        """The model's ids of a text, or a pair, as training saw them (``cut=False``: not
        yet cut to the model's positions, for a caller that reports the cut)."""
        ids = [self.bos, *self.pieces(text), self.eos]
        if pair is not None:
            ids += [self.eos, *self.pieces(pair), self.eos]
        return ids[:self.max_positions] if cut else ids
