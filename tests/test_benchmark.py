"""The benchmark's counts (FLOPs, memory) and its output schema; never its timings."""

import argparse
import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from conftest import REPO, build_model

spec = importlib.util.spec_from_file_location("benchmark", REPO / "scripts" / "benchmark.py")
benchmark = importlib.util.module_from_spec(spec)
spec.loader.exec_module(benchmark)

SMALL = benchmark.SIZES["small"]  # 4 layers, 256, 1024 ffn, 8 heads
RATIOS = (1.0, 0.75, 0.5, 0.25)


@pytest.fixture(scope="module")
def attention_setup():
    """One budgetformer_small attention layer (relevance randomised, so examples pick
    different heads) and a padded batch."""
    torch.manual_seed(0)
    model = benchmark.build_budgetformer(SMALL).eval()
    benchmark.randomise_relevance(model)
    attention = model.encoder.sentence_encoder.layers[0].self_attn
    T, B = 48, 6
    x = torch.randn(T, B, attention.embed_dim)
    lengths = torch.tensor([48, 40, 33, 24, 45, 30])
    padding = torch.arange(T)[None, :] >= lengths[:, None]
    return attention, x, padding


def _at_ratio(attention, ratio):
    attention.forced_heads = round(ratio * attention.num_heads)


def test_attention_flops_halve_at_half_the_heads(attention_setup):
    attention, x, padding = attention_setup
    flops = {}
    with torch.no_grad():
        for ratio in (1.0, 0.5):
            _at_ratio(attention, ratio)
            flops[ratio] = benchmark.count_flops(lambda: attention.forward_budgeted(x, padding))
    attention.forced_heads = None
    assert flops[1.0] > 0
    assert abs(flops[0.5] / (flops[1.0] / 2) - 1) < 0.05, flops
    # the counter sees the attention scores too (the CPU SDPA kernel is registered)
    T, B, C = x.shape
    projections = 8 * T * B * C * C
    assert flops[1.0] > projections * 1.01


def test_attention_memory_falls_with_head_ratio(attention_setup):
    """Bytes allocated (profiler memory records: deterministic counts, not time)."""
    attention, x, padding = attention_setup
    peaks = []
    with torch.no_grad():
        for ratio in RATIOS:
            _at_ratio(attention, ratio)
            attention.forward_budgeted(x, padding)  # warm
            peaks.append(benchmark.peak_memory(lambda: attention.forward_budgeted(x, padding), torch.device("cpu")))
    attention.forced_heads = None
    assert all(p > 0 for p in peaks), peaks
    assert all(a > b for a, b in zip(peaks, peaks[1:])), dict(zip(RATIOS, peaks))


def test_fast_path_allocates_no_weight_copies(attention_setup):
    """At batch 1 the selected heads' weights are sliced, never copied: the attention's
    peak allocation stays below one q/k/v weight matrix."""
    attention, x, padding = attention_setup
    x1 = x[:, :1].contiguous()
    attention.forced_heads = attention.num_heads // 2
    with torch.no_grad():
        peak = benchmark.peak_memory(lambda: attention.forward_budgeted(x1, None), torch.device("cpu"))
    attention.forced_heads = None
    activations = 6 * x1.numel() * x1.element_size()  # q, k, v, heads' output, output, slack
    assert peak <= activations, (peak, activations)


CELL_FIELDS = {
    "impl": str, "size": str, "batch": int, "seq_len": int, "attn_ms": float, "forward_ms": float,
    "attn_flops": int, "total_flops": int, "peak_mem_bytes": int, "attn_peak_mem_bytes": int,
    "heads_run": float, "throughput_seq_per_s": float, "throughput_tokens_per_s": float,
    "attn_cpu_ms": float, "forward_cpu_ms": float,
}
OPTIONAL_FLOATS = (
    "head_ratio", "ideal_speedup", "measured_speedup", "efficiency",
    "attn_ideal_speedup", "attn_measured_speedup", "attn_efficiency",
)


def test_quick_benchmark_writes_its_schema(tmp_path):
    # a learned-budget checkpoint of the tiny size, saved as fairseq-train saves a legacy model
    model = build_model("budgetformer_tiny")
    checkpoint = tmp_path / "tiny.pt"
    torch.save({"model": model.state_dict(), "cfg": {"model": model.args}}, checkpoint)
    out_json, out_md = tmp_path / "out" / "bench.json", tmp_path / "out" / "bench.md"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "benchmark.py"), "--quick", "--threads", "1",
         "--repeats", "2", "--profile", "4", "--checkpoint", str(checkpoint),
         "--json", str(out_json), "--markdown", str(out_md)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out_json.read_text())
    assert {"machine", "torch", "threads", "cells"} <= set(report)
    assert isinstance(report["threads"], int) and report["threads"] == 1
    cells = report["cells"]
    impls = {(c["size"], c["impl"], c["head_ratio"], c["budget"]) for c in cells}
    for ratio in RATIOS:
        assert ("small", "budgetformer", ratio, "forced") in impls
    assert ("small", "fairseq_mha", None, None) in impls
    assert ("checkpoint", "budgetformer", None, "learned") in impls
    assert {(c["batch"], c["seq_len"]) for c in cells if c["size"] == "small"} == {(1, 64), (8, 64)}
    for cell in cells:
        for name, kind in CELL_FIELDS.items():
            assert isinstance(cell[name], kind), (name, cell[name])
        for name in OPTIONAL_FLOATS:
            assert cell[name] is None or isinstance(cell[name], float), (name, cell[name])
        assert cell["impl"] in ("fairseq_mha", "budgetformer")
        if cell["impl"] == "fairseq_mha":
            assert cell["head_ratio"] is None and cell["efficiency"] is None
            assert cell["ideal_speedup"] == 1.0 and cell["measured_speedup"] == 1.0
        elif cell["head_ratio"] == 1.0:
            assert cell["efficiency"] is None  # no ideal saving to capture
    # training: one step of each model per cell (every size, the checkpoint's included)
    training = report["training"]
    cell_keys = {(c["size"], c["batch"], c["seq_len"]) for c in cells}
    assert {(r["size"], r["batch"], r["seq_len"], r["impl"]) for r in training} == {
        key + (impl,) for key in cell_keys for impl in ("fairseq_mha", "budgetformer")}
    for row in training:
        assert row["train_step_ms"] > 0 and row["train_tokens_per_s"] > 0 and row["repeats"] == 2
        assert row["train_vs_stock"] == 1.0 if row["impl"] == "fairseq_mha" else row["train_vs_stock"] > 0
    # --profile: every implementation's attention blocks profiled, operators by self CPU time
    for cell in cells:
        assert "Self CPU" in cell["attn_profile"] and "aten::" in cell["attn_profile"], cell["attn_profile"]
    table, _, profiles = out_md.read_text().partition("\nProfile of the attention blocks")
    assert profiles.count("```") == 2 * len(cells) and "fairseq MHA" in profiles
    inference, _, train_table = table.partition("\nTraining step")
    assert inference.startswith("| size | batch | len | impl") and inference.count("\n") == len(cells) + 2
    assert train_table.count("\n| ") == len(training) + 1
    assert "fairseq MHA" in proc.stdout
    assert not list(out_json.parent.glob(".*.tmp")), "temporary files are renamed away"
