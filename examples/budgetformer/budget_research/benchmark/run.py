"""Every cell of a benchmark config, one size (or the checkpoint) at a time; the report
(JSON and markdown) written after every cell, so that an interrupted run keeps the cells
done so far."""

import sys
import time

import torch

from budget_plugin.tools.building import size_of
from budget_plugin.tools.files import write_atomic, write_json
from budget_research.benchmark.cell import measure_cell
from budget_research.benchmark.config import PADDING, RELEVANCE, SIZES, BenchmarkConfig
from budget_research.benchmark.models import build_pair, checkpoint_pair, randomise_relevance
from budget_research.benchmark.tables import report_markdown
from budget_research.benchmark.training import measure_fairseq_train, measure_training
from budget_research.timing import machine_info


def new_report(cfg: BenchmarkConfig, device: torch.device) -> dict:
    return {
        "machine": machine_info(device),
        "torch": torch.__version__,
        "fairseq": __import__("fairseq").__version__,
        "threads": torch.get_num_threads(),
        "device": str(device),
        "dtype": str(cfg.dtype).replace("torch.", ""),
        "settings": {
            "quick": cfg.quick, "repeats": cfg.repeats, "warmup": cfg.warmup,
            "time_budget_s": cfg.time_budget, "padding": PADDING, "routing": RELEVANCE,
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


def write(cfg: BenchmarkConfig, report: dict) -> None:
    write_json(cfg.json, report, indent=1)
    write_atomic(cfg.markdown, report_markdown(report))


def run(cfg: BenchmarkConfig) -> dict:
    """The benchmark of every size (and the checkpoint), cell by cell; returns the report."""
    torch.set_num_threads(cfg.threads)
    device = torch.device(cfg.device)
    report = new_report(cfg, device)
    contenders = [(size, SIZES[size]) for size in cfg.sizes] + ([("checkpoint", None)] if cfg.checkpoint else [])
    for size, arch in contenders:
        torch.manual_seed(cfg.seed)
        if arch is None:
            stock, budget = checkpoint_pair(cfg.checkpoint)
        else:
            stock, budget = build_pair(arch)
            randomise_relevance(budget, seed=cfg.seed)
        vocab = budget.encoder.sentence_encoder.embed_tokens.num_embeddings
        dims = size_of(budget.args)
        stock.to(device=device, dtype=cfg.dtype).eval()
        budget.to(device=device, dtype=cfg.dtype).eval()
        for batch in cfg.batch_sizes:
            for seq_len in cfg.seq_lens:
                if seq_len > budget.args.max_positions:
                    print(f"[benchmark] {size}: skipping len {seq_len} > max positions "
                          f"{budget.args.max_positions}", file=sys.stderr)
                    continue
                t0 = time.perf_counter()
                report["cells"] += measure_cell(size, dims, stock, budget, batch, seq_len, cfg.head_ratios,
                                                arch is None, vocab, cfg, device)
                if cfg.train_repeats > 0:
                    report["training"] += measure_training(size, stock, budget, batch, seq_len, vocab, cfg, device)
                write(cfg, report)
                print(f"[benchmark] {size} batch {batch} len {seq_len}: {time.perf_counter() - t0:.1f}s",
                      file=sys.stderr, flush=True)
        del stock, budget
        if cfg.fairseq_train_updates and arch is not None:
            report["fairseq_train"] += measure_fairseq_train(size, arch, cfg, device)
            write(cfg, report)
    return report
