"""The vocabulary of a prepared task: a sentencepiece model, and fairseq dictionaries
whose ids coincide with the sentencepiece ids."""

import os
import re
from collections import Counter
from pathlib import Path
from typing import Callable, List, Sequence, Tuple

from .errors import DataError

# fairseq's Dictionary always starts with these four symbols (ids 0-3).
FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
SPM_MODEL_NAME = "sentencepiece.bpe.model"  # the name fairseq's RoBERTa/XLM-R releases use


def train_sentencepiece(
    text_path: Path, model_prefix: Path, vocab_size: int, model_type: str, log: Callable[[str], None]
) -> None:
    """Train a sentencepiece model; falls back to a soft vocabulary limit on too little text."""
    import sentencepiece as spm

    options = dict(
        input=str(text_path),
        model_prefix=str(model_prefix),
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=1.0,  # sentencepiece's advice for small alphabets such as English
        # Give the control symbols fairseq's ids, so sentencepiece ids and dictionary ids coincide.
        bos_id=0,
        pad_id=1,
        eos_id=2,
        unk_id=3,
        num_threads=os.cpu_count() or 1,
        minloglevel=2,  # keep the trainer's very chatty log quiet
    )
    try:
        spm.SentencePieceTrainer.train(**options)
    except RuntimeError as e:
        if "vocab" not in str(e).lower():
            raise DataError(f"sentencepiece training failed on {text_path}: {e}") from None
        # Small data sets cannot fill the requested vocabulary; let sentencepiece stop early.
        limit = re.search(r"value <= (\d+)", str(e))
        room = f" (room for {limit.group(1)})" if limit else ""
        log(f"too little text for {vocab_size} pieces{room}; retrying with hard_vocab_limit=False")
        try:
            spm.SentencePieceTrainer.train(**options, hard_vocab_limit=False)
        except RuntimeError as e2:
            raise DataError(f"sentencepiece training failed even with a soft vocabulary limit: {e2}") from None


def load_sentencepiece(path: Path):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor()
    try:
        sp.Load(str(path))
    except (OSError, RuntimeError) as e:
        raise DataError(f"{path}: not a sentencepiece model ({e})") from None
    return sp


def write_vocab_file(sp, path: Path) -> None:
    """The `.vocab` companion file sentencepiece writes when training: piece<TAB>score."""
    with open(path, "w", encoding="utf-8") as f:
        for i in range(sp.GetPieceSize()):
            f.write(f"{sp.IdToPiece(i)}\t{sp.GetScore(i):g}\n")


def write_source_dict(sp, path: Path) -> List[str]:
    """Write fairseq's dict.txt from the sentencepiece vocabulary and return its pieces.

    Every piece but the control symbols and <unk> (fairseq's Dictionary has its own four) is
    listed in sentencepiece order with a dummy count, so any text that fairseq's sentencepiece
    BPE produces later maps to the same ids as the preprocessed data.
    """
    pieces = []
    for i in range(sp.GetPieceSize()):
        if sp.IsControl(i) or sp.IsUnknown(i):
            continue
        piece = sp.IdToPiece(i)
        if piece in FAIRSEQ_SPECIALS:
            continue
        if any(c.isspace() for c in piece):
            # fairseq splits lines on whitespace, so such a piece could never be looked up.
            raise DataError(f"sentencepiece piece {i} ({piece!r}) contains whitespace; fairseq cannot use it")
        pieces.append(piece)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"{p} 1\n" for p in pieces)
    return pieces


def label_order(labels: Sequence[str]) -> List[Tuple[str, int]]:
    """Labels with counts in the order fairseq-preprocess would give them (count desc, then name).

    Keeping fairseq's order means class indices match what its own GLUE recipe produces.
    """
    return sorted(Counter(labels).items(), key=lambda kv: (-kv[1], kv[0]))
