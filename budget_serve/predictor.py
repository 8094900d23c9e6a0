"""An ONNX export of a BudgetFormer (budget-export-onnx's folder) as a classifier that
needs only ``onnxruntime``, ``tokenizers`` and ``numpy``: text in, labels and
probabilities out, tokenized as the training data was (the data's WordPiece tokenizer
and fairseq's ids: <s> text </s>, or <s> a </s> </s> b </s> for a pair).

The folder holds ``manifest.json`` (the setting, heads and FFN neurons per layer, the
labels, the source checkpoint's hash, dev accuracy), ``model.onnx`` (fp32),
``model.int8.onnx`` (with --int8), ``tokenizer.json`` and ``vocabulary.json`` (each
WordPiece piece's id in the fairseq dictionary the model was trained with)."""

import json
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np

from budget_serve.errors import DataError

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
MANIFEST_KEYS = ("files", "special", "labels", "max_positions", "heads")


def read_manifest(folder: Path) -> dict:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise DataError(f"--onnx {folder}: no {MANIFEST} (not a budget-export-onnx folder)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataError(f"{path}: not a manifest ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise DataError(f"{path}: format {found!r}; this predictor reads format {MANIFEST_FORMAT}")
    missing = [key for key in MANIFEST_KEYS if key not in manifest]
    if missing:
        raise DataError(f"{path}: no {', '.join(missing)} (written by another version, or edited)")
    return manifest


def session(path: Path, threads: Optional[int] = None):
    """An ONNX Runtime session on the CPU with every graph optimization, on ``threads``
    threads (default: ONNX Runtime's choice)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class Predictor:
    """``folder``'s model on ONNX Runtime's CPU provider (all graph optimizations), its
    int8 copy with ``int8``, on ``threads`` threads (default: ONNX Runtime's)."""

    def __init__(self, folder, int8: bool = False, threads: Optional[int] = None):
        from tokenizers import Tokenizer

        folder = Path(folder)
        self.manifest = manifest = read_manifest(folder)
        kind = "int8" if int8 else "fp32"
        if kind not in manifest["files"]:
            raise DataError(f"{folder}: no {kind} model (export it with budget-export-onnx --int8)")
        for name in ("tokenizer.json", "vocabulary.json", manifest["files"][kind]):
            if not (folder / name).is_file():
                raise DataError(f"{folder}: no {name} (the export is incomplete: export it again)")
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()  # lengths are the predictor's business, as for the training data
        self.tokenizer.no_truncation()
        self.ids = json.loads((folder / "vocabulary.json").read_text(encoding="utf-8"))
        special = manifest["special"]
        self.bos, self.pad, self.eos, self.unk = (special[k] for k in ("bos", "pad", "eos", "unk"))
        self.labels: List[str] = manifest["labels"]
        self.max_positions: int = manifest["max_positions"]
        self.session = session(folder / manifest["files"][kind], threads)

    def pieces(self, text: str) -> List[int]:
        return [self.ids.get(piece, self.unk) for piece in self.tokenizer.encode(text, add_special_tokens=False).tokens]

    def encode(self, text: str, pair: Optional[str] = None) -> List[int]:
        """fairseq's ids of a text, or a pair, as the hub's ``encode`` gives them."""
        ids = [self.bos, *self.pieces(text), self.eos]
        if pair is not None:
            ids += [self.eos, *self.pieces(pair), self.eos]
        return ids

    def logits(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        """The classifier's logits (B x classes) for encoded examples, padded here."""
        longest = max(map(len, batch))
        if longest > self.max_positions:
            raise ValueError(f"an example of {longest} pieces, over the model's {self.max_positions}: cut it first "
                             "(budget-predict's --too-long)")
        tokens = np.full((len(batch), max(map(len, batch))), self.pad, dtype=np.int64)
        for row, ids in zip(tokens, batch):
            row[: len(ids)] = ids
        return self.session.run(None, {"tokens": tokens})[0]

    def probabilities(self, encoded: Sequence[Sequence[int]], batch_size: int = 32) -> np.ndarray:
        """Class probabilities (N x classes) of encoded examples, batched by length (the
        longest first, so that little padding is computed), in the examples' order. The
        int8 model quantizes activations per batch, so its probabilities for an example
        can move slightly with the examples batched beside it; fp32's do not."""
        order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
        probs = np.zeros((len(encoded), len(self.labels)), dtype=np.float64)
        for start in range(0, len(order), batch_size):
            chosen = order[start:start + batch_size]
            z = self.logits([encoded[i] for i in chosen]).astype(np.float64)
            z = np.exp(z - z.max(axis=1, keepdims=True))
            probs[chosen] = z / z.sum(axis=1, keepdims=True)
        return probs
