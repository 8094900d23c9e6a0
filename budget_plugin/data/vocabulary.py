"""The vocabulary of a prepared task: how its text becomes pieces (a sentencepiece model
trained on it, or a pretrained model's WordPiece vocabulary), and the fairseq dictionary
whose ids are the tokenizer's (so that a pretrained model's embedding rows line up)."""

import os
import re
import shutil
from argparse import Namespace
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Sequence, Tuple

from budget_plugin.tools.errors import DataError

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


@dataclass
class TaskVocabulary:
    """How a task's text becomes pieces, and the dictionary they map to."""

    encode: Callable[[str], List[str]]  # raw text -> pieces, exactly as the hub's BPE splits it
    symbols: List[str]  # dict.txt's, in order (fairseq's Dictionary adds its four first)
    source: str  # for the summary
    size: int  # pieces the tokenizer knows


def check_symbols(symbols: Sequence[str], where: str) -> List[str]:
    for i, piece in enumerate(symbols):
        if not piece or any(c.isspace() for c in piece):
            # fairseq splits lines on whitespace, so such a piece could never be looked up.
            raise DataError(f"{where}: piece {i} ({piece!r}) is empty or contains whitespace; fairseq cannot use it")
    return list(symbols)


def sentencepiece_vocabulary(model_path: Path, source: str) -> TaskVocabulary:
    """Every piece but the control symbols and <unk> (fairseq's Dictionary has its own four),
    in sentencepiece order: fairseq ids equal sentencepiece ids."""
    sp = load_sentencepiece(model_path)
    pieces = [sp.IdToPiece(i) for i in range(sp.GetPieceSize()) if not (sp.IsControl(i) or sp.IsUnknown(i))]
    symbols = check_symbols([p for p in pieces if p not in FAIRSEQ_SPECIALS], str(model_path))
    return TaskVocabulary(sp.EncodeAsPieces, symbols, f"sentencepiece {source}", sp.GetPieceSize())


def wordpiece_vocabulary(path: Path, folder: Path) -> TaskVocabulary:
    """A pretrained model's WordPiece vocabulary (tokenizer.json, vocab.txt, or
    budget-convert's output folder), copied into ``folder`` so that
    ``from_pretrained`` finds it next to the data. Its dict.txt: the vocabulary in id
    order less BERT's four specials, which is the converter's dict.txt (checked when the
    folder holds one)."""
    from budget_plugin.encoders.wordpiece import WordPieceBPE, fairseq_symbols, tokenizer_file, vocabulary

    try:
        source = tokenizer_file(path)
        bpe = WordPieceBPE(Namespace(wordpiece_vocab=str(source)))
    except Exception as e:  # tokenizers raises a plain Exception for a file it cannot parse
        raise DataError(f"--wordpiece {path}: {e}") from None
    tokens = vocabulary(bpe.tokenizer)
    symbols = check_symbols(fairseq_symbols(tokens), str(source))
    converted = Path(path) / "dict.txt"
    if converted.is_file():
        listed = [line.rsplit(" ", 1)[0] for line in converted.read_text(encoding="utf-8").splitlines()]
        if listed != symbols:
            raise DataError(f"{converted}: does not list {source.name}'s tokens in order (another model's?)")
    for name in (source.name, "tokenizer_config.json"):
        if (source.parent / name).is_file():
            shutil.copyfile(source.parent / name, folder / name)
    return TaskVocabulary(lambda text: bpe.encode(text).split(), symbols, f"wordpiece from {source}", len(tokens))


def write_source_dict(vocab: TaskVocabulary, path: Path) -> None:
    """fairseq's dict.txt: the symbols in order, with dummy counts."""
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"{p} 1\n" for p in vocab.symbols)


def label_order(labels: Sequence[str]) -> List[Tuple[str, int]]:
    """Labels with counts in the order fairseq-preprocess would give them (count desc, then name).

    Keeping fairseq's order means class indices match what its own GLUE recipe produces.
    """
    return sorted(Counter(labels).items(), key=lambda kv: (-kv[1], kv[0]))
