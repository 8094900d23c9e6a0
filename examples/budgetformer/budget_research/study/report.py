"""The study's results as values: a row per finished run (its record and measurements),
means over seeds, the issue's targets held, missed or pending, and the per-input spread and
head choice of the learned systems pooled over seeds. render.py turns them into text."""

import json
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from budget_research.study.measure import Measured
from budget_research.study.plan import DESCRIPTION, FIXED, LEARNED, RATIOS, Plan, StudyConfig

MEANS = ("head_ratio", "flops_ratio", "attn_flops_ratio", "latency_b1_ratio", "latency_b32_ratio", "train_wall_s")
SLACK = {RATIOS[0]: 0.5, RATIOS[1]: 1.0}  # points of test accuracy a learned system may lose to dense
MARGIN = 0.5  # points by which it should beat the best fixed baseline at the lower ratio


@dataclass
class Results:
    """Everything the report shows, computed from the records and measurements."""

    rows: List[dict]
    summary: Dict[str, Dict[str, dict]]
    targets: List[dict]
    spreads: Dict[Tuple[str, str], dict]
    head_sets: Dict[Tuple[str, str], dict]
    others: List[dict]  # records outside the current plan
    compute_s: float  # the trainings' wall time, divided by the trainings run at a time


def mean_std(values: Sequence[float], ndigits: Optional[int] = None) -> Tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    mean, std = statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)
    return (mean, std) if ndigits is None else (round(mean, ndigits), round(std, ndigits))


def results(plan: Plan, measured: Dict[Tuple[str, int], Measured]) -> Results:
    cfg = plan.cfg
    rows = rows_of(plan, measured)
    summary = summarise(rows, cfg)
    names = list(dict.fromkeys(r["name"] for r in rows))
    spreads = {(d, name): s for d in cfg.datasets for name in names
               if name.split("-")[0] in LEARNED and (s := pooled_spread(rows, d, name))}
    sets = {(d, name): s for d in cfg.datasets for name in names if (s := pooled_head_sets(rows, d, name))}
    planned = {r.record(cfg) for r in plan.runs}
    others = [json.loads(path.read_text()) for path in sorted(cfg.records.glob("*/*-seed*.json"))
              if path not in planned and not path.name.startswith(("measured", "heads"))]
    compute = sum(r["train_wall_s"] for r in rows + others) / cfg.jobs
    return Results(rows, summary, targets(summary, plan), spreads, sets, others, compute)


def rows_of(plan: Plan, measured: Dict[Tuple[str, int], Measured]) -> List[dict]:
    """A row per finished run: its record, and its measurements once its group has them."""
    rows = []
    for dataset in plan.cfg.datasets:
        for seed in plan.cfg.seeds:
            found = measured.get((dataset, seed), Measured())
            for r in plan.group(dataset, seed):
                if r not in plan.records:
                    continue
                row = dict(plan.records[r], name=r.name)
                row.pop("importance", None)
                if found.runs:
                    mine, dense = found.runs[r.name], found.runs["dense"]
                    row.update(mine, head_ratio=statistics.mean(mine["heads_per_layer"]) / plan.cfg.heads,
                               flops_ratio=mine["model_flops"] / dense["model_flops"],
                               attn_flops_ratio=mine["attn_flops"] / dense["attn_flops"],
                               latency_b1_ratio=mine["latency_b1_ms"] / dense["latency_b1_ms"],
                               latency_b32_ratio=mine["latency_b32_ms"] / dense["latency_b32_ms"])
                if found.head_sets and r.name in found.head_sets:
                    row["head_sets"] = found.head_sets[r.name]
                rows.append(row)
    return rows


def summarise(rows: List[dict], cfg: StudyConfig) -> Dict[str, Dict[str, dict]]:
    """Per data set and run name: means (and test std) over the seeds done."""
    summary = {}
    for dataset in cfg.datasets:
        summary[dataset] = {}
        for name in dict.fromkeys(r["name"] for r in rows if r["dataset"] == dataset):
            mine = [r for r in rows if r["dataset"] == dataset and r["name"] == name]
            test_mean, test_std = mean_std([r["test_accuracy"] for r in mine])
            s = {"system": mine[0]["system"], "ratio": mine[0]["ratio"], "seeds": [r["seed"] for r in mine],
                 "test_accuracy": [r["test_accuracy"] for r in mine], "test_accuracy_mean": test_mean,
                 "test_accuracy_std": test_std, "dev_accuracy_mean": statistics.mean(r["dev_accuracy"] for r in mine),
                 "dev_heads_per_layer": [statistics.mean(h) for h in zip(*(r["dev_heads_per_layer"] for r in mine))]}
            measured = [r for r in mine if "flops_ratio" in r]
            if measured:
                s["measured_seeds"] = len(measured)
                s.update({key: statistics.mean(r[key] for r in measured) for key in MEANS})
                s["heads_per_layer"] = [statistics.mean(h) for h in zip(*(r["heads_per_layer"] for r in measured))]
            summary[dataset][name] = s
    return summary


def complete(s: Optional[dict], cfg: StudyConfig) -> bool:
    """Every seed trained and measured."""
    return s is not None and len(s["seeds"]) == len(cfg.seeds) and s.get("measured_seeds") == len(cfg.seeds)


def target(dataset: str, text: str, held: Optional[bool], detail: str) -> dict:
    return {"dataset": dataset, "target": text, "held": held, "detail": detail}


def targets(summary: dict, plan: Plan) -> List[dict]:
    """The issue's targets, held, missed, or pending (runs not done), with their numbers:
    per data set, the chosen learned system within SLACK of dense at each ratio, and its
    margin over the best fixed baseline at the lower ratio; then that margin over all."""
    cfg, found, beats = plan.cfg, [], []  # beats: per data set, (held, worse by more than a std) or None
    for dataset, systems in summary.items():
        dense, chosen = systems.get("dense"), plan.choice[dataset]
        for ratio in RATIOS:
            text = (f"BudgetFormer ({chosen or 'chosen on dev'}) within {SLACK[ratio]} points of dense "
                    f"at head ratio <= {ratio}")
            learned = systems.get(f"{chosen}-{ratio}")
            if not (complete(dense, cfg) and complete(learned, cfg)):
                found.append(target(dataset, text, None, "pending: runs not done"))
                continue
            gap = learned["test_accuracy_mean"] - dense["test_accuracy_mean"]
            over = learned["head_ratio"] > ratio + 1e-9  # on test: the budget is learned, not imposed
            found.append(target(dataset, text, gap >= -SLACK[ratio] and not over,
                                f"{learned['test_accuracy_mean']:.2f} vs {dense['test_accuracy_mean']:.2f} "
                                f"({gap:+.2f} points) at head ratio {learned['head_ratio']:.3f}"
                                f"{f' (over {ratio})' if over else ''}, "
                                f"model FLOPs ratio {learned['flops_ratio']:.3f}"))
        learned = systems.get(f"{chosen}-{RATIOS[1]}")
        fixed = [systems.get(f"{system}-{RATIOS[1]}") for system in FIXED]
        text = (f"at {RATIOS[1]}: beats the best static baseline by >= {MARGIN} points (never worse by > 1 seed "
                "std)")
        if not (complete(learned, cfg) and all(complete(s, cfg) for s in fixed)):
            found.append(target(dataset, text, None, "pending: runs not done"))
            beats.append(None)
            continue
        best = max(fixed, key=lambda s: s["test_accuracy_mean"])
        margin = learned["test_accuracy_mean"] - best["test_accuracy_mean"]
        worse = margin < -learned["test_accuracy_std"]
        beats.append((margin >= MARGIN, worse))
        found.append(target(dataset, text, margin >= MARGIN,
                            f"{margin:+.2f} points over {DESCRIPTION[best['system']]} "
                            f"({best['test_accuracy_mean']:.2f}); one seed std: {learned['test_accuracy_std']:.2f}; "
                            f"worse by more: {'yes' if worse else 'no'}"))
    if beats and None not in beats:
        wins = sum(held for held, _ in beats)
        never_worse = not any(worse for _, worse in beats)
        found.append(target("all", f"beats the static baselines at {RATIOS[1]} on >= 2 of 3 data sets, never worse "
                            "by more than one seed std", wins >= 2 and never_worse,
                            f"wins on {wins} of {len(beats)}; never worse by more than a std: {never_worse}"))
    return found


def pooled_spread(rows: List[dict], dataset: str, name: str) -> Optional[dict]:
    """A learned system's spread of heads per test input, averaged over its seeds."""
    spreads = [r["spread"] for r in rows if r["dataset"] == dataset and r["name"] == name and "spread" in r]
    if not spreads:
        return None
    layers = range(len(spreads[0]["per_layer"]))
    per_layer = [{key: statistics.mean(s["per_layer"][i][key] for s in spreads)
                  for key in ("mean", "std", "share_at_mode")}
                 | {"min": min(s["per_layer"][i]["min"] for s in spreads),
                    "max": max(s["per_layer"][i]["max"] for s in spreads)} for i in layers]
    classes = spreads[0]["per_class"]
    per_class = {c: [statistics.mean(s["per_class"][c][i] for s in spreads) for i in layers] for c in classes}
    return {"per_layer": per_layer, "per_class": per_class, "seeds": len(spreads)}


def pooled_head_sets(rows: List[dict], dataset: str, name: str) -> Optional[dict]:
    """A learned run's head choice per layer (``head_sets``), averaged over its seeds."""
    found = [r["head_sets"] for r in rows if r["dataset"] == dataset and r["name"] == name and "head_sets" in r]
    if not found:
        return None
    keys = ("share_at_modal_set", "distinct_sets", "importance_agreement", "chance")
    per_layer = [{key: statistics.mean(seed[i][key] for seed in found) for key in keys}
                 | {"use": [statistics.mean(u) for u in zip(*(seed[i]["use"] for seed in found))]}
                 for i in range(len(found[0]))]
    return {"per_layer": per_layer, "seeds": len(found)}
