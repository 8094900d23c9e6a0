"""A fine-tuned model at one dial setting as an ONNX Runtime folder that budget_serve's
predictor serves without torch or fairseq.

The route: the checkpoint cut physically at the setting (nested/export.py: each layer
keeps its first heads and FFN neurons), loaded as the fairseq model it is, copied into a
plain module (plain_model.py), and that module exported with torch's own exporter
(``torch.onnx.export``, torch.export-based, opset 18, dynamic batch and length). The
plain module, not fairseq's encoder, is exported because the encoder's inference path
(the router, lazy statistics, fairseq's fused attention call, ``None`` arguments) is
not a graph an exporter should have to trace; the plain module is checked equal to it
on the data's dev split before anything is written. ``int8`` adds ONNX Runtime's
dynamic quantization of the fp32 graph (int8 weights, activations quantized per
batch), the route the runtime documents for transformers on CPU.

Everything is written into a temporary folder that becomes OUT_DIR only when complete."""

import contextlib
import hashlib
import io
import logging
import sys
import warnings
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

import torch

from budget_plugin.data.prepare import prepared_record
from budget_plugin.encoders.wordpiece import load_wordpiece, tokenizer_file
from budget_plugin.modules.flops import attention_flops, ffn_flops
from budget_plugin.nested.export import chosen_cut, pruned_checkpoint
from budget_plugin.serving.plain_model import PlainClassifier
from budget_plugin.tools.checkpoints import as_budgetformer, load_checkpoint, model_options, read
from budget_plugin.tools.errors import DataError
from budget_plugin.tools.evaluation import label_names, split_batches, tokens
from budget_plugin.tools.files import building_dir, write_json
from budget_serve.manifest import MANIFEST, MANIFEST_FORMAT, runtime_requirements
from budget_serve.predictor import session

OPSET = 18
HEAD = "sentence_classification_head"
# ONNX Runtime's fp32 logits against fairseq's: float32 rounding of the same operations
# in another order; anything larger is a wrong graph, which is not written
TOLERANCE = 1e-3


class ExportError(Exception):
    """The graph does not compute what fairseq computes (a bug, not the user's input): exit 1."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def layers_flops_ratio(heads: Sequence[int], neurons: Sequence[int], args, length: float) -> float:
    """The encoder layers' FLOPs at ``heads`` and ``neurons`` per layer against the full
    model's, on an input of ``length`` pieces (as the model's ``model_flops_ratio``)."""
    T, C, H, F = length, args.encoder_embed_dim, args.encoder_attention_heads, args.encoder_ffn_embed_dim

    def layer(h: int, f: int) -> float:
        return float(attention_flops(T, torch.tensor([h]), C, H, router_outputs=0)[0]) + ffn_flops(T, 1, C, f, F)[0]

    return sum(map(layer, heads, neurons)) / (len(heads) * layer(H, F))


def example_tokens(dictionary) -> torch.Tensor:
    """Two examples to trace with, one padded: a batch and length of at least 2, so that
    the exporter keeps both dimensions dynamic (it fixes a dimension it sees at 1)."""
    words = [dictionary.nspecial + i % (len(dictionary) - dictionary.nspecial) for i in range(6)]
    rows = [[dictionary.bos(), *words, dictionary.eos()], [dictionary.bos(), *words[:3], dictionary.eos()]]
    example = torch.full((2, len(rows[0])), dictionary.pad(), dtype=torch.long)
    for row, ids in zip(example, rows):
        row[: len(ids)] = torch.tensor(ids)
    return example


def export_graph(plain: PlainClassifier, example: torch.Tensor, path: Path) -> None:
    """``plain`` as an ONNX graph at ``path``: input ``tokens`` (int64, batch x length,
    both dynamic), output ``logits``."""
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length", max=plain.max_positions)
    with warnings.catch_warnings(), quiet("torch.onnx"), contextlib.redirect_stdout(io.StringIO()):
        # the exporter's deprecation notices about its own internals, and its progress lines
        warnings.simplefilter("ignore")
        program = torch.onnx.export(plain, (example,), dynamo=True, opset_version=OPSET, input_names=["tokens"],
                                    output_names=["logits"], dynamic_shapes={"tokens": {0: batch, 1: length}},
                                    verbose=False)
    program.save(str(path), external_data=False)


def quantize(fp32: Path, int8: Path) -> None:
    """ONNX Runtime's dynamic quantization: weights int8, one scale per output channel,
    activations quantized per batch at run time. Per channel rather than per tensor: on
    TREC at width 0.5 it kept fp32's dev accuracy (93.51; per tensor 93.14) and ran 0.67x
    fp32 at batch 1 (per tensor 0.72x). Its pre-processing (shape inference, graph
    optimization) changed neither, so it is left out (the quantizer's log that suggests
    it is silenced)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with quiet("root"):
        quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8, per_channel=True)


@contextlib.contextmanager
def quiet(*loggers: str):
    """The named loggers at ERROR for the block: the exporter's notes about packages it
    could register ops for (torchvision) and the quantizer's advice are not the user's."""
    saved = [(logging.getLogger(name), logging.getLogger(name).level) for name in loggers]
    for logger, _ in saved:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in saved:
            logger.setLevel(level)


def compare(reference: Callable[[torch.Tensor], torch.Tensor], batches: Sequence[dict], sessions: Dict[str, object],
            regression: bool = False):
    """Accuracy (regression: mean squared error) of ``reference`` (fairseq) and of each
    ONNX session on ``batches``, and the largest difference of each session's logits
    from the reference's."""
    def score(outputs: torch.Tensor, target: torch.Tensor) -> float:
        if regression:
            return float(((outputs.view(-1) - target.float()) ** 2).sum())
        return float((outputs.argmax(-1) == target).sum())

    found = {name: 0.0 for name in ["fairseq", *sessions]}
    difference = dict.fromkeys(sessions, 0.0)
    total = 0
    for sample in batches:
        target = sample["target"].view(-1)
        with torch.no_grad():
            expected = reference(tokens(sample)).float()
        found["fairseq"] += score(expected, target)
        for name, runtime in sessions.items():
            logits = torch.from_numpy(runtime.run(None, {"tokens": tokens(sample).numpy()})[0])
            found[name] += score(logits, target)
            difference[name] = max(difference[name], float((logits - expected).abs().max()))
        total += target.numel()
    scale = 1.0 if regression else 100.0
    return {name: scale * value / total for name, value in found.items()}, difference


def exportable(state: dict, checkpoint: Path, head_ratio: Optional[str], width: Optional[str], data: Path):
    """The fairseq model to export: a nested checkpoint cut at its setting (whole if none;
    a ratio --head-ratio reads the dial's runs on ``data``), a RoBERTa or an export whole;
    a model that chooses heads per input is refused."""
    args = model_options(state)
    selection = str(getattr(args, "head_selection", "")) if str(getattr(args, "arch", "")).startswith("budget") \
        else "every head"  # a RoBERTa
    if selection not in {"nested", "pruned", "every head"}:
        raise DataError(f"{checkpoint}: a --head-selection {selection} model chooses its heads per input or learns "
                        "a subset, which no fixed graph computes; export a nested checkpoint at a setting, an "
                        "export of one (budget-export), or a RoBERTa")
    if selection != "nested":
        if head_ratio or width:
            raise DataError(f"{checkpoint}: --head-ratio and --width dial a --head-selection nested checkpoint; "
                            "this one exports whole (give neither)")
        return as_budgetformer(state)
    cut = chosen_cut(state, checkpoint, head_ratio, data, width)
    return as_budgetformer(pruned_checkpoint(state, list(cut.heads), list(cut.neurons)))


def export_onnx(checkpoint: Path, data: Path, out_dir: Path, head_ratio: Optional[str] = None,
                width: Optional[str] = None, int8: bool = False, split: str = "valid", batch_size: int = 32,
                log: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> dict:
    """Export ``checkpoint`` (a nested BudgetFormer at ``head_ratio`` or ``width``, else
    whole; a dense RoBERTa or BudgetFormer whole) with ``data``'s tokenizer and labels
    into ``out_dir``; returns the manifest. ``split`` (of ``data``): where equality is
    checked and each file's accuracy taken."""
    try:
        wordpiece = tokenizer_file(data)
    except FileNotFoundError:
        raise DataError(f"--data {data}: no tokenizer.json or vocab.txt (the predictor tokenizes as the data was "
                        "prepared: budget-prepare --wordpiece MODEL writes it there)") from None
    if split not in {"valid", "test"} or not list((data / "input0").glob(f"{split}.*")):
        raise DataError(f"--data {data}: no {split} split to check the export on")
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / MANIFEST).is_file():
        raise DataError(f"{out_dir}: a folder that is not an export (no {MANIFEST}); an export replaces its "
                        "folder whole: give a new or empty one")
    state = read(checkpoint)
    args = model_options(state)
    model = exportable(state, checkpoint, head_ratio, width, data)
    _, task = load_checkpoint(checkpoint, data)
    batches = split_batches(task, batch_size, split)
    try:
        plain = PlainClassifier(model, HEAD)
    except ValueError as error:
        raise DataError(f"{checkpoint}: {error}") from None

    with building_dir(out_dir) as tmp:
        log(f"exporting {checkpoint}: heads per layer {plain.heads}, FFN neurons per layer {plain.neurons}")
        export_graph(plain, example_tokens(task.source_dictionary), tmp / "model.onnx")
        files = {"fp32": "model.onnx"}
        if int8:
            log("quantizing to int8 (ONNX Runtime's dynamic quantization)")
            quantize(tmp / "model.onnx", tmp / "model.int8.onnx")
            files["int8"] = "model.int8.onnx"
        log(f"checking every file against fairseq on {split}")
        regression = bool(task.cfg.regression_target)
        accuracy, difference = compare(lambda x: model(x, classification_head_name=HEAD)[0], batches,
                                       {kind: session(tmp / name) for kind, name in files.items()}, regression)
        if difference["fp32"] > TOLERANCE:
            raise ExportError(f"{checkpoint}: the ONNX graph's logits differ from fairseq's by "
                              f"{difference['fp32']:.2e} on {split} (more than {TOLERANCE}): not written")
        load_wordpiece(wordpiece).save(str(tmp / "tokenizer.json"))
        dictionary = task.source_dictionary
        write_json(tmp / "vocabulary.json", dictionary.indices, indent=0)
        real = sum(int((tokens(b) != plain.pad).sum()) for b in batches)
        length = real / sum(tokens(b).size(0) for b in batches)  # the split's mean pieces per example
        manifest = {
            "format": MANIFEST_FORMAT,
            "source": {"checkpoint": str(checkpoint), "sha256": sha256(checkpoint)},
            "setting": {"head_ratio": head_ratio, "width": width},
            "heads": plain.heads,
            "neurons": plain.neurons,
            "full": {"heads": args.encoder_attention_heads, "neurons": args.encoder_ffn_embed_dim,
                     "layers": args.encoder_layers},
            "model_flops_ratio": layers_flops_ratio(plain.heads, plain.neurons, args, length),
            "task": "regression" if regression else "classification",
            "inputs": 2 if (Path(data) / "input1").is_dir() else 1,
            "labels": [] if regression else label_names(task, plain.out_proj.out_features),
            "max_positions": plain.max_positions,
            # as the data's inputs were cut (budget-prepare --truncate-tokens), then the whole to max_positions
            "truncation": {"pieces_per_input": prepared_record(data).get("truncate_tokens"),
                           "positions": plain.max_positions, "cut": "end"},
            "special": {"bos": dictionary.bos(), "pad": plain.pad, "eos": dictionary.eos(), "unk": dictionary.unk()},
            "files": files,
            "opset": OPSET,
            "requires": runtime_requirements(OPSET),
            "exported_with": versions(),
            "checked_on": {"split": split, "mse" if regression else "accuracy": accuracy,
                           "max_abs_logit_difference": difference},
        }
        write_json(tmp / MANIFEST, manifest)
    return manifest


def versions() -> Dict[str, str]:
    """The versions the export was made with."""
    import onnx
    import onnxruntime
    import tokenizers

    return {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
            "tokenizers": tokenizers.__version__}


def summary(manifest: dict) -> str:
    check = manifest["checked_on"]
    if "mse" in check:
        return "\n".join(f"{check['split']} mean squared error, {kind}: {value:.4f}" for kind, value in
                         check["mse"].items())
    lines = [f"heads per layer {','.join(map(str, manifest['heads']))}; FFN neurons per layer "
             f"{','.join(map(str, manifest['neurons']))}; model FLOPs {manifest['model_flops_ratio']:.3f} of the "
             "full model's"]
    for kind, accuracy in check["accuracy"].items():
        extra = "" if kind == "fairseq" else (f" (max |logit - fairseq's| {check['max_abs_logit_difference'][kind]:.1e}"
                                             f"; accuracy {accuracy - check['accuracy']['fairseq']:+.2f})")
        lines.append(f"{check['split']} accuracy, {kind}: {accuracy:.2f}{extra}")
    return "\n".join(lines)

