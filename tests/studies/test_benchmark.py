"""The benchmark's counts (FLOPs, memory) and its output schema; never its timings."""

import copy
import json
import subprocess

import pytest
import torch

from budget_plugin.dial.settings import Dial, LayerDial
from budget_plugin.modules.flops import measure_flops
from budget_plugin.tools.building import build_model, size_of
from budget_research.benchmark.cell import make_inputs, measure_cell, peak_memory
from budget_research.benchmark.config import BenchmarkConfig
from budget_research.benchmark.models import build_pair, randomise_relevance
from helpers import REPO, assert_close, python_script

RATIOS = (1.0, 0.75, 0.5, 0.25)


@pytest.fixture(scope="module")
def attention_setup():
    """One budgetformer_small attention layer (relevance randomised, so examples pick
    different heads) and a padded batch."""
    torch.manual_seed(0)
    model = build_model("budgetformer_small").eval()
    randomise_relevance(model)
    attention = model.encoder.sentence_encoder.layers[0].self_attn
    T, B = 48, 6
    x = torch.randn(T, B, attention.embed_dim)
    lengths = torch.tensor([48, 40, 33, 24, 45, 30])
    padding = torch.arange(T)[None, :] >= lengths[:, None]
    return attention, x, padding


def at_ratio(attention, ratio):
    return LayerDial(heads=round(ratio * attention.num_heads))


def test_attention_flops_halve_at_half_the_heads(attention_setup):
    attention, x, padding = attention_setup
    flops = {}
    with torch.no_grad():
        for ratio in (1.0, 0.5):
            dial = at_ratio(attention, ratio)
            flops[ratio] = measure_flops(lambda: attention(x, key_padding_mask=padding, dial=dial)).total
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
            dial = at_ratio(attention, ratio)
            attention(x, key_padding_mask=padding, dial=dial)  # warm
            peaks.append(peak_memory(lambda: attention(x, key_padding_mask=padding, dial=dial), torch.device("cpu")))
    assert all(p > 0 for p in peaks), peaks
    assert all(a > b for a, b in zip(peaks, peaks[1:])), dict(zip(RATIOS, peaks))


def test_fast_path_allocates_no_weight_copies(attention_setup):
    """At batch 1 the selected heads' weights are sliced, never copied: the attention's
    peak allocation stays within its activations, below what a copy of the selected
    heads' q, k and v rows alone would take."""
    attention, x, padding = attention_setup
    x1 = x[:, :1].contiguous()
    with torch.no_grad():
        peak = peak_memory(lambda: attention(x1, dial=at_ratio(attention, 0.5)), torch.device("cpu"))
    activations = 6 * x1.numel() * x1.element_size()  # q, k, v, heads' output, output, slack
    weight = attention.q_proj.weight
    selected_qkv_copy = 3 * weight.numel() // 2 * weight.element_size()
    assert 0 < peak <= activations < selected_qkv_copy, (peak, activations, selected_qkv_copy)


CELL_FIELDS = {
    "impl": str, "size": str, "batch": int, "seq_len": int, "attn_ms": float, "forward_ms": float,
    "attn_flops": int, "total_flops": int, "peak_mem_bytes": int, "attn_peak_mem_bytes": int,
    "heads_run": float, "throughput_seq_per_s": float, "throughput_tokens_per_s": float,
    "attn_cpu_ms": float, "forward_cpu_ms": float, "repeats": int,
}
OPTIONAL_FLOATS = (
    "head_ratio", "ideal_speedup", "measured_speedup", "efficiency",
    "attn_ideal_speedup", "attn_measured_speedup", "attn_efficiency",
)


def check_cell_schema(cell):
    for name, kind in CELL_FIELDS.items():
        assert isinstance(cell[name], kind), (name, cell[name])
    for name in OPTIONAL_FLOATS:
        assert cell[name] is None or isinstance(cell[name], float), (name, cell[name])
    if cell["impl"] == "fairseq_mha":
        assert cell["head_ratio"] is None and cell["efficiency"] is None
        assert cell["ideal_speedup"] == 1.0 and cell["measured_speedup"] == 1.0
    elif cell["head_ratio"] == 1.0:
        assert cell["efficiency"] is None  # no ideal saving to capture
    else:
        assert cell["impl"] == "budgetformer"


@pytest.fixture(scope="module")
def tiny_pair():
    torch.manual_seed(0)
    stock, budget = build_pair("budgetformer_tiny", vocab=60)
    randomise_relevance(budget)
    return stock.eval(), budget.eval()


def test_the_pair_shares_its_weights(tiny_pair):
    stock, budget = tiny_pair
    tokens = make_inputs(3, 12, 60, seed=1, device="cpu")
    with torch.no_grad():
        every_head = budget(tokens, features_only=True, dial=Dial(counts=(4, 4)))[0]
        assert_close(every_head, stock(tokens, features_only=True)[0])


def test_a_cell_counts_flops_by_the_heads_it_forces(tiny_pair):
    """One cell in this process (tiny size, one timed round): every implementation,
    FLOPs against the heads run, the schema of every row."""
    stock, budget = tiny_pair
    settings = BenchmarkConfig(repeats=1, warmup=0, time_budget=0, profile=0)
    cells = measure_cell("tiny", size_of(budget.args), stock, budget, 4, 16, RATIOS, True, 60, settings,
                         torch.device("cpu"))
    assert [(c["impl"], c["head_ratio"], c["budget"]) for c in cells] == [
        ("fairseq_mha", None, None), *(("budgetformer", r, "forced") for r in RATIOS),
        ("budgetformer", None, "learned"), ("budgetformer", None, "static")]
    learned, static = cells[-2:]  # the yardstick runs the learned mean heads, rounded per layer
    assert abs(static["heads_run"] - learned["heads_run"]) <= 0.5
    for cell in cells:
        check_cell_schema(cell)
        assert (cell["layers"], cell["embed_dim"], cell["heads"], cell["repeats"]) == (2, 64, 4, 1)
    stock_cell, forced = cells[0], cells[1:5]
    assert [c["heads_run"] for c in forced] == [4.0, 3.0, 2.0, 1.0]  # forced for every example
    for cell in forced:  # attention FLOPs follow the heads, plus a small router
        assert cell["attn_flops"] / stock_cell["attn_flops"] == pytest.approx(cell["head_ratio"], abs=0.02)
        assert cell["attn_ideal_speedup"] == pytest.approx(stock_cell["attn_flops"] / cell["attn_flops"])
    assert [c["total_flops"] for c in forced] == sorted((c["total_flops"] for c in forced), reverse=True)
    assert [c["attn_peak_mem_bytes"] for c in forced] == sorted((c["attn_peak_mem_bytes"] for c in forced),
                                                                 reverse=True)


def test_a_cell_runs_in_bfloat16(tiny_pair):
    """--dtype bfloat16: the models cast, every implementation measured (on CPU too)."""
    stock, budget = (copy.deepcopy(m).to(torch.bfloat16) for m in tiny_pair)
    settings = BenchmarkConfig(repeats=1, warmup=0, time_budget=0, profile=0)
    cells = measure_cell("tiny", size_of(budget.args), stock, budget, 4, 16, (1.0, 0.5), False, 60, settings,
                         torch.device("cpu"))
    assert [c["heads_run"] for c in cells] == [4.0, 4.0, 2.0]
    assert all(c["forward_ms"] > 0 for c in cells)


@pytest.mark.slow
def test_quick_benchmark_writes_its_schema(tmp_path):
    # a learned-budget checkpoint of the tiny size, saved as fairseq-train saves a legacy model
    model = build_model("budgetformer_tiny", vocab=54, max_positions=64, num_classes=3)
    checkpoint = tmp_path / "tiny.pt"
    torch.save({"model": model.state_dict(), "cfg": {"model": model.args}}, checkpoint)
    out_json, out_md = tmp_path / "out" / "bench.json", tmp_path / "out" / "bench.md"
    proc = subprocess.run(
        [*python_script(REPO / "examples" / "budgetformer" / "benchmark.py"), "--quick", "--threads", "1",
         "--repeats", "1", "--warmup", "0", "--train-repeats", "1", "--profile", "4", "--checkpoint", str(checkpoint),
         "--fairseq-train-updates", "20",
         "--json", str(out_json), "--markdown", str(out_md)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out_json.read_text())
    assert {"machine", "torch", "threads", "cells"} <= set(report)
    assert report["threads"] == 1 and report["settings"]["quick"] is True
    cells = report["cells"]
    impls = {(c["size"], c["impl"], c["head_ratio"], c["budget"]) for c in cells}
    assert impls == {("small", "fairseq_mha", None, None), ("checkpoint", "fairseq_mha", None, None),
                     ("checkpoint", "budgetformer", None, "learned"), ("checkpoint", "budgetformer", None, "static"),
                     *(("small", "budgetformer", r, "forced") for r in RATIOS),
                     *(("checkpoint", "budgetformer", r, "forced") for r in RATIOS)}
    # --quick's cells; the explicit --repeats wins over --quick's
    assert {(c["batch"], c["seq_len"]) for c in cells} == {(1, 64), (8, 64)}
    small = size_of("budgetformer_small")
    for cell in cells:
        check_cell_schema(cell)
        assert cell["repeats"] == 1
        size = small if cell["size"] == "small" else size_of(model.args)
        assert (cell["layers"], cell["embed_dim"], cell["heads"]) == (size.layers, size.embed_dim, size.heads)
    # training: one step of each model per cell (every size, the checkpoint's included)
    training = report["training"]
    cell_keys = {(c["size"], c["batch"], c["seq_len"]) for c in cells}
    assert {(r["size"], r["batch"], r["seq_len"], r["impl"]) for r in training} == {
        key + (impl,) for key in cell_keys for impl in ("fairseq_mha", "budgetformer")}
    for row in training:
        assert row["train_step_ms"] > 0 and row["train_tokens_per_s"] > 0 and row["repeats"] == 1
        assert row["train_vs_stock"] == 1.0 if row["impl"] == "fairseq_mha" else row["train_vs_stock"] > 0
    # --profile: every implementation's attention blocks profiled, operators by self CPU time
    for cell in cells:
        assert "Self CPU" in cell["attn_profile"] and "aten::" in cell["attn_profile"], cell["attn_profile"]
    # fairseq-train of both models on the size's synthetic data (not the checkpoint's)
    runs = report["fairseq_train"]
    assert [(r["size"], r["impl"], r["updates"], r["precision"]) for r in runs] == [
        ("small", "fairseq_mha", 20, "fp32"), ("small", "budgetformer", 20, "fp32")]
    assert all(r["ups"] > 0 for r in runs) and runs[0]["ups_vs_stock"] == 1.0
    assert runs[1]["ups_vs_stock"] == pytest.approx(runs[1]["ups"] / runs[0]["ups"])
    markdown_matches_the_json(out_md.read_text(), cells, training, runs)
    assert "fairseq MHA" in proc.stdout
    assert sorted(p.name for p in out_json.parent.iterdir()) == ["bench.json", "bench.md"]  # no temporary files


def table_rows(text: str, header: str):
    """The rows of the markdown table that starts with ``header``, as lists of cells."""
    lines = text[text.index(header):].splitlines()[2:]  # after the header and the |---| line
    rows = []
    for line in lines:
        if not line.startswith("| "):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def number(text):
    return None if text == "-" else float(text)


def markdown_matches_the_json(markdown, cells, training, runs):
    """Every number of the report's tables is the JSON's, at the table's precision, and
    the speed-ups and efficiencies are the ratios of the recorded FLOPs and times to those
    of fairseq's MHA in the same cell; every profile is its own cell's."""
    def close(shown, value, digits):
        if value is None:
            return shown is None
        return shown is not None and abs(shown - value) <= 0.51 * 10**-digits + 1e-12

    rows = table_rows(markdown, "| size | batch | len | impl |")
    assert len(rows) == len(cells)
    stock = {(c["size"], c["batch"], c["seq_len"]): c for c in cells if c["impl"] == "fairseq_mha"}
    for row, c in zip(rows, cells):
        s = stock[(c["size"], c["batch"], c["seq_len"])]
        ideal, attn_ideal = s["total_flops"] / c["total_flops"], s["attn_flops"] / c["attn_flops"]
        measured, attn_measured = s["forward_ms"] / c["forward_ms"], s["attn_ms"] / c["attn_ms"]
        saving, attn_saving = 1 - c["total_flops"] / s["total_flops"], 1 - c["attn_flops"] / s["attn_flops"]
        cpu_saving = 1 - c["forward_cpu_ms"] / s["forward_cpu_ms"]
        assert (c["ideal_speedup"], c["attn_ideal_speedup"]) == pytest.approx((ideal, attn_ideal))
        assert (c["measured_speedup"], c["attn_measured_speedup"]) == pytest.approx((measured, attn_measured))
        efficiency = None if saving < 0.01 else (1 - c["forward_ms"] / s["forward_ms"]) / saving
        attn_efficiency = None if attn_saving < 0.01 else (1 - c["attn_ms"] / s["attn_ms"]) / attn_saving
        cpu_efficiency = None if saving < 0.01 else cpu_saving / saving
        for got, want in ((c["efficiency"], efficiency), (c["attn_efficiency"], attn_efficiency)):
            assert (got is None and want is None) or got == pytest.approx(want), (got, want)
        assert row[:3] == [c["size"], str(c["batch"]), str(c["seq_len"])]
        shown = [number(x) for x in row[4:]]
        expected = [(c["heads_run"], 2), (c["attn_ms"], 2), (c["forward_ms"], 2), (c["attn_flops"] / 1e9, 3),
                    (c["total_flops"] / 1e9, 3), (c["peak_mem_bytes"] / 2**20, 1),
                    (c["attn_peak_mem_bytes"] / 2**20, 1), (ideal, 2), (measured, 2), (efficiency, 2),
                    (attn_ideal, 2), (attn_measured, 2), (attn_efficiency, 2), (c["attn_cpu_ms"], 2),
                    (c["forward_cpu_ms"], 2), (c["attn_cpu_ms"] / s["attn_cpu_ms"], 2), (cpu_efficiency, 2),
                    (c["throughput_tokens_per_s"], 0)]
        assert len(shown) == len(expected), row
        for column, (got, (value, digits)) in enumerate(zip(shown, expected)):
            assert close(got, value, digits), (row, column, got, value)
    # training: the step time against fairseq MHA's of the same cell
    rows = table_rows(markdown, "| size | batch | len | impl | train step ms |")
    assert len(rows) == len(training)
    stock_step = {(r["size"], r["batch"], r["seq_len"]): r["train_step_ms"] for r in training
                  if r["impl"] == "fairseq_mha"}
    for row, r in zip(rows, training):
        ratio = r["train_step_ms"] / stock_step[(r["size"], r["batch"], r["seq_len"])]
        assert r["train_vs_stock"] == pytest.approx(ratio)
        assert row[:3] == [r["size"], str(r["batch"]), str(r["seq_len"])]
        assert ("fairseq MHA" in row[3]) == (r["impl"] == "fairseq_mha")
        assert close(float(row[4]), r["train_step_ms"], 1) and close(float(row[5]), r["train_tokens_per_s"], 0)
        assert close(float(row[6]), ratio, 2)
    rows = table_rows(markdown, "| size | batch | len | precision | impl | updates/s |")
    assert len(rows) == len(runs)
    for row, r in zip(rows, runs):
        assert row[:5] == [r["size"], str(r["batch"]), str(r["seq_len"]), r["precision"],
                           "fairseq MHA" if r["impl"] == "fairseq_mha" else "BudgetFormer"]
        assert close(float(row[5]), r["ups"], 2) and close(float(row[6]), r["ups"] / runs[0]["ups"], 2)
    # the profiles: one per cell, in the cells' order, each under its cell's heading
    sections = markdown.split("\nProfile of the attention blocks, ")[1:]
    assert len(sections) == len(cells)
    for section, c in zip(sections, cells):
        heading, _, body = section.partition(":\n\n```\n")
        assert heading.startswith(f"{c['size']} batch {c['batch']} len {c['seq_len']}, ")
        assert ("fairseq MHA" in heading) == (c["impl"] == "fairseq_mha")
        assert body.partition("\n```")[0] == c["attn_profile"].rstrip()
