"""Training speed side by side: a training step of each model in this process, and
fairseq-train's updates per second for both on the same synthetic data."""

import contextlib
import copy
import statistics
import tempfile
from pathlib import Path
from typing import ContextManager, Dict, List

import torch

from budget_plugin.tools.building import size_flags
from budget_plugin.tools.fairseq_cli import parse_metrics, train_options
from budget_plugin.tools.fairseq_cli import run as run_tool
from budget_plugin.tools.files import write_atomic
from budget_plugin.tools.rotation import rotation
from budget_research.benchmark.cell import make_inputs
from budget_research.benchmark.config import VOCAB, BenchmarkConfig
from budget_research.timing import timed


def measure_training(size, stock, budget, batch, seq_len, vocab, cfg: BenchmarkConfig, device) -> List[dict]:
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
    torch.manual_seed(cfg.seed)
    for rep in range(1 + cfg.train_repeats):
        for j in rotation(len(models), rep):
            name, model = models[j]

            def step():
                optimizers[name].zero_grad(set_to_none=True)
                with autocast(device, cfg.dtype):
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
                     "repeats": len(times[name]), "dtype": str(cfg.dtype).replace("torch.", "")})
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


def measure_fairseq_train(size: str, arch: str, cfg: BenchmarkConfig, device: torch.device) -> List[dict]:
    """fairseq-train's updates per second for stock ``roberta`` and BudgetFormer of the
    same size, one after the other on the same synthetic data (batch
    ``--batch-sizes[-1]``, length ``--seq-lens[-1]``), with --fp16/--bf16 after
    ``--dtype`` (on a GPU). The first logged interval (start-up) is left out."""
    batch, seq_len, updates = cfg.batch_sizes[-1], cfg.seq_lens[-1], cfg.fairseq_train_updates
    precision = {torch.float16: ["--fp16"], torch.bfloat16: ["--bf16"]}.get(cfg.dtype, [])
    systems = {
        "fairseq_mha": ["--arch", "roberta", *size_flags(arch), "--task", "sentence_prediction",
                        "--criterion", "sentence_prediction"],
        "budgetformer": ["--arch", arch, "--task", "budget_sentence_prediction",
                         "--criterion", "budget_sentence_prediction"],
    }
    rows = []
    with tempfile.TemporaryDirectory() as work:
        data = synthetic_data(Path(work), examples=batch * updates, seq_len=seq_len, seed=cfg.seed)
        for name, model in systems.items():
            cmd = [*train_options(data, Path(work) / name, lr=1e-4, updates=updates, warmup=1, seed=cfg.seed,
                                  num_classes=2, batch_size=batch, log_interval=max(1, updates // 10),
                                  cpu=device.type == "cpu"),
                   "--max-positions", seq_len, "--no-save", "--disable-validation", *precision, *model]
            output = run_tool(cmd, threads=cfg.threads if device.type == "cpu" else None)
            inner = [parse_metrics(line)["ups"] for line in output.splitlines()
                     if "| train_inner |" in line and "ups" in parse_metrics(line)]
            if len(inner) < 2:
                raise RuntimeError(f"fairseq-train logged {len(inner)} intervals with ups:\n{output[-2000:]}")
            rows.append({"impl": name, "size": size, "batch": batch, "seq_len": seq_len, "updates": updates,
                         "precision": precision[0][2:] if precision else "fp32", "ups": statistics.median(inner[1:])})
    for row in rows:
        row["ups_vs_stock"] = row["ups"] / rows[0]["ups"]
    return rows
