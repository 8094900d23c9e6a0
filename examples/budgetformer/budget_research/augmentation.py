"""Training data augmented for a small data set and labelled by the dense teacher (issue
51, point 3; TinyBERT's data augmentation, Jiao et al. 2020, section 3.1). Each training
text gets ``copies`` variants in which every single-piece word is, with probability
``p``, replaced by one of its ``k`` nearest words in the dense model's own input
embeddings (cosine): TinyBERT replaces such words with a BERT's masked-language-model
guesses and longer words with GloVe's neighbours; here the encoder's embedding table
stands for both, so that no other model is needed. Words of several pieces are kept. The
variants are labelled by the dense step's model (its predicted class); the original
texts keep their labels. The result is a binarized data folder like the input's: the
same dictionaries, dev and test; only train grows."""

import shutil
from pathlib import Path
from typing import Callable, List

import torch
from fairseq.data import Dictionary, indexed_dataset

from budget_plugin.tools.checkpoints import read
from budget_plugin.tools.files import building_dir
from budget_plugin.tools.teacher import teacher_logits


def replaceable(dictionary: Dictionary) -> torch.Tensor:
    """Which pieces are whole lower-case English words (a replacement must be one too)."""
    return torch.tensor([symbol.isascii() and symbol.isalpha() and symbol.islower() for symbol in dictionary.symbols])


def neighbours(embeddings: torch.Tensor, words: torch.Tensor, wanted: torch.Tensor, k: int) -> torch.Tensor:
    """len(wanted) x k: for each piece id of ``wanted``, the ids of its k nearest other
    ``words`` by cosine between rows of ``embeddings``."""
    unit = torch.nn.functional.normalize(embeddings.float(), dim=-1)
    candidates = words.nonzero().squeeze(1)
    similarity = unit[wanted] @ unit[candidates].T
    similarity[wanted.unsqueeze(1) == candidates.unsqueeze(0)] = -2.0  # never the word itself
    return candidates[similarity.topk(k, dim=-1).indices]


def variants(text: torch.Tensor, single: torch.Tensor, near: torch.Tensor, copies: int, p: float,
             generator: torch.Generator) -> List[torch.Tensor]:
    """``copies`` versions of ``text`` (piece ids, ending in </s>) with each position where
    ``single`` holds replaced, with probability ``p``, by a random one of ``near``'s row."""
    found = []
    for _ in range(copies):
        swap = single & (torch.rand(len(text), generator=generator) < p)
        choice = torch.randint(near.size(1), (len(text),), generator=generator)
        copy = text.clone()
        copy[swap] = near[text[swap], choice[swap]]
        found.append(copy)
    return found


def single_piece_words(text: torch.Tensor, words: torch.Tensor, continuations: torch.Tensor) -> torch.Tensor:
    """Positions of ``text`` holding a whole word of one piece (the next is no '##' piece)."""
    continued = torch.cat([continuations[text[1:]], torch.zeros(1, dtype=torch.bool)])
    return words[text] & ~continued


def write_split(prefix: Path, items: List[torch.Tensor], vocab_size: int) -> None:
    builder = indexed_dataset.make_builder(str(prefix) + ".bin", impl="mmap", vocab_size=vocab_size)
    for item in items:
        builder.add_item(item)
    builder.finalize(str(prefix) + ".idx")


def augment(data: Path, teacher: Path, out: Path, copies: int = 4, p: float = 0.4, k: int = 15, seed: int = 1,
            log: Callable[[str], None] = print) -> Path:
    """``data`` (a binarized folder) with ``copies`` teacher-labelled variants of each
    training text, into ``out`` (made once: a second call finds it)."""
    if (out / "label" / "train.idx").is_file():
        return out
    source = Dictionary.load(str(data / "input0" / "dict.txt"))
    labels = Dictionary.load(str(data / "label" / "dict.txt"))
    texts = indexed_dataset.make_dataset(str(data / "input0" / "train"), impl="mmap")
    targets = indexed_dataset.make_dataset(str(data / "label" / "train"), impl="mmap")
    embeddings = read(teacher)["model"]["encoder.sentence_encoder.embed_tokens.weight"]
    words = torch.zeros(len(embeddings), dtype=torch.bool)
    words[:len(source)] = replaceable(source)
    continuations = torch.zeros(len(embeddings), dtype=torch.bool)
    continuations[:len(source)] = torch.tensor([symbol.startswith("##") for symbol in source.symbols])
    originals = [texts[i].long() for i in range(len(texts))]
    used = torch.cat(originals).unique()
    used = used[words[used]]
    near = torch.zeros(len(embeddings), k, dtype=torch.long)
    near[used] = neighbours(embeddings, words, used, k)
    generator = torch.Generator().manual_seed(seed)
    augmented = [v for text in originals
                 for v in variants(text, single_piece_words(text, words, continuations), near, copies, p, generator)]
    log(f"augmentation: {len(augmented)} variants of {len(originals)} training texts ({copies} each, a word "
        f"replaced with probability {p} by one of its {k} nearest in the embeddings)")
    with building_dir(out) as tmp:
        for folder in ("input0", "label"):
            shutil.copytree(data / folder, tmp / folder, ignore=shutil.ignore_patterns("train.*"))
        for name in ("prepared.json", "tokenizer.json", "tokenizer_config.json"):
            if (data / name).is_file():
                shutil.copyfile(data / name, tmp / name)
        # first the variants with placeholder labels, so that the teacher reads them as fairseq does
        write_split(tmp / "input0" / "train", [t.int() for t in augmented], len(source))
        placeholder = [targets[0]] * len(augmented)
        write_split(tmp / "label" / "train", placeholder, len(labels))
        predicted = teacher_logits(teacher, tmp, "train").argmax(-1) + labels.nspecial
        log(f"augmentation: labelled by {teacher}")
        write_split(tmp / "input0" / "train", [t.int() for t in originals + augmented], len(source))
        write_split(tmp / "label" / "train", [targets[i] for i in range(len(targets))] +
                    [torch.tensor([int(c), labels.eos()], dtype=targets[0].dtype) for c in predicted], len(labels))
    return out
