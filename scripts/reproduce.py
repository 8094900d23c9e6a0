#!/usr/bin/env python3
"""The accuracy study: does a per-input head budget match full attention at a fraction
of the heads, and beat fixed budgets?

Five systems, trained with the same data, size (``budgetformer_small``), optimiser,
update budget and seeds:

  full        fairseq's own ``roberta`` architecture (standard multi-head attention)
  budget      BudgetFormer: learned per-input budget and relevance, exploration schedule
              annealed over the first 40% of the updates
  no_explore  the same with ``--exploration-updates 0`` (the schedule's ablation)
  static      ``--head-selection static``: one learned head subset for every input
  random      ``--head-selection random``: per input, uniformly random heads

``static`` and ``random`` run, per layer, the mean number of heads that ``budget`` of the
same seed ran on dev (``--fixed-heads``; static rounds it, random meets it on average).

Per data set and seed: train, keep the best checkpoint on dev, score the test split once
with ``fairseq-validate`` (every example). Then, in this process and on the test split:
heads run per input (spread per layer and per class), FLOPs counted by FlopCounterMode
(whole model and attention blocks, the router included), and latency at batch 32 against
``full`` on the first test batches (the five systems of a seed interleaved, median of repeats).

Writes ``results/reproduce.{json,md}`` and ``results/reproduce_accuracy_vs_flops.png``;
the markdown ends with a paragraph generated from the numbers. Resumable: a run whose
``result.json`` exists (same updates, learning rate and fixed budget) is not trained again.

    python scripts/reproduce.py                  # MR and TREC, 3 seeds, ~80 min on 2 cores
    python scripts/reproduce.py --quick --data-dir D --datasets TOY   # minutes, tiny sizes
"""

import argparse
import logging
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

import torch

from budget_plugin.tools.measure import count_flops, heads_per_input, latencies, load_checkpoint, split_batches
from budget_plugin.tools.fairseq_cli import validate, validation_metrics
from budget_plugin.tools.files import atomic_path, write_atomic, write_json
from budget_plugin.tools.study import (
    EXPLORATION_SHARE, SYSTEMS, Run, add_study_arguments, cached_record, check_study_arguments, fairseq_train,
    heads_per_layer, log, mean_std, system_args, task_of,
)
from budget_plugin.tools.timing import machine_info

REPO = Path(__file__).resolve().parent.parent
DESCRIPTION = {
    "full": "full attention (stock fairseq roberta)",
    "budget": "BudgetFormer",
    "no_explore": "BudgetFormer, no exploration",
    "static": "static budget",
    "random": "random heads",
}


def train(run: Run, cfg, fixed_heads=None) -> dict:
    """Train one system and seed, score dev (budget only: its heads set the fixed
    budgets) and test once; a finished run with the same settings is not trained again."""
    run_dir = run.dir(cfg.save_dir)
    record_path = run_dir / "result.json"
    updates = cfg.updates[run.dataset]
    record = cached_record(record_path, updates=updates, fixed_heads=fixed_heads, lr=cfg.lr)
    if record is not None:
        return record
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    output, wall = fairseq_train(run, cfg, system_args(run.system, updates, cfg.quick, fixed_heads))
    record = {
        "dataset": run.dataset, "system": run.system, "seed": run.seed, "updates": updates, "lr": cfg.lr,
        "train_wall_s": wall, "dev_accuracy": max(m["accuracy"] for m in validation_metrics(output)),
        "fixed_heads": fixed_heads,
    }
    # dev only for budget (its heads set the fixed budgets), test once for every system
    subsets = ["valid", "test"] if run.system == "budget" else ["test"]
    scores = validate(run_dir / "checkpoint_best.pt", cfg.data_dir / f"{run.dataset}-bin", subsets,
                      task=task_of(run.system), log_path=run_dir / "validate.log", threads=cfg.threads_per_job)
    if run.system == "budget":
        record["dev_heads_per_layer"] = heads_per_layer(scores["valid"])
    record.update(test_accuracy=scores["test"]["accuracy"], test_examples=int(scores["test"]["bsz"]))
    write_json(record_path, record)
    log(f"{run.dataset} {run.system} seed {run.seed}: dev {record['dev_accuracy']:.1f} "
        f"test {record['test_accuracy']:.1f} ({wall:.0f}s)")
    return record


def train_all(cfg) -> dict:
    """Every run, ``cfg.jobs`` at a time; static/random of a seed start once its budget
    run is done."""
    records = {}
    first = [Run(d, s, seed) for s in ("budget", "full", "no_explore") for d in cfg.datasets for seed in cfg.seeds]
    with ThreadPoolExecutor(cfg.jobs) as pool:
        pending = {pool.submit(train, run, cfg): run for run in first}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                run = pending.pop(future)
                records[run] = future.result()
                if run.system == "budget":
                    heads = records[run]["dev_heads_per_layer"]
                    for system in ("static", "random"):
                        follow = Run(run.dataset, system, run.seed)
                        pending[pool.submit(train, follow, cfg, heads)] = follow
    return records


# ----------------------------------------------------------------- analysis


def load(run: Run, cfg):
    """The best checkpoint and its task, as fairseq-validate loads them."""
    return load_checkpoint(run.dir(cfg.save_dir) / "checkpoint_best.pt", cfg.data_dir / f"{run.dataset}-bin")


def analyse(cfg, records: dict) -> list:
    rows = []
    for dataset in cfg.datasets:
        for seed in cfg.seeds:
            runs = [Run(dataset, system, seed) for system in SYSTEMS]
            loaded = [load(run, cfg) for run in runs]
            batches = split_batches(loaded[0][1], 32)
            models = [model for model, _ in loaded]
            seconds = latencies(models, batches[: cfg.latency_batches], cfg.latency_repeats)
            flops = [count_flops(model, batches) for model in models]
            labels = loaded[0][1].label_dictionary
            for run, model, t, (total, attention) in zip(runs, models, seconds, flops):
                row = dict(records[run], latency_ms=round(1000 * t, 2), total_flops=total, attn_flops=attention,
                           latency_ratio=t / seconds[0], flops_ratio=total / flops[0][0],
                           attn_flops_ratio=attention / flops[0][1])
                layers = model.encoder.sentence_encoder.layers
                H = layers[0].self_attn.num_heads
                if run.system == "full":  # every head of every layer, for every input
                    heads = torch.full((sum(len(target) for _, target in batches), len(layers)), H)
                else:
                    heads, targets = heads_per_input(model, batches)
                assert len(heads) == row["test_examples"], "fairseq-validate did not score every test example"
                row["heads_per_layer"] = heads.float().mean(dim=0).tolist()
                row["head_ratio"] = heads.float().mean().item() / H
                if run.system == "budget":
                    row["spread"] = spread(heads, targets, labels)
                rows.append(row)
            log(f"{dataset} seed {seed}: analysed")
    return rows


def spread(heads: torch.Tensor, targets: torch.Tensor, labels) -> dict:
    """How the per-input budget varies: per layer (std, range, share of inputs at the
    most common count) and per gold class (mean heads per layer)."""
    per_layer = []
    for layer in heads.t():
        mode_share = torch.bincount(layer).max().item() / len(layer)
        per_layer.append({"mean": layer.float().mean().item(), "std": layer.float().std().item(),
                          "min": int(layer.min()), "max": int(layer.max()), "share_at_mode": mode_share})
    per_class = {
        labels.string([c + labels.nspecial]): heads[targets == c].float().mean(dim=0).tolist()
        for c in sorted(set(targets.tolist()))
    }
    return {"per_layer": per_layer, "per_class": per_class}


# ----------------------------------------------------------------- reporting


def summarise(rows: list, cfg) -> dict:
    summary = {}
    for dataset in cfg.datasets:
        summary[dataset] = {}
        for system in SYSTEMS:
            mine = [r for r in rows if r["dataset"] == dataset and r["system"] == system]
            test_mean, test_std = mean_std([r["test_accuracy"] for r in mine])
            layers = len(mine[0]["heads_per_layer"])
            summary[dataset][system] = {
                "test_accuracy_mean": test_mean, "test_accuracy_std": test_std,
                "dev_accuracy_mean": statistics.mean(r["dev_accuracy"] for r in mine),
                "heads_per_layer": [statistics.mean(r["heads_per_layer"][i] for r in mine) for i in range(layers)],
                **{key: statistics.mean(r[key] for r in mine)
                   for key in ("head_ratio", "attn_flops_ratio", "flops_ratio", "latency_ratio", "train_wall_s")},
                "seeds": len(mine),
            }
    return summary


def pooled_spread(rows: list, dataset: str) -> dict:
    """The budget system's spread, averaged over seeds."""
    spreads = [r["spread"] for r in rows if r["dataset"] == dataset and r["system"] == "budget"]
    layers = len(spreads[0]["per_layer"])
    per_layer = [{key: statistics.mean(s["per_layer"][i][key] for s in spreads)
                  for key in ("mean", "std", "share_at_mode")} |
                 {"min": min(s["per_layer"][i]["min"] for s in spreads),
                  "max": max(s["per_layer"][i]["max"] for s in spreads)} for i in range(layers)]
    classes = spreads[0]["per_class"].keys()
    per_class = {c: [statistics.mean(s["per_class"][c][i] for s in spreads) for i in range(layers)] for c in classes}
    return {"per_layer": per_layer, "per_class": per_class}


def targets(summary: dict, spreads: dict) -> list:
    """Every target of the study, held or not, with the numbers that decide it."""
    found = []
    for dataset, systems in summary.items():
        full, budget = systems["full"], systems["budget"]
        gap = budget["test_accuracy_mean"] - full["test_accuracy_mean"]
        found.append({
            "dataset": dataset, "target": "BudgetFormer >= full attention - 0.5 points at head ratio <= 0.5",
            "held": gap >= -0.5 and budget["head_ratio"] <= 0.5,
            "detail": f"{budget['test_accuracy_mean']:.2f} vs {full['test_accuracy_mean']:.2f} ({gap:+.2f} points) "
                      f"at head ratio {budget['head_ratio']:.3f}, whole-model FLOPs ratio {budget['flops_ratio']:.3f}",
        })
        for other in ("static", "random"):
            diff = budget["test_accuracy_mean"] - systems[other]["test_accuracy_mean"]
            found.append({
                "dataset": dataset, "target": f"BudgetFormer beats {DESCRIPTION[other]} at the same budget",
                "held": diff > 0,
                "detail": f"{diff:+.2f} points (head ratio {budget['head_ratio']:.3f} vs "
                          f"{systems[other]['head_ratio']:.3f})",
            })
        diff = budget["test_accuracy_mean"] - systems["no_explore"]["test_accuracy_mean"]
        found.append({
            "dataset": dataset, "target": "what the exploration schedule contributes (reported either way)",
            "held": None, "detail": f"{diff:+.2f} points with exploration (head ratio {budget['head_ratio']:.3f} "
                                    f"vs {systems['no_explore']['head_ratio']:.3f} without)",
        })
        layers = spreads[dataset]["per_layer"]
        stds = [layer["std"] for layer in layers]
        classes = spreads[dataset]["per_class"]
        class_gap = max(max(v[i] for v in classes.values()) - min(v[i] for v in classes.values())
                        for i in range(len(layers)))
        found.append({
            "dataset": dataset, "target": "per-input budgets vary with the input",
            "held": max(stds) >= 0.1,
            "detail": f"std of heads over test inputs per layer {', '.join(f'{s:.2f}' for s in stds)}; "
                      f"largest gap between class means in a layer {class_gap:.2f} heads",
        })
    return found


def paragraph(found: list, wall_s: float, cfg) -> str:
    verdict = {True: "holds", False: "is missed", None: "(reported)"}
    sentences = [f"{len(cfg.seeds)} seeds per system; the whole study took {wall_s / 60:.0f} minutes "
                 f"({cfg.jobs} trainings at a time on {os.cpu_count()} cores)."]
    for t in found:
        sentences.append(f"{t['dataset']}: \"{t['target']}\" {verdict[t['held']]}: {t['detail']}.")
    return " ".join(sentences)


def markdown(summary, spreads, found, text) -> str:
    lines = []
    for dataset, systems in summary.items():
        lines += [f"### {dataset} (test accuracy: mean +- std over seeds; ratios against full attention)", "",
                  "| system | test acc | dev acc | heads/layer | head ratio | attn FLOPs ratio "
                  "| model FLOPs ratio | latency ratio (b32) | train wall (s) |", "|" + "---|" * 9]
        for system, s in systems.items():
            heads = " ".join(f"{h:.2f}" for h in s["heads_per_layer"])
            lines.append(f"| {DESCRIPTION[system]} | {s['test_accuracy_mean']:.2f} +- {s['test_accuracy_std']:.2f} "
                         f"| {s['dev_accuracy_mean']:.2f} | {heads} | {s['head_ratio']:.3f} "
                         f"| {s['attn_flops_ratio']:.3f} | {s['flops_ratio']:.3f} | {s['latency_ratio']:.3f} "
                         f"| {s['train_wall_s']:.0f} |")
        spread_ = spreads[dataset]
        classes = list(spread_["per_class"])
        lines += ["", f"BudgetFormer's heads per input on {dataset} test (mean over seeds):", "",
                  "| layer | mean | std | min | max | share at mode | "
                  + " | ".join(f"class {c}" for c in classes) + " |",
                  "|" + "---|" * (6 + len(classes))]
        for i, layer in enumerate(spread_["per_layer"]):
            by_class = " | ".join(f"{spread_['per_class'][c][i]:.2f}" for c in classes)
            lines.append(f"| {i} | {layer['mean']:.2f} | {layer['std']:.2f} | {layer['min']} | {layer['max']} "
                         f"| {layer['share_at_mode']:.2f} | {by_class} |")
        lines.append("")
    lines += ["### Targets", "", "| data set | target | held | numbers |", "|---|---|---|---|"]
    for t in found:
        held = {True: "yes", False: "**no**", None: "-"}[t["held"]]
        lines.append(f"| {t['dataset']} | {t['target']} | {held} | {t['detail']} |")
    return "\n".join(lines + ["", text, ""])


def plot(rows, cfg, path: Path):
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its debug lines are not ours to print
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("no matplotlib: no plot (pip install -e '.[viz]')")
        return None
    fig, axes = plt.subplots(1, len(cfg.datasets), figsize=(5 * len(cfg.datasets), 4), squeeze=False)
    for ax, dataset in zip(axes[0], cfg.datasets):
        for system, marker in zip(SYSTEMS, "osD^v"):
            mine = [r for r in rows if r["dataset"] == dataset and r["system"] == system]
            ax.scatter([r["flops_ratio"] for r in mine], [r["test_accuracy"] for r in mine],
                       marker=marker, label=DESCRIPTION[system], alpha=0.8)
        ax.set_title(f"{dataset}: one point per seed")
        ax.set_xlabel("whole-model FLOPs ratio (vs full attention)")
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
    return path


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_study_arguments(parser, REPO, datasets=["MR", "TREC"], save_dir="reproduce")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--latency-repeats", type=int, default=5)
    parser.add_argument("--latency-batches", type=int, default=12,
                        help="the first N test batches (of 32) are timed; FLOPs and heads cover all of them")
    parser.add_argument("--quick", action="store_true",
                        help="tiny models, 20 updates, 2 latency repeats: keeps the script working in the tests")
    cfg = check_study_arguments(parser, parser.parse_args(argv))
    if cfg.quick:
        cfg.latency_repeats = 2
    if cfg.latency_batches < 1:
        parser.error("--latency-batches must be >= 1")
    return cfg


def main(argv=None):
    cfg = parse_args(argv)
    start = time.time()
    known = [d for d in cfg.datasets if d in ("MR", "TREC") and not (cfg.data_dir / f"{d}-bin").exists()]
    if known:
        log(f"preparing {' '.join(known)} (scripts/get_data.py)")
        subprocess.run([sys.executable, REPO / "scripts" / "get_data.py", "--datasets", *known,
                        "--out-dir", cfg.data_dir], check=True)
    for dataset in cfg.datasets:
        for split in ("train", "valid", "test"):
            if not (cfg.data_dir / f"{dataset}-bin" / "input0" / f"{split}.bin").exists():
                raise SystemExit(f"error: {cfg.data_dir / f'{dataset}-bin'} has no binarized {split} split "
                                 "(expected input0/{split}.bin, label/{split}.bin)")
    log(f"training {len(cfg.datasets) * len(cfg.seeds) * len(SYSTEMS)} runs, {cfg.jobs} at a time, "
        f"updates {cfg.updates}")
    records = train_all(cfg)
    torch.set_num_threads(os.cpu_count() or 1)
    rows = analyse(cfg, records)
    summary = summarise(rows, cfg)
    spreads = {d: pooled_spread(rows, d) for d in cfg.datasets}
    found = targets(summary, spreads)
    wall = time.time() - start
    text = paragraph(found, wall, cfg)
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    figure = plot(rows, cfg, cfg.out_dir / "reproduce_accuracy_vs_flops.png")
    report = {
        "config": {"datasets": cfg.datasets, "seeds": cfg.seeds, "updates": cfg.updates, "lr": cfg.lr,
                   "size": "budgetformer_tiny" if cfg.quick else "budgetformer_small", "jobs": cfg.jobs,
                   "threads_per_job": cfg.threads_per_job, "exploration_share": EXPLORATION_SHARE,
                   "torch": torch.__version__, "wall_s": round(wall, 1),
                   "latency": f"batch 32, first {cfg.latency_batches} test batches, median of interleaved rounds",
                   **machine_info(torch.device("cpu"))},
        "summary": summary, "budget_spread": spreads, "targets": found, "paragraph": text, "runs": rows,
        "plot": str(figure) if figure else None,
    }
    write_json(cfg.out_dir / "reproduce.json", report)
    table = markdown(summary, spreads, found, text)
    write_atomic(cfg.out_dir / "reproduce.md", table)
    print("\n" + table)
    log(f"written {cfg.out_dir / 'reproduce.md'}, {cfg.out_dir / 'reproduce.json'}" + (f", {figure}" if figure else ""))


if __name__ == "__main__":
    main()
