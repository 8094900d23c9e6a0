"""An ONNX export of a BudgetFormer (budget-export-onnx's folder) as a classifier that
needs only ``onnxruntime``, ``tokenizers`` and ``numpy``: texts in, labels and scores
out.

    from budget_serve import Predictor

    predictor = Predictor("exported/", int8=True)
    predictor.predict(["a gripping film", "a tedious film"])
    # [Prediction(label='pos', score=0.97, scores={'pos': 0.97, 'neg': 0.03}), ...]

The folder holds ``manifest.json`` (manifest.py), ``model.onnx`` (fp32),
``model.int8.onnx`` (with --int8), ``tokenizer.json`` and ``vocabulary.json``
(encoding.py)."""

from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from .encoding import Encoder
from .errors import DataError
from .manifest import check_runtime, read_manifest
from .texts import input_texts

Text = Union[str, Tuple[str, str], List[str]]  # one text, or a pair


class Prediction(NamedTuple):
    label: Optional[str]  # the most probable label (None: a regression model)
    score: float  # that label's probability, or the regression model's value
    scores: Dict[str, float]  # label -> probability, most probable first (top_k of them); {} for regression


# ONNX Runtime's CPU kernel for SkipLayerNormalization, which its SkipLayerNormFusion
# makes of every residual Add + LayerNormalization, ran 4-8x slower than the two ops it
# replaces (onnxruntime 1.32, 800 x 384: 0.98 against 0.22 ms on 2 threads), a tenth of
# the whole graph's time: on the CPU alone the fusion is left out (results/serving/)
SLOWER_ON_CPU = ["SkipLayerNormFusion"]


def session(path: Path, threads: Optional[int] = None, providers: Optional[Sequence] = None, options=None):
    """An ONNX Runtime session with every graph optimization but those slower on the CPU
    (``options``: the caller's SessionOptions instead, threads included), on ``threads``
    intra-op threads (default: ONNX Runtime's choice) and ``providers`` (default: the
    CPU). A file that is not a graph ONNX Runtime loads is refused naming it."""
    import onnxruntime

    providers = list(providers or ["CPUExecutionProvider"])
    if options is not None and threads:
        # setting them here would change the caller's object, which it may share
        raise ValueError("threads or session options, not both: set intra_op_num_threads on the SessionOptions")
    if options is None:
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    on_cpu = all((p if isinstance(p, str) else p[0]) == "CPUExecutionProvider" for p in providers)
    try:
        return onnxruntime.InferenceSession(str(path), options, providers=providers,
                                            disabled_optimizers=SLOWER_ON_CPU if on_cpu else None)
    except Exception as error:  # onnxruntime's load errors have no common type
        raise DataError(f"{path}: not a model this onnxruntime loads ({str(error).splitlines()[0]})") from None


class Predictor:
    """``folder``'s model (its int8 copy with ``int8``) on ONNX Runtime: the CPU with
    every graph optimization unless ``providers`` (e.g. ``["CUDAExecutionProvider"]``)
    or ``session_options`` (an ``onnxruntime.SessionOptions``, which then set the
    threads too) say otherwise, on ``threads`` threads. One predictor serves several
    threads at once: a call keeps nothing on it."""

    def __init__(self, folder, int8: bool = False, threads: Optional[int] = None,
                 providers: Optional[Sequence] = None, session_options=None):
        import onnxruntime

        folder = Path(folder)
        self.manifest = manifest = read_manifest(folder)
        kind = "int8" if int8 else "fp32"
        if kind not in manifest["files"]:
            raise DataError(f"{folder}: no {kind} model (export it with budget-export-onnx --int8)")
        for name in ("tokenizer.json", "vocabulary.json", manifest["files"][kind]):
            if not (folder / name).is_file():
                raise DataError(f"{folder}: no {name} (the export is incomplete: export it again)")
        check_runtime(manifest, folder / manifest["files"][kind], onnxruntime.__version__)
        self.encoder = Encoder(folder, manifest)
        self.regression = manifest["task"] == "regression"
        self.inputs: Optional[int] = manifest["inputs"]  # None: not recorded (an older export)
        self.labels: List[str] = manifest["labels"]
        self.max_positions: int = manifest["max_positions"]
        self.session = session(folder / manifest["files"][kind], threads, providers, session_options)

    def encode(self, text: str, pair: Optional[str] = None) -> List[int]:
        """The model's ids of a text, or a pair, as training saw them (cut as trained)."""
        return self.encoder.encode(text, pair)

    def logits(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        """The model's outputs (B x classes, or B x 1 for regression) for encoded examples,
        padded here."""
        tokens = np.full((len(batch), max(map(len, batch))), self.encoder.pad, dtype=np.int64)
        for row, ids in zip(tokens, batch):
            row[: len(ids)] = ids
        return self.session.run(None, {"tokens": tokens})[0]

    def outputs(self, encoded: Sequence[Sequence[int]], batch_size: int = 32) -> np.ndarray:
        """Class probabilities (N x classes; regression: the values, N x 1) of encoded
        examples, batched by length (the longest first, so that little padding is
        computed), in the examples' order. The int8 model quantizes activations per
        batch, so an example's output can move slightly with the examples batched
        beside it; fp32's does not."""
        order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
        found = np.zeros((len(encoded), 1 if self.regression else len(self.labels)), dtype=np.float64)
        for start in range(0, len(order), batch_size):
            chosen = order[start:start + batch_size]
            z = self.logits([encoded[i] for i in chosen]).astype(np.float64)
            if not self.regression:
                z = np.exp(z - z.max(axis=1, keepdims=True))
                z = z / z.sum(axis=1, keepdims=True)
            found[chosen] = z
        return found

    def predict(self, texts: Union[Text, Sequence[Text]], top_k: Optional[int] = None,
                batch_size: int = 32) -> List[Prediction]:
        """One :class:`Prediction` per input: ``texts`` is a list of texts, or of pairs
        (a tuple or list of two texts), or one text. ``top_k``: keep that many labels'
        probabilities in ``scores`` (default: every label's)."""
        items = [texts] if isinstance(texts, str) else list(texts)
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        encoded = [self.encode(*input_texts(item, self.inputs, f"input {number}"))
                   for number, item in enumerate(items, 1)]
        return [self.prediction(row, top_k) for row in self.outputs(encoded, batch_size)] if encoded else []

    __call__ = predict

    def prediction(self, row: np.ndarray, top_k: Optional[int]) -> Prediction:
        if self.regression:
            return Prediction(None, float(row[0]), {})
        order = np.argsort(-row, kind="stable")[:top_k]
        scores = {self.labels[i]: float(row[i]) for i in order}
        return Prediction(self.labels[order[0]], float(row[order[0]]), scores)
