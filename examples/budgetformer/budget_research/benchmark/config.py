"""The benchmark's settings, and the fixed choices every report states."""

import os
from dataclasses import dataclass, field
from typing import Optional, Tuple

import torch

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
QUICK = dict(sizes=("small",), batch_sizes=(1, 8), seq_lens=(64,), repeats=3, train_repeats=2)  # --quick: the CI subset


@dataclass(frozen=True)
class BenchmarkConfig:
    sizes: Tuple[str, ...] = ("small", "base")  # of SIZES
    batch_sizes: Tuple[int, ...] = (1, 8, 32)
    seq_lens: Tuple[int, ...] = (64, 128, 512)
    head_ratios: Tuple[float, ...] = (1.0, 0.75, 0.5, 0.25)  # forced budgets: round(ratio * H) heads per layer
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    repeats: int = 7  # timed rounds per implementation (median)
    warmup: int = 1  # untimed rounds after the FLOP/memory runs
    time_budget: float = 120.0  # seconds of timed rounds per cell (slow cells get fewer repeats, >= 3); 0: no cap
    device: str = field(default_factory=lambda: "cuda" if torch.cuda.is_available() else "cpu")
    dtype: torch.dtype = torch.float32  # inference in it; training steps under autocast to it
    train_repeats: int = 3  # timed training steps per model and cell; 0: none
    fairseq_train_updates: int = 0  # per size, fairseq-train of both for N updates; 0: off
    profile: int = 0  # per cell and implementation, a profiler table of the top N operators; 0: none
    checkpoint: Optional[str] = None  # a BudgetFormer checkpoint: its learned budget too
    json: str = "results/benchmark.json"
    markdown: str = "results/benchmark.md"
    seed: int = 0
    quick: bool = False
