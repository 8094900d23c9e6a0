"""Measuring the study's checkpoints once all runs of a data set and seed are done: FLOPs
(whole model and attention, routers included), the heads each test input ran and CPU
latency at batch 1 and 32 against ``dense`` (the models interleaved), and which heads the
learned runs chose per test input against the dense model's importance ranking. Each is
cached beside the records (measured-seedN.json, heads-seedN.json) and redone only when a
record it was made from changed."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

from budget_plugin.tools.checkpoints import load_checkpoint
from budget_plugin.tools.evaluation import count_flops, heads_per_input, split_batches
from budget_plugin.tools.files import write_json
from budget_plugin.tools.progress import log
from budget_research.study.plan import LEARNED, Plan, Run, cores
from budget_research.timing import latencies


@dataclass
class Measured:
    """A data set and seed's measurements: ``runs`` by run name (None until the group is
    complete), and the learned runs' head choice by run name (None until measured)."""

    runs: Optional[Dict[str, dict]] = None
    head_sets: Optional[Dict[str, List[dict]]] = None


def measure_all(plan: Plan) -> Dict[Tuple[str, int], Measured]:
    """Every complete data set and seed of the plan, measured (or read from its cache)."""
    torch.set_num_threads(cores())  # one model at a time: every core the study may use
    found = {}
    for dataset in plan.cfg.datasets:
        for seed in plan.cfg.seeds:
            group = measure_group(plan, dataset, seed)
            chosen = which_heads(plan, dataset, seed) if group else None
            found[dataset, seed] = Measured(group and group["runs"], chosen and chosen["runs"])
    return found


def stamp_of(plan: Plan, runs: List[Run]) -> Dict[str, str]:
    """When each run's record was written: a cached group is valid for these records only."""
    return {r.name: plan.records[r]["finished"] for r in runs}


def cached_group(path: Path, stamp: Dict[str, str]) -> Optional[dict]:
    group = json.loads(path.read_text()) if path.exists() else None
    return group if group and group["finished"] == stamp else None


def measure_group(plan: Plan, dataset: str, seed: int) -> Optional[dict]:
    """FLOPs, heads per test input and CPU latency of a data set and seed's runs side by
    side (cached). None until every run is done."""
    if not plan.complete(dataset, seed):
        return None
    cfg, runs = plan.cfg, plan.group(dataset, seed)
    path, stamp = cfg.records / dataset / f"measured-seed{seed}.json", stamp_of(plan, runs)
    if (group := cached_group(path, stamp)) is not None:
        return group
    log(f"{dataset} seed {seed}: FLOPs, heads and latency of {len(runs)} checkpoints side by side")
    data = runs[0].data(cfg)
    found = measure_checkpoints({r.name: r.checkpoints(cfg) / "checkpoint_best.pt" for r in runs}, data,
                                cfg.latency.repeats, singles=cfg.latency.examples, timed_batches=cfg.latency.batches)
    labels = load_labels(data)
    measured = {}
    for name, values in found.items():
        heads = values.pop("heads", None)
        targets = values.pop("targets", None)
        if heads is None:  # dense: every head of every layer
            values.update(heads_per_layer=[float(cfg.heads)] * cfg.layers)
        else:
            values.update(heads_per_layer=heads.float().mean(0).tolist(), spread=spread(heads, targets, labels))
        measured[name] = values
    group = {"finished": stamp, "threads": torch.get_num_threads(), "runs": measured}
    write_json(path, group)
    return group


def load_labels(data: Path) -> List[str]:
    """Class index -> label, as fairseq's label dictionary orders them (after its 4 specials)."""
    return [line.split()[0] for line in (data / "label" / "dict.txt").read_text().splitlines() if line.strip()]


def spread(heads: torch.Tensor, targets: torch.Tensor, labels: List[str]) -> dict:
    """How the per-input budget varies: per layer (mean, std, range, share of inputs at
    the most common count) and per gold class (mean heads per layer)."""
    per_layer = [{"mean": layer.float().mean().item(), "std": layer.float().std().item(), "min": int(layer.min()),
                  "max": int(layer.max()), "share_at_mode": torch.bincount(layer).max().item() / len(layer)}
                 for layer in heads.long().t()]
    per_class = {labels[c]: heads[targets == c].float().mean(dim=0).tolist() for c in sorted(set(targets.tolist()))}
    return {"per_layer": per_layer, "per_class": per_class}


def which_heads(plan: Plan, dataset: str, seed: int) -> Optional[dict]:
    """Which heads the learned runs of a data set and seed chose for each test input,
    against the dense model's head importance (cached). None until the learned runs and
    the dense one are all done."""
    cfg = plan.cfg
    runs = [r for r in plan.group(dataset, seed) if r.system in LEARNED]
    dense = Run(dataset, "dense", seed)
    if len(runs) < len(LEARNED) + 1 or not all(r in plan.records for r in runs + [dense]):
        return None
    path, stamp = cfg.records / dataset / f"heads-seed{seed}.json", stamp_of(plan, runs + [dense])
    if (group := cached_group(path, stamp)) is not None:
        return group
    log(f"{dataset} seed {seed}: the heads {len(runs)} learned runs chose per test input")
    chosen = {}
    for r in runs:
        model, task = load_checkpoint(r.checkpoints(cfg) / "checkpoint_best.pt", r.data(cfg))
        selected, _ = heads_per_input(model, split_batches(task, 32))
        chosen[r.name] = head_sets(selected, plan.records[dense]["importance"])
    group = {"finished": stamp, "runs": chosen}
    write_json(path, group)
    return group


def head_sets(selected: torch.Tensor, importance: List[List[float]]) -> List[dict]:
    """Per layer, from N x L x H selections: the share of inputs that ran the layer's most
    common head set, the number of distinct sets, how often each head ran, and how far
    the choice agrees with the importance ranking: the share of an input's k heads that
    are among the layer's k most important (``chance``: k / H, what random heads get)."""
    layers = []
    for sel, scores in zip(selected.transpose(0, 1), importance):
        _, counts = torch.unique(sel, dim=0, return_counts=True)
        k = sel.sum(-1)
        rank = torch.tensor(scores).argsort(descending=True).argsort()  # 0: the most important head
        top_k = rank.unsqueeze(0) < k.unsqueeze(1)
        layers.append({"share_at_modal_set": counts.max().item() / len(sel), "distinct_sets": len(counts),
                       "use": sel.float().mean(0).tolist(),
                       "importance_agreement": ((sel & top_k).sum(-1) / k.clamp(min=1)).mean().item(),
                       "chance": (k / sel.size(-1)).float().mean().item()})
    return layers


def measure_checkpoints(checkpoints: Dict[str, Path], data: Path, repeats: int, singles: int = 64,
                        timed_batches: Optional[int] = None) -> Dict[str, dict]:
    """Side by side on the test split, per named checkpoint: CPU latency at batch 1 (the
    first ``singles`` examples) and 32 (the first ``timed_batches`` batches; all by
    default), the models interleaved; FLOPs over every example; and for models with
    head budgets the heads each input ran (``heads``: N x L) and its gold class
    (``targets``)."""
    loaded = {name: load_checkpoint(path, data) for name, path in checkpoints.items()}
    task = next(iter(loaded.values()))[1]
    models = [model for model, _ in loaded.values()]
    found = {name: {} for name in loaded}
    batches = split_batches(task, 32)
    for batch_size, timed in ((1, split_batches(task, 1)[:singles]), (32, batches[:timed_batches])):
        seconds = latencies(models, timed, repeats)
        for name, t in zip(loaded, seconds):
            found[name][f"latency_b{batch_size}_ms"] = 1000 * t / len(timed)
    for name, (model, _) in loaded.items():
        flops = count_flops(model, batches)
        found[name].update(model_flops=flops.total, attn_flops=flops.attention)
        if hasattr(model, "budgeted_attentions"):
            selected, found[name]["targets"] = heads_per_input(model, batches)
            found[name]["heads"] = selected.sum(-1)
    return found
