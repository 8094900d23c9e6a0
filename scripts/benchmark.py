#!/usr/bin/env python3
"""Side-by-side benchmark: stock fairseq RoBERTa vs BudgetFormer (inference, and a training step).

For every size, batch size and sequence length ("cell") it runs, in one process, on
the same inputs and with identical weights:

* ``fairseq_mha``: an encoder of fairseq's own ``roberta`` architecture
  (``RobertaModel.build_model``, standard ``MultiheadAttention``), and
* ``budgetformer``: the same encoder with budgeted attention (the stock weights are
  copied in), its budget forced to ``round(ratio * H)`` heads per layer for every
  ``--head-ratios`` value, plus, with ``--checkpoint``, the checkpoint's learned budget
  and its static twin: the same weights running, in every layer, the learned budget's
  mean heads (rounded) on the cell's inputs, one head set for every input (the
  yardstick a learned budget must not be slower than).

``--dtype`` casts the models (bfloat16/float16 inference).

Forcing k fixes *how many* heads run; *which* heads an example runs is still picked per
example by the router's relevance scores. An untrained router is near-uniform (std 0.02),
so its relevance weights are redrawn from N(0, 1) (seeded): examples then choose
different heads, as a trained model's do, and the fast path has to group them. A
checkpoint keeps its trained router.

Measured per cell and implementation (eval mode, ``torch.no_grad``):

* FLOPs with ``torch.utils.flop_counter.FlopCounterMode`` for the whole forward pass and
  for the attention blocks (``budget_plugin.modules.flops.measure_flops``, which also
  counts the CPU kernel of ``scaled_dot_product_attention``; on a GPU BudgetedAttention's
  torch path runs for the count, since the counter cannot see Triton kernels);
* latency (milliseconds, median of ``--repeats`` timed runs after warm-up, CUDA events
  on a GPU; the
  implementations are interleaved within each repeat so that they share the machine's
  noise, and the one that goes first rotates from repeat to repeat) of the whole
  forward (``model(tokens, features_only=True)``) and of the
  attention blocks: every layer's attention module run standalone on the hidden states
  that enter that layer in the stock model, called as the layers call it
  (``self_attn(x, x, x, key_padding_mask=m, need_weights=False)``, router included),
  summed over layers;
* peak memory (bytes allocated above what was held before the call): on CPU from
  ``torch.profiler`` memory events (``profile_memory=True``), on CUDA from
  ``torch.cuda.max_memory_allocated``;
* throughput (sequences and non-padding tokens per second of the whole forward);
* training (``--train-repeats``, listed apart under ``training``): milliseconds per
  training step (forward, backward and an AdamW step, train mode, under autocast to
  ``--dtype``) of the stock model and of BudgetFormer, which trains on its all-heads
  path with its learned budget; with ``--fairseq-train-updates N``, ``fairseq-train``'s
  updates/s for both on synthetic data (``--fp16``/``--bf16`` after ``--dtype``);
* with ``--profile N``: a ``torch.profiler`` table (the N operators with the most self
  CPU time) of one run of each implementation's attention blocks, kept in the cell as
  ``attn_profile`` and appended to the markdown: where the time goes when a target is
  missed.

Derived: ideal speed-up (stock FLOPs / budgeted FLOPs), measured speed-up (stock latency
/ budgeted latency), efficiency ``(1 - t_budget / t_stock) / (1 - flops_budget /
flops_stock)`` (the fraction of the ideal saving captured; null when the ideal saving is
under 1%, e.g. at ratio 1.0), each for the whole model and for the attention blocks.

Inputs: random tokens; batch 1 is unpadded; in larger batches example 0 has the full
length and the others a seeded length uniform in [T/2, T] (right padding).

Results go to ``--json`` and ``--markdown`` (written atomically after every cell, so an
interrupted run leaves the cells done so far); the table is printed at the end.

    python scripts/benchmark.py --quick
    python scripts/benchmark.py --sizes small base --batch-sizes 1 8 32 --seq-lens 64 128 512
"""

import argparse
import contextlib
import copy
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager, Dict, List, Optional
from unittest import mock

import torch

from budget_plugin.modules import gpu_heads
from budget_plugin.modules.flops import measure_flops
from budget_plugin.tools.building import build_model, copy_weights, size_flags, size_of, size_options
from budget_plugin.tools.fairseq_cli import parse_metrics, train_options
from budget_plugin.tools.fairseq_cli import run as run_tool
from budget_plugin.tools.files import write_atomic, write_json
from budget_plugin.tools.timing import machine_info, rotation, sync, timed

REPO = Path(__file__).resolve().parent.parent
SIZES = {"small": "budgetformer_small", "base": "budgetformer_base", "minilm": "budgetformer_minilm"}  # sizes read from the registry
VOCAB = 1000
MAX_POSITIONS = 512
PADDING = (
    "batch 1 unpadded; otherwise example 0 full length and the others a seeded length "
    "uniform in [T/2, T] (right padding)"
)
RELEVANCE = (
    "forced budgets: k = round(ratio * H) heads per layer, which heads chosen per example "
    "by the router; relevance weights redrawn N(0, 1) (seeded) so examples pick different "
    "heads (a checkpoint keeps its trained router)"
)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
QUICK = dict(sizes=["small"], batch_sizes=[1, 8], seq_lens=[64], repeats=3, train_repeats=2)


# ----------------------------------------------------------------------- models


def build_pair(arch: str, vocab: int = VOCAB):
    """fairseq's own RoBERTa encoder (standard MultiheadAttention) and a BudgetFormer of
    the architecture's size with the same weights."""
    stock = build_model("roberta", vocab, max_positions=MAX_POSITIONS, **size_options(arch))
    budget = build_model(arch, vocab, max_positions=MAX_POSITIONS)
    copy_weights(stock.state_dict(), budget)
    return stock, budget


def randomise_relevance(model, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for attention in model.budgeted_attentions():
            w = attention.router.relevance_proj.weight
            w.copy_(torch.randn(w.shape, generator=generator).to(w))


def load_checkpoint(path: str):
    """A BudgetFormer checkpoint (fairseq-train's or a bare {'model', 'cfg'|'args'} dict),
    read with torch's safe loader (``weights_only=True``; ``import budget_plugin``
    allow-lists the argparse.Namespace a legacy fairseq model keeps in its config).
    Returns (budgetformer, vocabulary size)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    args = None
    if state.get("cfg") is not None:
        args = state["cfg"].get("model") if isinstance(state["cfg"], dict) else state["cfg"].model
    if args is None:
        args = state.get("args")
    if not isinstance(args, argparse.Namespace):
        args = argparse.Namespace(**dict(args)) if args is not None else argparse.Namespace(arch="budgetformer")
    weights = state["model"]
    vocab = weights["encoder.sentence_encoder.embed_tokens.weight"].shape[0]
    arch = args.arch if str(getattr(args, "arch", "")).startswith("budgetformer") else "budgetformer"
    model = build_model(arch, vocab, args=args)
    copy_weights(weights, model)
    return model, vocab


# ----------------------------------------------------------------------- measuring


@contextlib.contextmanager
def torch_ops_only():
    """Inside the block BudgetedAttention takes its torch path on a GPU too: torch's
    FlopCounterMode sees aten operators, not Triton kernels, and the torch path runs
    the same heads (the same FLOPs)."""
    with mock.patch.object(gpu_heads, "available", lambda x: False):
        yield


def peak_memory(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated during ``fn`` above what was allocated before it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - base)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(  # raw allocation (+) and free (-) records, in time order
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type().name == "CPU"
    )
    current = peak = 0
    for _, nbytes in events:
        current += nbytes
        peak = max(peak, current)
    return int(peak)


@dataclass
class Impl:
    name: str  # fairseq_mha | budgetformer
    head_ratio: Optional[float]
    budget: Optional[str]  # None (stock) | "forced" | "learned"
    forward: Callable[[], object]
    attention: Callable[[], object]
    budget_context: Callable[[], ContextManager]  # what every run of forward and attention runs in
    heads_run: Callable[[], float]  # mean heads run per layer and example


def make_inputs(batch: int, seq_len: int, vocab: int, seed: int, device):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, vocab, (batch, seq_len), generator=generator)
    tokens[:, 0] = 0  # <s>
    if batch > 1:
        lengths = torch.randint(seq_len // 2, seq_len + 1, (batch,), generator=generator)
        lengths[0] = seq_len
        tokens[torch.arange(seq_len)[None, :] >= lengths[:, None]] = 1  # <pad>
    return tokens.to(device)


def capture_layer_inputs(stock, tokens: torch.Tensor):
    """(x, key_padding_mask) entering every layer of the stock encoder."""
    captured = []

    def hook(module, args, kwargs):
        x = args[0] if args else kwargs["x"]
        mask = kwargs.get("encoder_padding_mask", args[1] if len(args) > 1 else None)
        captured.append((x.detach().clone(), None if mask is None else mask.clone()))

    layers = stock.encoder.sentence_encoder.layers
    handles = [layer.register_forward_pre_hook(hook, with_kwargs=True) for layer in layers]
    try:
        with torch.no_grad():
            stock(tokens, features_only=True)
    finally:
        for handle in handles:
            handle.remove()
    return captured


def attention_blocks(model, inputs) -> Callable[[], list]:
    """Every layer's attention run on the captured inputs, called as the layer calls it."""
    layers = model.encoder.sentence_encoder.layers

    def run():
        return [layer.self_attn(x, x, x, key_padding_mask=mask, need_weights=False)
                for layer, (x, mask) in zip(layers, inputs)]

    return run


def build_impls(stock, budget, tokens, ratios, learned: bool) -> List[Impl]:
    inputs = capture_layer_inputs(stock, tokens)
    H = budget.encoder.sentence_encoder.layers[0].self_attn.num_heads
    last_heads: Dict[str, float] = {}

    def recording(model, key):
        """The model's forward, which notes the mean heads it ran under ``key``."""
        def forward():
            _, extra = model(tokens, features_only=True)
            last_heads[key] = torch.stack([s["heads"] for s in extra["budget"]]).float().mean().item()
        return forward

    budget_forward = recording(budget, "forward")

    def forcing(k):
        return lambda: budget.forced_heads(k)

    impls = [
        Impl("fairseq_mha", None, None, lambda: stock(tokens, features_only=True), attention_blocks(stock, inputs),
             contextlib.nullcontext, lambda: float(H)),
    ]
    for ratio in ratios:
        k = max(1, min(H, round(ratio * H)))
        impls.append(Impl("budgetformer", ratio, "forced", budget_forward, attention_blocks(budget, inputs),
                          forcing(k), lambda: last_heads.get("forward", float("nan"))))
    if learned:
        impls.append(Impl("budgetformer", None, "learned", budget_forward, attention_blocks(budget, inputs),
                          contextlib.nullcontext, lambda: last_heads.get("forward", float("nan"))))
        static = static_twin(budget, tokens)
        impls.append(Impl("budgetformer", None, "static", recording(static, "static"), attention_blocks(static, inputs),
                          contextlib.nullcontext, lambda: last_heads.get("static", float("nan"))))
    return impls


def static_twin(budget, tokens):
    """The static-budget twin of a trained model, the yardstick of its learned budget:
    every layer runs, for every input, the learned budget's mean heads on ``tokens``
    (rounded), namely the heads of highest mean relevance: one head set for the batch."""
    with torch.no_grad():
        _, extra = budget(tokens, features_only=True)
    stats = sorted(extra["budget"], key=lambda s: s["layer"])
    fixed = ",".join(str(round(s["heads"].float().mean().item())) for s in stats)
    args = copy.deepcopy(budget.args)
    args.head_selection, args.fixed_heads = "static", fixed
    twin = build_model(args.arch, budget.encoder.sentence_encoder.embed_tokens.num_embeddings, args=args)
    copy_weights(budget.state_dict(), twin)
    with torch.no_grad():
        for attention, s in zip(twin.budgeted_attentions(), stats):
            attention.router.static_logits.copy_(s["relevance"].float().mean(0).log())
    weight = budget.encoder.sentence_encoder.embed_tokens.weight
    return twin.to(device=weight.device, dtype=weight.dtype).eval()


def _ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def _efficiency(t, t_stock, flops, flops_stock):
    ideal_saving = 1.0 - flops / flops_stock
    if ideal_saving < 0.01:  # no saving to capture (ratio 1.0 costs the router on top)
        return None
    return (1.0 - t / t_stock) / ideal_saving


def measure_cell(size, dims, stock, budget, batch, seq_len, ratios, learned, vocab, args, device):
    torch.manual_seed(0)
    tokens = make_inputs(batch, seq_len, vocab, seed=1000 * batch + seq_len, device=device)
    impls = build_impls(stock, budget, tokens, ratios, learned)
    rows = []
    with torch.no_grad():
        for impl in impls:  # FLOPs (also the first warm-up) and peak memory, one impl at a time
            with impl.budget_context(), torch_ops_only():
                row = {"total_flops": measure_flops(impl.forward).total,
                       "attn_flops": measure_flops(impl.attention).total}
                row["heads_run"] = impl.heads_run()
                row["peak_mem_bytes"] = peak_memory(impl.forward, device)
                row["attn_peak_mem_bytes"] = peak_memory(impl.attention, device)
            rows.append(row)
        times = {i: {k: [] for k in ("forward", "attention", "forward_cpu", "attention_cpu")}
                 for i in range(len(impls))}
        repeats = args.repeats
        started = time.perf_counter()
        rep = 0
        while rep < args.warmup + repeats:
            for i in rotation(len(impls), rep):
                impl = impls[i]
                with impl.budget_context():
                    for kind, fn in (("forward", impl.forward), ("attention", impl.attention)):
                        ms, cpu_ms = timed(fn, device)
                        if rep >= args.warmup:
                            times[i][kind].append(ms)
                            times[i][f"{kind}_cpu"].append(cpu_ms)
            rep += 1
            if rep == args.warmup + 1 and args.time_budget > 0:  # cap very slow cells
                per_round = (time.perf_counter() - started) / rep
                fit = int(args.time_budget / max(per_round, 1e-9))
                repeats = max(min(3, args.repeats), min(args.repeats, fit))
        profiles = [profile_table(impl, args.profile, device) if args.profile else None for impl in impls]
    cells = []
    non_pad_tokens = int((tokens != 1).sum())
    for i, (impl, row) in enumerate(zip(impls, rows)):
        forward_ms = statistics.median(times[i]["forward"])
        attn_ms = statistics.median(times[i]["attention"])
        cell = {
            "impl": impl.name,
            "size": size,
            "layers": dims.layers,
            "embed_dim": dims.embed_dim,
            "heads": dims.heads,
            "batch": batch,
            "seq_len": seq_len,
            "head_ratio": impl.head_ratio,
            "budget": impl.budget,
            "heads_run": row["heads_run"],
            "attn_ms": attn_ms,
            "forward_ms": forward_ms,
            "attn_ms_min": min(times[i]["attention"]),
            "forward_ms_min": min(times[i]["forward"]),
            # CPU time of this process (all its threads): at --threads 1 on a shared
            # machine it leaves out the time the benchmark waited for a core
            "attn_cpu_ms": statistics.median(times[i]["attention_cpu"]),
            "forward_cpu_ms": statistics.median(times[i]["forward_cpu"]),
            "repeats": len(times[i]["forward"]),
            "attn_flops": row["attn_flops"],
            "total_flops": row["total_flops"],
            "peak_mem_bytes": row["peak_mem_bytes"],
            "attn_peak_mem_bytes": row["attn_peak_mem_bytes"],
            "throughput_seq_per_s": batch / (forward_ms / 1e3),
            "throughput_tokens_per_s": non_pad_tokens / (forward_ms / 1e3),
        }
        if profiles[i] is not None:
            cell["attn_profile"] = profiles[i]
        cells.append(cell)
    stock_cell = cells[0]
    for cell in cells:
        for prefix, t_key, f_key in (("", "forward_ms", "total_flops"), ("attn_", "attn_ms", "attn_flops")):
            cell[f"{prefix}ideal_speedup"] = _ratio(stock_cell[f_key], cell[f_key])
            cell[f"{prefix}measured_speedup"] = _ratio(stock_cell[t_key], cell[t_key])
            cell[f"{prefix}efficiency"] = _efficiency(
                cell[t_key], stock_cell[t_key], cell[f_key], stock_cell[f_key]
            )
        for prefix, t_key, f_key in (("", "forward_cpu_ms", "total_flops"), ("attn_", "attn_cpu_ms", "attn_flops")):
            cell[f"{prefix}cpu_speedup"] = _ratio(stock_cell[t_key], cell[t_key])
            cell[f"{prefix}cpu_efficiency"] = _efficiency(
                cell[t_key], stock_cell[t_key], cell[f_key], stock_cell[f_key]
            )
        cell["attn_latency_vs_stock"] = _ratio(cell["attn_ms"], stock_cell["attn_ms"])
        cell["forward_latency_vs_stock"] = _ratio(cell["forward_ms"], stock_cell["forward_ms"])
        cell["attn_cpu_vs_stock"] = _ratio(cell["attn_cpu_ms"], stock_cell["attn_cpu_ms"])
        cell["forward_cpu_vs_stock"] = _ratio(cell["forward_cpu_ms"], stock_cell["forward_cpu_ms"])
    return cells


def profile_table(impl: Impl, rows: int, device: torch.device) -> str:
    """The operators of one run of ``impl``'s attention blocks, most self CPU time first."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with impl.budget_context():
        impl.attention()  # warm
        with torch.profiler.profile(activities=activities) as prof:
            impl.attention()
            sync(device)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def measure_training(size, stock, budget, batch, seq_len, vocab, args, device) -> List[dict]:
    """Milliseconds per training step (forward and backward of a stand-in loss, then an
    AdamW step; train mode, dropout on; median of ``--train-repeats`` after one warm-up,
    the two models alternating and rotating), on fp32 copies of the models under
    autocast to ``--dtype`` (mixed precision, as fairseq-train --fp16/--bf16 trains).
    BudgetFormer trains on its reference path, which computes every head (the recipe
    says why), with its learned budget: the router and the gates are its cost."""
    tokens = make_inputs(batch, seq_len, vocab, seed=1000 * batch + seq_len, device=device)
    models = [("fairseq_mha", copy.deepcopy(stock).float().train()),
              ("budgetformer", copy.deepcopy(budget).float().train())]
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-5) for name, model in models}
    times: Dict[str, List[float]] = {name: [] for name, _ in models}
    torch.manual_seed(args.seed)
    for rep in range(1 + args.train_repeats):
        for j in rotation(len(models), rep):
            name, model = models[j]

            def step():
                optimizers[name].zero_grad(set_to_none=True)
                with autocast(device, args.dtype):
                    features, _ = model(tokens, features_only=True)
                features.float().square().mean().backward()
                optimizers[name].step()

            ms, _ = timed(step, device)
            if rep > 0:
                times[name].append(ms)
    non_pad_tokens = int((tokens != 1).sum())
    stock_ms = statistics.median(times["fairseq_mha"])
    rows = []
    for name, _ in models:
        ms = statistics.median(times[name])
        rows.append({"impl": name, "size": size, "batch": batch, "seq_len": seq_len, "train_step_ms": ms,
                     "train_tokens_per_s": non_pad_tokens / (ms / 1e3), "train_vs_stock": ms / stock_ms,
                     "repeats": len(times[name]), "dtype": str(args.dtype).replace("torch.", "")})
    return rows


def autocast(device: torch.device, dtype: torch.dtype) -> ContextManager:
    """Mixed precision in ``dtype`` (nothing for float32)."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def synthetic_data(root: Path, examples: int, seq_len: int, seed: int) -> Path:
    """A binarized sentence-classification set of random words (lengths uniform in
    [T/2, T-2], so that <s> and </s> fit) with random labels: fairseq-train's speed does
    not depend on what it learns."""
    generator = torch.Generator().manual_seed(seed)
    raw = root / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    lengths = torch.randint(seq_len // 2, seq_len - 1, (examples,), generator=generator).tolist()
    words = torch.randint(0, VOCAB - 8, (examples, seq_len), generator=generator).tolist()
    write_atomic(raw / "train.input0", "".join(" ".join(f"w{w}" for w in row[:n]) + "\n"
                                               for row, n in zip(words, lengths)))
    labels = torch.randint(0, 2, (examples,), generator=generator).tolist()
    write_atomic(raw / "train.label", "".join(("neg", "pos")[y] + "\n" for y in labels))
    for name in ("input0", "label"):
        run_tool(["fairseq-preprocess", "--only-source", "--trainpref", raw / f"train.{name}",
                  "--destdir", root / "bin" / name, "--workers", 1])
    return root / "bin"


def measure_fairseq_train(size: str, arch: str, args, device: torch.device) -> List[dict]:
    """fairseq-train's updates per second for stock ``roberta`` and BudgetFormer of the
    same size, one after the other on the same synthetic data (batch
    ``--batch-sizes[-1]``, length ``--seq-lens[-1]``), with --fp16/--bf16 after
    ``--dtype`` (on a GPU). The first logged interval (start-up) is left out."""
    batch, seq_len, updates = args.batch_sizes[-1], args.seq_lens[-1], args.fairseq_train_updates
    precision = {torch.float16: ["--fp16"], torch.bfloat16: ["--bf16"]}.get(args.dtype, [])
    systems = {
        "fairseq_mha": ["--arch", "roberta", *size_flags(arch), "--task", "sentence_prediction",
                        "--criterion", "sentence_prediction"],
        "budgetformer": ["--arch", arch, "--task", "budget_sentence_prediction",
                         "--criterion", "budget_sentence_prediction"],
    }
    rows = []
    with tempfile.TemporaryDirectory() as work:
        data = synthetic_data(Path(work), examples=batch * updates, seq_len=seq_len, seed=args.seed)
        for name, model in systems.items():
            cmd = [*train_options(data, Path(work) / name, lr=1e-4, updates=updates, warmup=1, seed=args.seed,
                                  num_classes=2, batch_size=batch, log_interval=max(1, updates // 10),
                                  cpu=device.type == "cpu"),
                   "--max-positions", seq_len, "--no-save", "--disable-validation", *precision, *model]
            output = run_tool(cmd, threads=args.threads if device.type == "cpu" else None)
            inner = [parse_metrics(line)["ups"] for line in output.splitlines()
                     if "| train_inner |" in line and "ups" in parse_metrics(line)]
            if len(inner) < 2:
                raise RuntimeError(f"fairseq-train logged {len(inner)} intervals with ups:\n{output[-2000:]}")
            rows.append({"impl": name, "size": size, "batch": batch, "seq_len": seq_len, "updates": updates,
                         "precision": precision[0][2:] if precision else "fp32", "ups": statistics.median(inner[1:])})
    for row in rows:
        row["ups_vs_stock"] = row["ups"] / rows[0]["ups"]
    return rows


# ----------------------------------------------------------------------- output


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def markdown_table(cells: List[dict]) -> str:
    header = (
        "| size | batch | len | impl | heads | attn ms | fwd ms | attn GFLOP | total GFLOP "
        "| peak MB fwd | peak MB attn | ideal x | measured x | eff | attn ideal x "
        "| attn measured x | attn eff | attn cpu ms | fwd cpu ms | attn cpu x | fwd cpu eff | tok/s |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for c in cells:
        lines.append(
            f"| {c['size']} | {c['batch']} | {c['seq_len']} | {_label(c)} | {c['heads_run']:.2f} "
            f"| {c['attn_ms']:.2f} | {c['forward_ms']:.2f} | {c['attn_flops'] / 1e9:.3f} "
            f"| {c['total_flops'] / 1e9:.3f} | {c['peak_mem_bytes'] / 2**20:.1f} "
            f"| {c['attn_peak_mem_bytes'] / 2**20:.1f} | {_fmt(c['ideal_speedup'], '.2f')} "
            f"| {_fmt(c['measured_speedup'], '.2f')} | {_fmt(c['efficiency'], '.2f')} "
            f"| {_fmt(c['attn_ideal_speedup'], '.2f')} | {_fmt(c['attn_measured_speedup'], '.2f')} "
            f"| {_fmt(c['attn_efficiency'], '.2f')} | {c['attn_cpu_ms']:.2f} | {c['forward_cpu_ms']:.2f} "
            f"| {_fmt(c['attn_cpu_vs_stock'], '.2f')} | {_fmt(c['cpu_efficiency'], '.2f')} "
            f"| {c['throughput_tokens_per_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def rows_table(rows: List[dict], columns) -> str:
    """A markdown table of ``rows``: ``columns`` are (header, the cell's text of a row)."""
    lines = ["| " + " | ".join(header for header, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(text(row) for _, text in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


CELL_COLUMNS = [("size", lambda r: r["size"]), ("batch", lambda r: str(r["batch"])), ("len", lambda r: str(r["seq_len"]))]


TRAINING_COLUMNS = [
    *CELL_COLUMNS,
    ("impl", lambda r: "fairseq MHA" if r["impl"] == "fairseq_mha" else "BudgetFormer (all heads, learned budget)"),
    ("train step ms", lambda r: f"{r['train_step_ms']:.1f}"),
    ("tok/s", lambda r: f"{r['train_tokens_per_s']:.0f}"),
    ("time vs stock", lambda r: f"{r['train_vs_stock']:.2f}"),
]
FAIRSEQ_TRAIN_COLUMNS = [
    *CELL_COLUMNS,
    ("precision", lambda r: r["precision"]),
    ("impl", lambda r: "fairseq MHA" if r["impl"] == "fairseq_mha" else "BudgetFormer"),
    ("updates/s", lambda r: f"{r['ups']:.2f}"),
    ("vs stock", lambda r: f"{r['ups_vs_stock']:.2f}"),
]


def _label(cell: dict) -> str:
    if cell["impl"] == "fairseq_mha":
        return "fairseq MHA"
    if cell["budget"] == "static":
        return "static at learned heads"
    return "budget learned" if cell["budget"] == "learned" else f"budget {cell['head_ratio']:.2f}"


def report_markdown(report: dict) -> str:
    text = markdown_table(report["cells"])
    if report["training"]:
        text += ("\nTraining step (forward, backward and AdamW step, train mode, autocast to the dtype):\n\n"
                 + rows_table(report["training"], TRAINING_COLUMNS))
    if report["fairseq_train"]:
        text += "\nfairseq-train, side by side (synthetic data):\n\n" + rows_table(report["fairseq_train"], FAIRSEQ_TRAIN_COLUMNS)
    for c in report["cells"]:
        if "attn_profile" in c:
            text += (f"\nProfile of the attention blocks, {c['size']} batch {c['batch']} len {c['seq_len']}, "
                     f"{_label(c)}:\n\n```\n{c['attn_profile'].rstrip()}\n```\n")
    return text


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="CI subset: small, batch 1 8, len 64, 3 repeats")
    p.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=["small", "base"])
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 32])
    p.add_argument("--seq-lens", nargs="+", type=int, default=[64, 128, 512])
    p.add_argument("--head-ratios", nargs="+", type=float, default=[1.0, 0.75, 0.5, 0.25])
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads")
    p.add_argument("--repeats", type=int, default=7, help="timed runs per implementation (median)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds after the FLOP/memory runs")
    p.add_argument("--time-budget", type=float, default=120.0,
                   help="seconds of timed rounds per cell; slow cells get fewer repeats (>= 3); 0: no cap")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32",
                   help="inference in this dtype (the models cast); training steps under autocast to it")
    p.add_argument("--train-repeats", type=int, default=3,
                   help="timed training steps per model and cell (median); 0: no training measurement")
    p.add_argument("--fairseq-train-updates", type=int, default=0, metavar="N",
                   help="per size: fairseq-train of stock roberta and of BudgetFormer for N updates on synthetic "
                        "data (the last batch size and length), updates/s side by side; 0: off")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="per cell and implementation, a torch.profiler table of the attention blocks (top N operators)")
    p.add_argument("--checkpoint", help="a BudgetFormer checkpoint: adds its learned budget (own size)")
    p.add_argument("--json", default=str(REPO / "results" / "benchmark.json"))
    p.add_argument("--markdown", default=str(REPO / "results" / "benchmark.md"))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        explicit = {a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:]) if a.startswith("--")}
        for key, value in QUICK.items():
            if f"--{key.replace('_', '-')}" not in explicit:
                setattr(args, key, value)
    for ratio in args.head_ratios:
        if not 0 < ratio <= 1:
            p.error(f"--head-ratios must be in (0, 1], got {ratio}")
    if args.profile < 0:
        p.error(f"--profile must be >= 0, got {args.profile}")
    if args.train_repeats < 0:
        p.error(f"--train-repeats must be >= 0, got {args.train_repeats}")
    if args.fairseq_train_updates and args.fairseq_train_updates < 20:
        p.error(f"--fairseq-train-updates must be 0 (off) or >= 20, got {args.fairseq_train_updates}")
    if max(args.seq_lens) > MAX_POSITIONS:
        p.error(f"--seq-lens must be <= {MAX_POSITIONS}")
    args.dtype = DTYPES[args.dtype]
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    report = {
        "machine": machine_info(device),
        "torch": torch.__version__,
        "fairseq": __import__("fairseq").__version__,
        "threads": torch.get_num_threads(),
        "device": str(device),
        "dtype": str(args.dtype).replace("torch.", ""),
        "settings": {
            "quick": args.quick, "repeats": args.repeats, "warmup": args.warmup,
            "time_budget_s": args.time_budget, "padding": PADDING, "routing": RELEVANCE,
            "timing": "median ms (*_ms: the wall clock on CPU, CUDA events on a GPU) and median CPU "
                      "time of the process (*_cpu_ms, all threads; on a GPU it includes the wait for "
                      "the device); implementations interleaved within each repeat",
            "attention_blocks": "every layer's attention standalone on the stock model's layer "
                                "inputs, router included, summed over layers",
        },
        "cells": [],
        "training": [],
        "fairseq_train": [],
    }
    plans = []
    for size in args.sizes:
        plans.append((size, SIZES[size], None))
    if args.checkpoint:
        plans.append(("checkpoint", None, args.checkpoint))
    for size, arch, checkpoint in plans:
        torch.manual_seed(args.seed)
        if checkpoint:
            budget, vocab = load_checkpoint(checkpoint)
            stock = build_model("roberta", vocab, args=budget.args)  # every option of the checkpoint's
            copy_weights(budget.state_dict(), stock)
        else:
            vocab = VOCAB
            stock, budget = build_pair(arch, vocab)
            randomise_relevance(budget, seed=args.seed)
        dims = size_of(budget.args)
        stock.to(device=device, dtype=args.dtype).eval()
        budget.to(device=device, dtype=args.dtype).eval()
        for batch in args.batch_sizes:
            for seq_len in args.seq_lens:
                if seq_len > budget.args.max_positions:
                    print(f"[benchmark] {size}: skipping len {seq_len} > max positions "
                          f"{budget.args.max_positions}", file=sys.stderr)
                    continue
                t0 = time.perf_counter()
                cells = measure_cell(size, dims, stock, budget, batch, seq_len, args.head_ratios,
                                     checkpoint is not None, vocab, args, device)
                report["cells"].extend(cells)
                if args.train_repeats > 0:
                    report["training"].extend(
                        measure_training(size, stock, budget, batch, seq_len, vocab, args, device))
                write_json(args.json, report, indent=1)
                write_atomic(args.markdown, report_markdown(report))
                print(f"[benchmark] {size} batch {batch} len {seq_len}: {time.perf_counter() - t0:.1f}s",
                      file=sys.stderr, flush=True)
        del stock, budget
        if args.fairseq_train_updates and arch is not None:
            report["fairseq_train"].extend(measure_fairseq_train(size, arch, args, device))
            write_json(args.json, report, indent=1)
            write_atomic(args.markdown, report_markdown(report))
    print(report_markdown(report))
    return report


if __name__ == "__main__":
    main()
