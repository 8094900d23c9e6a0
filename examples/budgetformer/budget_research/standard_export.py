"""The export's graph against the same pretrained BERT exported the standard ways
(issue 41, point 5), timed side by side in one process:

* ``plain``: a PyTorch BERT (q, k and v in one projection, torch's scaled dot-product
  attention) exported with the TorchScript exporter at opset 17;
* ``fused``: the same weights with attention written as Hugging Face's BERT writes it
  (separate q/k/v, explicit softmax, an additive mask from a mask input), exported the
  same way and passed through ONNX Runtime's transformer optimizer, which fuses it into
  Attention, SkipLayerNormalization and BiasGelu;
* each in fp32 and ONNX Runtime's dynamic int8 (per tensor and per channel).

Each graph is timed two ways: in a default session (every graph optimization, as its
user gets it) and in budget_serve's session (the same, less the fusions slower on the
CPU): the first compares what each route gives, the second the graphs alone. Inputs are
random ids without padding at batch 1 (25 and 64 pieces) and batch 32 (25 pieces); each
figure is the best of rotating rounds. A fine-tuned export's weights differ from the
pretrained model's; its shapes, and so its times, do not."""

import math
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from budget_plugin.data.bert_files import open_input, read_config, read_weights
from budget_plugin.tools.rotation import rotation

SHAPES = ((1, 25), (1, 64), (32, 25))
SESSIONS = ("default", "budget_serve")


class StandardBert(nn.Module):
    """A BERT classifier at inference from Hugging Face's weights (the pooler's tanh over
    [CLS], then a 2-way head). ``hf_style``: attention
    as Hugging Face writes it, with a mask input; else one q/k/v projection and torch's
    fused attention call, no mask."""

    def __init__(self, weights: Dict[str, torch.Tensor], geometry, hf_style: bool):
        super().__init__()
        w = {k.removeprefix("bert."): v for k, v in weights.items()}
        g = self.geometry = geometry
        self.hf_style = hf_style

        def linear(prefix: str, parts=("",)) -> nn.Linear:
            weight = torch.cat([w[f"{prefix}{p}.weight"] for p in parts])
            layer = nn.Linear(weight.shape[1], weight.shape[0])
            layer.weight.data, layer.bias.data = weight, torch.cat([w[f"{prefix}{p}.bias"] for p in parts])
            return layer

        def norm(prefix: str) -> nn.LayerNorm:
            layer = nn.LayerNorm(g.dim, eps=g.eps)
            layer.weight.data, layer.bias.data = w[prefix + ".weight"], w[prefix + ".bias"]
            return layer

        self.words = nn.Embedding.from_pretrained(w["embeddings.word_embeddings.weight"])
        self.positions = nn.Embedding.from_pretrained(w["embeddings.position_embeddings.weight"])
        self.register_buffer("token_type", w["embeddings.token_type_embeddings.weight"][0])
        self.embedding_norm = norm("embeddings.LayerNorm")
        self.blocks = nn.ModuleList()
        for i in range(g.layers):
            p, block = f"encoder.layer.{i}.", nn.Module()
            qkv = ("query", "key", "value")
            if hf_style:
                block.q, block.k, block.v = (linear(f"{p}attention.self.{n}") for n in qkv)
            else:
                block.qkv = linear(f"{p}attention.self.", qkv)
            block.out, block.norm1 = linear(f"{p}attention.output.dense"), norm(f"{p}attention.output.LayerNorm")
            block.fc1, block.fc2 = linear(f"{p}intermediate.dense"), linear(f"{p}output.dense")
            block.norm2 = norm(f"{p}output.LayerNorm")
            self.blocks.append(block)
        self.head = nn.Linear(g.dim, 2)  # seeded: the times do not depend on it, tests compare through it
        self.head.weight.data = torch.randn(2, g.dim, generator=torch.Generator().manual_seed(0)) * 0.1
        nn.init.zeros_(self.head.bias)
        self.eval()

    def forward(self, ids: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        B, T = ids.shape
        h, d = self.geometry.heads, self.geometry.dim // self.geometry.heads
        x = self.embedding_norm(self.words(ids) + self.positions.weight[:T] + self.token_type)
        additive = None if mask is None else (1.0 - mask[:, None, None, :].float()) * -10000.0
        for b in self.blocks:
            if self.hf_style:
                q, k, v = (t(x).view(B, T, h, d).permute(0, 2, 1, 3) for t in (b.q, b.k, b.v))
                a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d) + additive, dim=-1) @ v
            else:
                q, k, v = b.qkv(x).view(B, T, 3, h, d).permute(2, 0, 3, 1, 4)
                a = F.scaled_dot_product_attention(q, k, v)
            x = b.norm1(x + b.out(a.transpose(1, 2).reshape(B, T, h * d)))
            x = b.norm2(x + b.fc2(F.gelu(b.fc1(x))))
        return self.head(torch.tanh(x[:, 0]))


def standard_exports(model: Path, out: Path, log: Callable[[str], None] = print) -> Tuple[Dict[str, Path], dict]:
    """{name: graph} of the standard exports of the BERT at ``model`` (a folder or the
    wheel holding one), written into ``out``, and the optimizer's fused-operator counts."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    source = open_input(model)
    geometry = read_config(source)
    _, weights = read_weights(source)
    example = torch.randint(1000, 20000, (1, 25))
    graphs = {}
    for name, hf_style in (("plain", False), ("hf-style", True)):
        graphs[name] = out / f"{name}.onnx"
        names = ["ids", "mask"][:1 + hf_style]
        torch.onnx.export(StandardBert(weights, geometry, hf_style), (example, torch.ones_like(example))[:len(names)],
                          str(graphs[name]), input_names=names, output_names=["logits"], opset_version=17,
                          dynamic_axes={n: {0: "b", 1: "t"} for n in names}, dynamo=False)
    optimized = optimize_model(str(graphs.pop("hf-style")), model_type="bert", num_heads=geometry.heads,
                               hidden_size=geometry.dim, opt_level=1)
    fused_ops = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
    graphs["fused"] = out / "fused.onnx"
    optimized.save_model_to_file(str(graphs["fused"]))
    for name in ("plain", "fused"):
        for per_channel in (False, True):
            kind = f"{name} int8 per-{'channel' if per_channel else 'tensor'}"
            graphs[kind] = out / f"{name}.{'pc' if per_channel else 'pt'}.int8.onnx"
            quantize_dynamic(str(graphs[name]), str(graphs[kind]), weight_type=QuantType.QInt8,
                             per_channel=per_channel,  # the fused graph's types are not all inferred
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        graphs[f"{name} fp32"] = graphs.pop(name)
    log(f"standard exports written; fused operators: {fused_ops}")
    return graphs, fused_ops


def sessions(graphs: Dict[str, Path], threads: int) -> Dict[Tuple[str, str], object]:
    """{(graph, session kind): session}: a default session and budget_serve's."""
    import onnxruntime
    from budget_serve.predictor import session

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    return {**{(name, "default"): onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
               for name, path in graphs.items()},
            **{(name, "budget_serve"): session(path, threads) for name, path in graphs.items()}}


def best_times(runs: Dict[Tuple[str, str], object], rounds: int, log: Callable[[str], None] = print) -> List[dict]:
    """Per shape, the best milliseconds of each session over ``rounds`` rounds, each round
    timing every shape and every session (who goes first rotates): a slower spell of the
    machine falls on a round, not on one shape or one session."""
    rng, keys = np.random.default_rng(0), list(runs)
    feeds = []
    for B, T in SHAPES:
        ids = rng.integers(1000, 20000, (B, T)).astype(np.int64)
        feeds.append({key: {i.name: ids if i.name != "mask" else np.ones_like(ids) for i in run.get_inputs()}
                      for key, run in runs.items()})
    best = [dict.fromkeys(keys, math.inf) for _ in SHAPES]
    for round_ in range(rounds):
        for shape, (B, _) in enumerate(SHAPES):
            for i in rotation(len(keys), round_):
                for _ in range(10 if B == 1 else 2):
                    start = time.perf_counter()
                    runs[keys[i]].run(None, feeds[shape][keys[i]])
                    best[shape][keys[i]] = min(best[shape][keys[i]], time.perf_counter() - start)
        log(f"round {round_ + 1}/{rounds} timed")
    return [{"batch": B, "pieces": T, "ms": {f"{name} | {kind}": 1e3 * found[name, kind] for name, kind in keys}}
            for (B, T), found in zip(SHAPES, best)]


def skip_layer_norm_cost(dim: int, threads: int, repeats: int = 300) -> List[dict]:
    """ONNX Runtime's SkipLayerNormalization against the Add + LayerNormalization it
    replaces, alone, at each shape's rows x ``dim``: the cause measured apart."""
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    def graph(fused: bool) -> bytes:
        inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", "T", dim]) for n in ("x", "r")]
        inits = [numpy_helper.from_array(np.ones(dim, np.float32), "g"),
                 numpy_helper.from_array(np.zeros(dim, np.float32), "b")]
        nodes = ([helper.make_node("SkipLayerNormalization", ["x", "r", "g", "b"], ["y"], domain="com.microsoft",
                                   epsilon=1e-5)] if fused else
                 [helper.make_node("Add", ["x", "r"], ["s"]),
                  helper.make_node("LayerNormalization", ["s", "g", "b"], ["y"], axis=-1, epsilon=1e-5)])
        output = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        return helper.make_model(helper.make_graph(nodes, "g", inputs, [output], inits), opset_imports=[
            helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]).SerializeToString()

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    runs = {"SkipLayerNormalization": onnxruntime.InferenceSession(graph(True), options),
            "Add + LayerNormalization": onnxruntime.InferenceSession(  # left as written
                graph(False), options, disabled_optimizers=["SkipLayerNormFusion"])}
    found = []
    for B, T in SHAPES:
        x, r = (np.random.default_rng(i).random((B, T, dim), dtype=np.float32) for i in (0, 1))
        row = {"batch": B, "pieces": T, "us": {}}
        for name, run in runs.items():
            run.run(None, {"x": x, "r": r})
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                run.run(None, {"x": x, "r": r})
                times.append(time.perf_counter() - start)
            row["us"][name] = 1e6 * min(times)
        found.append(row)
    return found


def standard_export_study(export: Path, model: Path, threads: int = 2, rounds: int = 20,
                          log: Callable[[str], None] = print) -> dict:
    """The study: ``export`` (a budget-export-onnx folder of full width, with int8) timed
    beside the standard exports of the BERT at ``model``."""
    import onnxruntime

    with tempfile.TemporaryDirectory() as tmp:
        graphs, fused_ops = standard_exports(model, Path(tmp), log)
        graphs = {"project fp32": export / "model.onnx", "project int8": export / "model.int8.onnx", **graphs}
        times = best_times(sessions(graphs, threads), rounds, log)
    geometry = read_config(open_input(model))
    return {"export": str(export), "model": str(model), "threads": threads, "rounds": rounds,
            "onnxruntime": onnxruntime.__version__, "fused_operators": fused_ops, "times": times,
            "skip_layer_norm": skip_layer_norm_cost(geometry.dim, threads)}


def ratios(study: dict, precision: str) -> List[dict]:
    """Per shape, the project's ``precision`` graph as budget_serve runs it against the
    fastest standard export of that precision, as a default session runs it and as
    budget_serve's runs it."""
    rows = []
    for shape in study["times"]:
        ms = shape["ms"]
        project = ms[f"project {precision} | budget_serve"]

        def best(kind: str) -> Tuple[str, float]:
            return min(((k, v) for k, v in ms.items() if k.endswith(f"| {kind}") and precision in k
                        and not k.startswith("project")), key=lambda kv: kv[1])

        rows.append({"batch": shape["batch"], "pieces": shape["pieces"], "project_ms": project,
                     **{f"against {kind}": {"best": best(kind)[0], "ratio": project / best(kind)[1]}
                        for kind in SESSIONS}})
    return rows


def report(study: dict, target: float = 1.05) -> str:
    names = list(dict.fromkeys(k.split(" | ")[0] for k in study["times"][0]["ms"]))
    heads = [f"b{s['batch']} len{s['pieces']}" for s in study["times"]]
    lines = ["# The export's graph against the standard exports of the same BERT", "",
             f"`{study['export']}` beside `{study['model']}` exported the standard ways "
             "(`examples/budgetformer/standard_export.py`; budget_research/standard_export.py says how). "
             f"onnxruntime {study['onnxruntime']}, {study['threads']} threads, best of {study['rounds']} rotating "
             "rounds, ms (each cell: a default session, then budget_serve's session):", "",
             "| graph | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(
            f"{s['ms'][f'{name} | default']:.2f} \\| {s['ms'][f'{name} | budget_serve']:.2f}"
            for s in study["times"]) + " |")
    lines += ["", f"The project's graph as budget_serve runs it, against the fastest standard export (target "
              f"<= {target}x):", "", "| precision | shape | project ms | vs best, default sessions | "
              "vs best, budget_serve's sessions |", "|---|---|---|---|---|"]
    for precision in ("fp32", "int8"):
        for row in ratios(study, precision):
            cells = [f"{row[f'against {k}']['ratio']:.3f}x ({row[f'against {k}']['best']})" for k in SESSIONS]
            lines.append(f"| {precision} | b{row['batch']} len{row['pieces']} | {row['project_ms']:.2f} | "
                         + " | ".join(cells) + " |")
    lines += ["", "The cause, measured apart: ONNX Runtime's SkipLayerNormalization against the Add + "
              "LayerNormalization it fuses, microseconds:", "",
              "| shape | SkipLayerNormalization | Add + LayerNormalization |", "|---|---|---|"]
    for row in study["skip_layer_norm"]:
        lines.append(f"| b{row['batch']} len{row['pieces']} | {row['us']['SkipLayerNormalization']:.1f} | "
                     f"{row['us']['Add + LayerNormalization']:.1f} |")
    lines += ["", f"Fused operators in the optimized Hugging Face-style export: {study['fused_operators']}"]
    return "\n".join(lines) + "\n"
