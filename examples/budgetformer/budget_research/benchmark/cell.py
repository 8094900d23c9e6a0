"""One inference cell of the benchmark (a size, batch size and length): every
implementation's FLOPs, peak memory and latency on the same inputs, interleaved, and what
they imply (ideal and measured speed-ups, efficiency)."""

import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional
from unittest import mock

import torch

from budget_plugin.dial.settings import Dial
from budget_plugin.modules import gpu_heads
from budget_plugin.modules.flops import measure_flops
from budget_plugin.tools.rotation import rotation
from budget_research.benchmark.config import BenchmarkConfig
from budget_research.benchmark.models import static_twin
from budget_research.timing import sync, timed


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
    forward: Callable[[], object]  # "forced": this and attention run the count in their dial
    attention: Callable[[], object]
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


def attention_blocks(model, inputs, dial: Optional[Dial] = None) -> Callable[[], list]:
    """Every layer's attention run on the captured inputs, called as the layer calls it
    (``dial``: a budget model's, each layer's part handed to its attention)."""
    layers = model.encoder.sentence_encoder.layers
    parts = [{} if dial is None else {"dial": dial.layer(i)} for i in range(len(layers))]  # the stock one takes none

    def run():
        return [layer.self_attn(x, x, x, key_padding_mask=mask, need_weights=False, **part)
                for layer, (x, mask), part in zip(layers, inputs, parts)]

    return run


def build_impls(stock, budget, tokens, ratios, learned: bool) -> List[Impl]:
    inputs = capture_layer_inputs(stock, tokens)
    layers = budget.encoder.sentence_encoder.layers
    H = layers[0].self_attn.num_heads
    last_heads: Dict[str, float] = {}

    def recording(model, key, dial: Optional[Dial] = None):
        """The model's forward at ``dial`` (None: its own setting), which notes the mean
        heads it ran under ``key``."""
        def forward():
            _, extra = model(tokens, features_only=True, dial=dial)
            last_heads[key] = torch.stack([s["heads"] for s in extra["budget"]]).float().mean().item()
        return forward

    impls = [
        Impl("fairseq_mha", None, None, lambda: stock(tokens, features_only=True), attention_blocks(stock, inputs),
             lambda: float(H)),
    ]
    for ratio in ratios:
        dial = Dial.heads_per_layer(max(1, min(H, round(ratio * H))), len(layers))
        impls.append(Impl("budgetformer", ratio, "forced", recording(budget, "forward", dial),
                          attention_blocks(budget, inputs, dial), lambda: last_heads.get("forward", float("nan"))))
    if learned:
        impls.append(Impl("budgetformer", None, "learned", recording(budget, "forward"),
                          attention_blocks(budget, inputs), lambda: last_heads.get("forward", float("nan"))))
        static = static_twin(budget, tokens)
        impls.append(Impl("budgetformer", None, "static", recording(static, "static"), attention_blocks(static, inputs),
                          lambda: last_heads.get("static", float("nan"))))
    return impls



def _ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def _efficiency(t, t_stock, flops, flops_stock):
    ideal_saving = 1.0 - flops / flops_stock
    if ideal_saving < 0.01:  # no saving to capture (ratio 1.0 costs the router on top)
        return None
    return (1.0 - t / t_stock) / ideal_saving


def measure_cell(size, dims, stock, budget, batch, seq_len, ratios, learned: bool, vocab: int, cfg: BenchmarkConfig,
                 device) -> List[dict]:
    """A row per implementation: the stock model, ``budget`` at each forced ratio, and
    with ``learned`` its learned budget and its static twin."""
    torch.manual_seed(0)
    tokens = make_inputs(batch, seq_len, vocab, seed=1000 * batch + seq_len, device=device)
    impls = build_impls(stock, budget, tokens, ratios, learned)
    rows = []
    with torch.no_grad():
        for impl in impls:  # FLOPs (also the first warm-up) and peak memory, one impl at a time
            with torch_ops_only():
                row = {"total_flops": measure_flops(impl.forward).total,
                       "attn_flops": measure_flops(impl.attention).total}
                row["heads_run"] = impl.heads_run()
                row["peak_mem_bytes"] = peak_memory(impl.forward, device)
                row["attn_peak_mem_bytes"] = peak_memory(impl.attention, device)
            rows.append(row)
        times = {i: {k: [] for k in ("forward", "attention", "forward_cpu", "attention_cpu")}
                 for i in range(len(impls))}
        repeats = cfg.repeats
        started = time.perf_counter()
        rep = 0
        while rep < cfg.warmup + repeats:
            for i in rotation(len(impls), rep):
                impl = impls[i]
                for kind, fn in (("forward", impl.forward), ("attention", impl.attention)):
                    ms, cpu_ms = timed(fn, device)
                    if rep >= cfg.warmup:
                        times[i][kind].append(ms)
                        times[i][f"{kind}_cpu"].append(cpu_ms)
            rep += 1
            if rep == cfg.warmup + 1 and cfg.time_budget > 0:  # cap very slow cells
                per_round = (time.perf_counter() - started) / rep
                fit = int(cfg.time_budget / max(per_round, 1e-9))
                repeats = max(min(3, cfg.repeats), min(cfg.repeats, fit))
        profiles = [profile_table(impl, cfg.profile, device) if cfg.profile else None for impl in impls]
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
    impl.attention()  # warm
    with torch.profiler.profile(activities=activities) as prof:
        impl.attention()
        sync(device)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)
