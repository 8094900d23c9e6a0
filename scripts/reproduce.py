#!/usr/bin/env python3
"""The accuracy study on a pretrained encoder: does a per-input head budget match the
dense model at a fraction of the heads, and beat the best fixed head subset?

Every system is fine-tuned from the same converted all-MiniLM-L6-v2 (6 layers, 12 heads),
with the same data order, seed, learning rate (1e-4, batch 32, 6% warmup) and update
budget per data set (UPDATES: 270 on TREC, 240 on MR, 60 on BBC News cut to 128 tokens,
so that the 90 runs fit about 4 hours on 2 cores):

  dense       fairseq's own ``roberta``: every head (the model users ship today)
  budget      BudgetFormer as the README recommends (learned per-input budget and
              relevance, --router-scale 10, target head ratio r), its router started
              at the target budget, budget term weight 10 (chosen on TREC's dev split
              before the study: results/reproduce/trials.json, in the report)
  distill     the same, distilled from ``dense`` of the same seed (the teacher's
              logits on the training set, cached once: --distill-logits)
  prior       the same as ``budget``, its relevance started from the head importance of
              ``dense`` of the same seed (--relevance-prior): the importance ranking is
              every input's first choice, and what depends on the input is learned on
              top (added after the first seed's runs showed importance pruning ahead)
  importance  static pruning (Michel et al. 2019): the heads of highest importance of
              ``dense`` of the same seed (|dL/dgate| on the first 2048 training
              examples), fine-tuned from the pretrained weights like the others
  static      --head-selection static: one learned head subset per layer
  random      --head-selection random: per input, uniformly random heads

At head ratio r = 0.5: all of them. At r = 0.3: the best of the learned systems
(by dev accuracy at 0.5, on the first seed) and the three fixed baselines. The fixed
baselines run, per layer, the mean number of heads that the learned system of the same
seed and budget ran on dev (importance and static round it; random meets it on average).

Per run: train, keep the best checkpoint on dev, score dev and test once with
fairseq-validate; the record (results/reproduce/DATASET/RUN-seedN.json) is written last
and atomically, and committed: a run with a record is never trained again. Per data set
and seed, once all its runs are done: FLOPs (whole model and attention, routers included),
the heads each test input ran, and CPU latency at batch 1 and 32 against ``dense`` (the
models interleaved, median of repeats), and which heads the learned runs chose per test
input against the dense model's importance ranking, cached beside the records. Then
results/reproduce.{md,json} and results/reproduce_accuracy_vs_flops.png, with the
targets and a paragraph generated from the numbers. Runs not yet done are reported as
missing; run the script again to go on (``--stop-after`` ends a session cleanly).

    python scripts/reproduce.py                       # MR, TREC, BBC News x 3 seeds (~4 h here)
    python scripts/reproduce.py --stop-after 120      # start no training after 120 minutes
    python scripts/reproduce.py --report-only         # the report from the records so far
"""

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional

logging.basicConfig(level=logging.WARNING)  # before fairseq sets up INFO logging

import torch  # noqa: E402

from budget_plugin.tools import finetune  # noqa: E402
from budget_plugin.tools.binarize import count_binarized  # noqa: E402
from budget_plugin.tools.fairseq_cli import run as run_command, validate  # noqa: E402
from budget_plugin.tools.files import atomic_path, write_atomic, write_json  # noqa: E402
from budget_plugin.tools.importance import kept_heads, kept_heads_option  # noqa: E402
from budget_plugin.tools.measure import heads_per_input, load_checkpoint, measure_checkpoints, split_batches  # noqa: E402,E501
from budget_plugin.tools.study import cached_record, heads_per_layer, log, mean_std, num_classes, parse_updates  # noqa: E402,E501
from budget_plugin.tools.timing import machine_info  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
# the update budget per data set: 2 epochs of TREC, 0.75 of MR, 1.1 of BBC News at 128
# tokens, so that 90 runs fit about 4 hours on 2 cores
UPDATES = {"TREC": 270, "MR": 240, "BBC": 60}
TRUNCATE = {"BBC": 126}  # BBC News's first 126 pieces: 128 positions with <s> and </s>
RATIOS = (0.5, 0.3)
# the target ratio the budget term aims at: a layer runs a whole number of heads, and
# 0.3 x 12 = 3.6 rounds up to 4 for most inputs (0.32 on TREC's dev split aiming at 0.3)
AIM = {0.5: 0.5, 0.3: 0.28}
LEARNED = ("budget", "distill", "prior")
FIXED = ("importance", "static", "random")
# the learned systems' router starts at the target budget instead of every head, and
# the budget term weighs 10: with the defaults (every head, 1) the mean stayed 0.09 above
# the target after 270 updates on TREC (scripts/reproduce.py's docstring lists the trials)
BUDGET_WEIGHT = 10.0
IMPORTANCE_EXAMPLES = 2048  # importance averaged over the first 2048 training examples
DESCRIPTION = {
    "dense": "dense (stock fairseq roberta)",
    "budget": "BudgetFormer",
    "distill": "BudgetFormer + distillation",
    "prior": "BudgetFormer + importance prior",
    "importance": "importance pruning (Michel et al.)",
    "static": "static learned gates",
    "random": "random heads",
}


@dataclass(frozen=True)
class Run:
    dataset: str
    system: str
    seed: int
    ratio: Optional[float] = None  # the head ratio aimed at; None: dense

    @property
    def name(self) -> str:
        return self.system if self.ratio is None else f"{self.system}-{self.ratio}"

    def checkpoints(self, cfg) -> Path:
        return cfg.save_dir / self.dataset / self.name / f"seed{self.seed}"

    def record(self, cfg) -> Path:
        return cfg.records / self.dataset / f"{self.name}-seed{self.seed}.json"


def recipe_of(run: Run, cfg) -> finetune.Recipe:
    """The fine-tuning recipe of every run (what differs is ``run``'s options): dev
    scored three times, the best checkpoint kept without the optimizer's state."""
    updates = cfg.updates[run.dataset]
    return finetune.Recipe(lr=cfg.lr, epochs=99, seed=run.seed, target_head_ratio=AIM.get(run.ratio, 1.0),
                           budget_weight=BUDGET_WEIGHT, start_at_budget=run.system in LEARNED, max_updates=updates,
                           validate_interval_updates=max(1, updates // 3), save_optimizer=False)


def finished(run: Run, cfg) -> Optional[dict]:
    """``run``'s record, if it was trained with today's recipe."""
    return cached_record(run.record(cfg), recipe=asdict(recipe_of(run, cfg)))


def choice(dataset: str, cfg) -> Optional[str]:
    """The learned system that runs at the lower budget: the best of LEARNED on dev at
    0.5 for the first seed (a tie keeps the earlier one); None until all are done."""
    found = [finished(Run(dataset, system, cfg.seeds[0], RATIOS[0]), cfg) for system in LEARNED]
    if None in found:
        return None
    return max(zip(LEARNED, found), key=lambda pair: (pair[1]["dev_accuracy"], -LEARNED.index(pair[0])))[0]


def learned_run(dataset: str, seed: int, ratio: float, cfg) -> Optional[Run]:
    """The run whose dev budget the fixed baselines of ``ratio`` copy: ``budget`` at the
    first ratio (system 2 of the issue), the chosen learned system at the others."""
    system = LEARNED[0] if ratio == RATIOS[0] else choice(dataset, cfg)
    return system and Run(dataset, system, seed, ratio)


def plan(cfg) -> List[Run]:
    """Every run of the study known so far, in the order they should go: a seed at a
    time (the first seed's results come first), data sets in the given order."""
    runs = []
    for seed in cfg.seeds:
        for dataset in cfg.datasets:
            runs.append(Run(dataset, "dense", seed))
            runs += [Run(dataset, system, seed, RATIOS[0]) for system in LEARNED + FIXED]
            for ratio in RATIOS[1:]:
                learned = learned_run(dataset, seed, ratio, cfg)
                if learned:
                    runs += [learned] + [Run(dataset, system, seed, ratio) for system in FIXED]
    return runs


def prerequisites(run: Run, cfg) -> List[Run]:
    dense = Run(run.dataset, "dense", run.seed)
    if run.system in ("distill", "prior"):
        return [dense]
    if run.system in FIXED:
        return [learned_run(run.dataset, run.seed, run.ratio, cfg)] + ([dense] if run.system == "importance" else [])
    return []


# ----------------------------------------------------------------- training


def teacher_logits(dense: Run, cfg) -> Path:
    """The dense model's logits on the training set (computed once per seed)."""
    path = dense.checkpoints(cfg) / "teacher_train.pt"
    if not path.exists():
        run_command([sys.executable, REPO / "scripts" / "teacher_logits.py", "--checkpoint",
                     dense.checkpoints(cfg) / "checkpoint_best.pt", "--data", data_of(dense, cfg), "--out", path],
                    threads=cfg.threads_per_job)
    return path


def head_importance(dense: Run, cfg) -> List[List[float]]:
    path = dense.checkpoints(cfg) / "importance.json"
    run_command([sys.executable, REPO / "scripts" / "head_importance.py", "--checkpoint",
         dense.checkpoints(cfg) / "checkpoint_best.pt", "--data", data_of(dense, cfg), "--heads-per-layer",
         cfg.num_heads, "--max-examples", IMPORTANCE_EXAMPLES, "--out", path], threads=cfg.threads_per_job)
    return json.loads(path.read_text())["importance"]


def data_of(run: Run, cfg) -> Path:
    return cfg.data_dir / f"{run.dataset}-bin"


def system_options(run: Run, cfg) -> List[str]:
    """What ``run`` adds to the recipe's command line (recorded: a change retrains);
    TEACHER stands for the teacher's logits."""
    if run.system == "distill":
        return ["--distill-logits", "TEACHER", "--distill-weight", "0.5", "--distill-temperature", "2"]
    if run.system == "prior":
        importance = finished(Run(run.dataset, "dense", run.seed), cfg)["importance"]
        return ["--relevance-prior", ";".join(",".join(f"{v:.4f}" for v in layer) for layer in importance)]
    if run.system not in FIXED:
        return []
    dev_heads = finished(learned_run(run.dataset, run.seed, run.ratio, cfg), cfg)["dev_heads_per_layer"]
    if run.system == "importance":
        importance = torch.tensor(finished(Run(run.dataset, "dense", run.seed), cfg)["importance"])
        counts = [max(1, round(h)) for h in dev_heads]
        return ["--head-selection", "kept", "--kept-heads", kept_heads_option(kept_heads(importance, counts))]
    return ["--head-selection", run.system, "--fixed-heads", ",".join(f"{h:.2f}" for h in dev_heads)]


def train(run: Run, cfg) -> dict:
    """Fine-tune ``run``, score dev and test once, and write its record."""
    options, recipe = system_options(run, cfg), recipe_of(run, cfg)
    record = cached_record(run.record(cfg), recipe=asdict(recipe), options=options)
    if record is not None:
        return record
    save_dir, data = run.checkpoints(cfg), data_of(run, cfg)
    shutil.rmtree(save_dir, ignore_errors=True)
    save_dir.mkdir(parents=True)
    examples = count_binarized(data / "input0" / "train")
    updates = recipe.updates(examples)
    kind = "dense" if run.system == "dense" else "budget"
    teacher = Run(run.dataset, "dense", run.seed)
    options_here = [str(teacher_logits(teacher, cfg)) if o == "TEACHER" else o for o in options]
    command = [*finetune.command(kind, data, cfg.model_dir, save_dir, recipe, examples, num_classes(data)),
               *options_here]
    start = time.time()
    run_command(command, log_path=save_dir / "train.log", threads=cfg.threads_per_job)
    wall = round(time.time() - start, 1)
    for interval in save_dir.glob("checkpoint_*_*.pt"):  # only the best is kept
        interval.unlink()
    task = "budget_sentence_prediction"
    scores = validate(save_dir / "checkpoint_best.pt", data, ["valid", "test"], task=task,
                      criterion="sentence_prediction" if kind == "dense" else task,
                      log_path=save_dir / "validate.log", threads=cfg.threads_per_job)
    record = {
        "dataset": run.dataset, "system": run.system, "ratio": run.ratio, "seed": run.seed, "updates": updates,
        "lr": cfg.lr, "recipe": asdict(recipe), "options": options, "train_wall_s": wall,
        "dev_accuracy": scores["valid"]["accuracy"],
        "test_accuracy": scores["test"]["accuracy"], "test_examples": int(scores["test"]["bsz"]),
        "dev_heads_per_layer": heads_per_layer(scores["valid"]) if kind == "budget" else [cfg.num_heads] * cfg.layers,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if run.system == "dense":
        record["importance"] = head_importance(run, cfg)
    write_json(run.record(cfg), record)
    log(f"{run.dataset} {run.name} seed {run.seed}: dev {record['dev_accuracy']:.1f} test "
        f"{record['test_accuracy']:.1f}, heads/layer on dev "
        f"{statistics.mean(record['dev_heads_per_layer']):.2f} ({wall:.0f} s)")
    return record


def train_all(cfg) -> None:
    """Every run whose prerequisites are done, ``cfg.jobs`` at a time, until none is
    left or ``--stop-after`` minutes have passed (runs under way finish)."""
    started, pending = set(), {}
    with ThreadPoolExecutor(cfg.jobs) as pool:
        while True:
            late = cfg.stop_after is not None and time.time() - cfg.start > 60 * cfg.stop_after
            for r in [] if late else plan(cfg):
                if len(pending) >= cfg.jobs:
                    break
                # a fixed baseline's record counts only with the budget it copies: train() checks
                if r in started or finished(r, cfg) and r.system not in FIXED:
                    continue
                if all(p is not None and finished(p, cfg) for p in prerequisites(r, cfg)):
                    started.add(r)
                    pending[pool.submit(train, r, cfg)] = r
            if not pending:
                return
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                pending.pop(future)
                future.result()


# ----------------------------------------------------------------- measuring


def stamp_of(records: Dict[str, dict]) -> Dict[str, str]:
    """When each record was written: a cached group is valid for these records only."""
    return {name: record["finished"] for name, record in records.items()}


def cached_group(path: Path, stamp: Dict[str, str]) -> Optional[dict]:
    group = json.loads(path.read_text()) if path.exists() else None
    return group if group and group["finished"] == stamp else None


def measure_group(dataset: str, seed: int, cfg) -> Optional[dict]:
    """FLOPs, heads per test input and CPU latency of a data set and seed's runs side by
    side (cached; redone when a run's record changed). None until every run is done."""
    runs = [r for r in plan(cfg) if r.dataset == dataset and r.seed == seed]
    records = {r.name: finished(r, cfg) for r in runs}
    if len(runs) < 2 + len(LEARNED) + 2 * len(FIXED) or None in records.values():
        return None
    path, stamp = cfg.records / dataset / f"measured-seed{seed}.json", stamp_of(records)
    if (group := cached_group(path, stamp)) is not None:
        return group
    log(f"{dataset} seed {seed}: FLOPs, heads and latency of {len(runs)} checkpoints side by side")
    found = measure_checkpoints({r.name: r.checkpoints(cfg) / "checkpoint_best.pt" for r in runs},
                                cfg.data_dir / f"{dataset}-bin", cfg.latency_repeats, singles=cfg.latency_examples,
                                timed_batches=cfg.latency_batches)
    labels = load_labels(cfg.data_dir / f"{dataset}-bin")
    measured = {}
    for name, values in found.items():
        heads = values.pop("heads", None)
        targets = values.pop("targets", None)
        if heads is None:  # dense: every head of every layer
            values.update(heads_per_layer=[float(cfg.num_heads)] * cfg.layers)
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


def which_heads(dataset: str, seed: int, cfg) -> Optional[dict]:
    """Which heads the learned runs of a data set and seed chose for each test input,
    against the dense model's head importance (cached; redone when a record changed).
    None until the learned runs and the dense one are all done."""
    runs = [r for r in plan(cfg) if (r.dataset, r.seed) == (dataset, seed) and r.system in LEARNED]
    records = {r.name: finished(r, cfg) for r in runs + [Run(dataset, "dense", seed)]}
    if len(runs) < len(LEARNED) + 1 or None in records.values():
        return None
    path, stamp = cfg.records / dataset / f"heads-seed{seed}.json", stamp_of(records)
    if (group := cached_group(path, stamp)) is not None:
        return group
    log(f"{dataset} seed {seed}: the heads {len(runs)} learned runs chose per test input")
    chosen = {}
    for r in runs:
        model, task = load_checkpoint(r.checkpoints(cfg) / "checkpoint_best.pt", data_of(r, cfg))
        selected, _ = heads_per_input(model, split_batches(task, 32))
        chosen[r.name] = head_sets(selected, records["dense"]["importance"])
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


# ----------------------------------------------------------------- reporting


def rows_of(cfg) -> List[dict]:
    """A row per finished run: its record, and its measurements once its group has them."""
    rows, runs = [], plan(cfg)
    for dataset in cfg.datasets:
        for seed in cfg.seeds:
            group = measure_group(dataset, seed, cfg) if cfg.measure else None
            chosen = which_heads(dataset, seed, cfg) if group else None
            for r in runs:
                record = finished(r, cfg) if (r.dataset, r.seed) == (dataset, seed) else None
                if record is None:
                    continue
                row = dict(record, name=r.name)
                row.pop("importance", None)
                if group:
                    mine, dense = group["runs"][r.name], group["runs"]["dense"]
                    row.update(mine, head_ratio=statistics.mean(mine["heads_per_layer"]) / cfg.num_heads,
                               flops_ratio=mine["model_flops"] / dense["model_flops"],
                               attn_flops_ratio=mine["attn_flops"] / dense["attn_flops"],
                               latency_b1_ratio=mine["latency_b1_ms"] / dense["latency_b1_ms"],
                               latency_b32_ratio=mine["latency_b32_ms"] / dense["latency_b32_ms"])
                if chosen and r.name in chosen["runs"]:
                    row["head_sets"] = chosen["runs"][r.name]
                rows.append(row)
    return rows


MEANS = ("head_ratio", "flops_ratio", "attn_flops_ratio", "latency_b1_ratio", "latency_b32_ratio", "train_wall_s")


def summarise(rows: List[dict], cfg) -> Dict[str, Dict[str, dict]]:
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


def complete(s: Optional[dict], cfg) -> bool:
    return s is not None and len(s["seeds"]) == len(cfg.seeds) and s.get("measured_seeds") == len(cfg.seeds)


def targets(summary: dict, cfg) -> List[dict]:
    """The issue's targets, held, missed, or pending (runs not done), with their numbers."""
    found = []

    def add(dataset, target, held, detail):
        found.append({"dataset": dataset, "target": target, "held": held, "detail": detail})

    for dataset, systems in summary.items():
        dense = systems.get("dense")
        chosen = choice(dataset, cfg)
        for ratio, slack in zip(RATIOS, (0.5, 1.0)):
            target = (f"BudgetFormer ({chosen or 'chosen on dev'}) within {slack} points of dense "
                      f"at head ratio <= {ratio}")
            learned = systems.get(f"{chosen}-{ratio}")
            if not (complete(dense, cfg) and complete(learned, cfg)):
                add(dataset, target, None, "pending: runs not done")
                continue
            gap = learned["test_accuracy_mean"] - dense["test_accuracy_mean"]
            over = learned["head_ratio"] > ratio + 1e-9  # on test: the budget is learned, not imposed
            add(dataset, target, gap >= -slack and not over,
                f"{learned['test_accuracy_mean']:.2f} vs {dense['test_accuracy_mean']:.2f} ({gap:+.2f} points) at "
                f"head ratio {learned['head_ratio']:.3f}{f' (over {ratio})' if over else ''}, model FLOPs ratio "
                f"{learned['flops_ratio']:.3f}")
        learned = systems.get(f"{chosen}-{RATIOS[1]}")
        fixed = [systems.get(f"{system}-{RATIOS[1]}") for system in FIXED]
        target = f"at {RATIOS[1]}: beats the best static baseline by >= 0.5 points (never worse by > 1 seed std)"
        if not (complete(learned, cfg) and all(complete(s, cfg) for s in fixed)):
            add(dataset, target, None, "pending: runs not done")
        else:
            best = max(fixed, key=lambda s: s["test_accuracy_mean"])
            margin = learned["test_accuracy_mean"] - best["test_accuracy_mean"]
            add(dataset, target, margin >= 0.5,
                f"{margin:+.2f} points over {DESCRIPTION[best['system']]} ({best['test_accuracy_mean']:.2f}); "
                f"one seed std: {learned['test_accuracy_std']:.2f}; worse by more: "
                f"{'yes' if margin < -learned['test_accuracy_std'] else 'no'}")
    beats = [t for t in found if t["target"].startswith(f"at {RATIOS[1]}")]
    if all(t["held"] is not None for t in beats) and beats:
        wins = sum(t["held"] for t in beats)
        never_worse = not any("worse by more: yes" in t["detail"] for t in beats)
        found.append({"dataset": "all", "target": f"beats the static baselines at {RATIOS[1]} on >= 2 of 3 data sets, "
                      "never worse by more than one seed std", "held": wins >= 2 and never_worse,
                      "detail": f"wins on {wins} of {len(beats)}; never worse by more than a std: {never_worse}"})
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


def head_sets_finding(sets: dict) -> str:
    share = [layer["share_at_modal_set"] for layer in sets["per_layer"]]
    agree = [layer["importance_agreement"] for layer in sets["per_layer"]]
    chance = statistics.mean(layer["chance"] for layer in sets["per_layer"])
    return (f"{min(share):.0%}-{max(share):.0%} of test inputs run their layer's most common head set; "
            f"their heads agree {min(agree):.2f}-{max(agree):.2f} with the dense model's importance ranking "
            f"(chance {chance:.2f})")


def spread_finding(spread_: dict) -> str:
    stds = [layer["std"] for layer in spread_["per_layer"]]
    classes = spread_["per_class"].values()
    class_gap = max(max(c[i] for c in classes) - min(c[i] for c in classes) for i in range(len(stds)))
    varies = "vary with the input" if max(stds) >= 0.1 else "barely vary with the input"
    return (f"per-input budgets {varies}: std over test inputs per layer {', '.join(f'{s:.2f}' for s in stds)}; "
            f"largest gap between class means in a layer {class_gap:.2f} heads")


def paragraph(summary: dict, found: List[dict], spreads: dict, sets: dict, compute_s: float, cfg) -> str:
    verdict = {True: "holds", False: "is missed", None: "is pending"}
    runs = sum(len(s["seeds"]) for systems in summary.values() for s in systems.values())
    text = [f"{runs} runs finished ({len(cfg.seeds)} seeds planned per system); their training took "
            f"{compute_s / 3600:.1f} hours of wall time ({cfg.jobs} trainings at a time on {os.cpu_count()} cores)."]
    for t in found:
        text.append(f"{t['dataset']}: \"{t['target']}\" {verdict[t['held']]} ({t['detail']}).")
    for (dataset, name), spread_ in spreads.items():
        text.append(f"{dataset}, {name}: {spread_finding(spread_)}"
                    + (f"; {head_sets_finding(sets[dataset, name])}." if (dataset, name) in sets else "."))
    return " ".join(text)


def trials_table(trials: dict) -> List[str]:
    """The recipe trials before the study (results/reproduce/trials.json), every one of them."""
    lines = ["### Recipe trials (before the study)", "", trials["about"], "",
             "| target head ratio | options | dev acc (head ratio) at each validation |", "|---|---|---|"]
    for t in trials["trials"]:
        seen = ", ".join(f"{v['dev_accuracy']:.1f} ({v['dev_head_ratio']:.3f}) @{v['updates']}"
                         for v in t["validations"])
        lines.append(f"| {t['target_head_ratio']} | `{' '.join(t['options']) or '(none)'}` | {seen} |")
    return lines + [""]


def other_runs_table(others: List[dict]) -> str:
    """Runs trained before the plan changed (another recipe, or a learned system not
    chosen any more): kept and shown, left out of the summary and the targets."""
    if not others:
        return ""
    lines = ["", "### Runs outside the current plan (kept, not in the summary or the targets)", "",
             "| data set | system | head ratio aimed at | seed | dev acc | test acc | heads/layer on dev |",
             "|---|---|---|---|---|---|---|"]
    for r in others:
        lines.append(f"| {r['dataset']} | {DESCRIPTION[r['system']]} | {r['ratio'] or 1.0} | {r['seed']} "
                     f"| {r['dev_accuracy']:.1f} | {r['test_accuracy']:.1f} "
                     f"| {statistics.mean(r['dev_heads_per_layer']):.2f} |")
    return "\n".join(lines + [""])


def head_sets_table(sets: dict) -> List[str]:
    lines = ["### Which heads the learned runs chose (test inputs, mean over seeds)", "",
             "Per layer: the share of inputs that ran the layer's most common head set, and the "
             "agreement of an input's k heads with the layer's k most important (the dense model's "
             "importance; chance k/H in brackets).", "",
             "| data set | run | seeds | inputs at the most common set, per layer | agreement with importance, "
             "per layer |", "|---|---|---|---|---|"]
    for (dataset, name), s in sets.items():
        share = " ".join(f"{layer['share_at_modal_set']:.2f}" for layer in s["per_layer"])
        agree = " ".join(f"{layer['importance_agreement']:.2f} ({layer['chance']:.2f})" for layer in s["per_layer"])
        lines.append(f"| {dataset} | {name} | {s['seeds']} | {share} | {agree} |")
    return lines + [""]


def markdown(summary: dict, spreads: dict, sets: dict, found: List[dict], text: str, cfg) -> str:
    trials = cfg.records / "trials.json"
    lines = trials_table(json.loads(trials.read_text())) if trials.exists() else []
    for dataset, systems in summary.items():
        lines += [f"### {dataset} (test accuracy: mean +- std over seeds; ratios against dense of the same seed)", "",
                  "| system | head ratio aimed at | seeds | test acc | per seed | dev acc | heads/layer (test) "
                  "| head ratio | attn FLOPs ratio | model FLOPs ratio | latency ratio b1 | latency ratio b32 "
                  "| train wall (s) |", "|" + "---|" * 13]
        for s in systems.values():
            per_seed = " ".join(f"{a:.1f}" for a in s["test_accuracy"])
            if "measured_seeds" in s:
                heads = " ".join(f"{h:.1f}" for h in s["heads_per_layer"])
                measured = (f"{heads} | {s['head_ratio']:.3f} | {s['attn_flops_ratio']:.3f} | {s['flops_ratio']:.3f} "
                            f"| {s['latency_b1_ratio']:.2f} | {s['latency_b32_ratio']:.2f} | {s['train_wall_s']:.0f}")
            else:
                measured = "(not measured: the seed's runs are not all done) | | | | | | "
            lines.append(f"| {DESCRIPTION[s['system']]} | {s['ratio'] or 1.0} | {len(s['seeds'])} "
                         f"| {s['test_accuracy_mean']:.2f} +- {s['test_accuracy_std']:.2f} | {per_seed} "
                         f"| {s['dev_accuracy_mean']:.2f} | {measured} |")
        lines.append("")
    for (dataset, name), spread_ in spreads.items():
        classes = list(spread_["per_class"])
        lines += [f"{DESCRIPTION[name.split('-')[0]]} ({name}) on {dataset}: heads per test input "
                  f"(mean over {spread_['seeds']} seeds)", "",
                  "| layer | mean | std | min | max | share at mode | "
                  + " | ".join(f"class {c}" for c in classes) + " |",
                  "|" + "---|" * (6 + len(classes))]
        for i, layer in enumerate(spread_["per_layer"]):
            by_class = " | ".join(f"{spread_['per_class'][c][i]:.2f}" for c in classes)
            lines.append(f"| {i} | {layer['mean']:.2f} | {layer['std']:.2f} | {layer['min']} | {layer['max']} "
                         f"| {layer['share_at_mode']:.2f} | {by_class} |")
        lines.append("")
    lines += head_sets_table(sets) if sets else []
    lines += ["### Targets", "", "| data set | target | held | numbers |", "|---|---|---|---|"]
    for t in found:
        held = {True: "yes", False: "**no**", None: "pending"}[t["held"]]
        lines.append(f"| {t['dataset']} | {t['target']} | {held} | {t['detail']} |")
    return "\n".join(lines + ["", text, ""])


def plot(rows: List[dict], cfg, path: Path) -> Optional[Path]:
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("no matplotlib: no plot (pip install -e '.[viz]')")
        return None
    rows = [r for r in rows if "flops_ratio" in r]
    if not rows:
        return None
    fig, axes = plt.subplots(1, len(cfg.datasets), figsize=(5.5 * len(cfg.datasets), 4.2), squeeze=False)
    markers = dict(zip(DESCRIPTION, "o*PsD^v"))
    colours = {None: "black", RATIOS[0]: "tab:blue", RATIOS[1]: "tab:red"}
    for ax, dataset in zip(axes[0], cfg.datasets):
        for name in dict.fromkeys(r["name"] for r in rows if r["dataset"] == dataset):
            mine = [r for r in rows if r["dataset"] == dataset and r["name"] == name]
            ax.scatter([r["flops_ratio"] for r in mine], [r["test_accuracy"] for r in mine],
                       marker=markers[mine[0]["system"]], color=colours[mine[0]["ratio"]], alpha=0.75,
                       label=f"{DESCRIPTION[mine[0]['system']]} ({mine[0]['ratio'] or 1.0})")
        ax.set_title(f"{dataset}: one point per seed")
        ax.set_xlabel("whole-model FLOPs ratio (vs dense)")
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
    return path


def report(cfg) -> None:
    torch.set_num_threads(os.cpu_count() or 1)
    rows = rows_of(cfg)
    summary = summarise(rows, cfg)
    found = targets(summary, cfg)
    spreads = {(d, name): s for d in cfg.datasets for name in dict.fromkeys(r["name"] for r in rows)
               if name.split("-")[0] in LEARNED and (s := pooled_spread(rows, d, name))}
    sets = {(d, name): s for d in cfg.datasets for name in dict.fromkeys(r["name"] for r in rows)
            if (s := pooled_head_sets(rows, d, name))}
    planned = {r.record(cfg) for r in plan(cfg)}
    others = [json.loads(path.read_text()) for path in sorted(cfg.records.glob("*/*-seed*.json"))
              if path not in planned and not path.name.startswith(("measured", "heads"))]
    compute = sum(r["train_wall_s"] for r in rows + others) / cfg.jobs
    text = paragraph(summary, found, spreads, sets, compute, cfg)
    figure = plot(rows, cfg, cfg.out_dir / "reproduce_accuracy_vs_flops.png")
    write_json(cfg.out_dir / "reproduce.json", {
        "config": {"datasets": cfg.datasets, "seeds": cfg.seeds, "updates": cfg.updates, "lr": cfg.lr,
                   "ratios": RATIOS, "model": str(cfg.model_dir), "jobs": cfg.jobs, "torch": torch.__version__,
                   "latency": f"batch 1: first {cfg.latency_examples} test examples; batch 32: first "
                              f"{cfg.latency_batches} test batches; median of {cfg.latency_repeats} interleaved rounds",
                   **machine_info(torch.device("cpu"))},
        "choice_at_lower_ratio": {d: choice(d, cfg) for d in cfg.datasets}, "summary": summary,
        "spread": {f"{d}/{name}": s for (d, name), s in spreads.items()},
        "head_sets": {f"{d}/{name}": s for (d, name), s in sets.items()}, "targets": found, "paragraph": text,
        "runs": rows, "other_runs": others, "plot": str(figure) if figure else None})
    table = markdown(summary, spreads, sets, found, text, cfg) + other_runs_table(others)
    write_atomic(cfg.out_dir / "reproduce.md", table)
    print("\n" + table)
    log(f"written {cfg.out_dir / 'reproduce.md'}, {cfg.out_dir / 'reproduce.json'}" + (f", {figure}" if figure else ""))


# ----------------------------------------------------------------- command line


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["TREC", "MR", "BBC"], help="data sets (DATA_DIR/NAME-bin)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--updates", nargs="*", metavar="NAME=N", help=f"updates per data set (default {UPDATES})")
    parser.add_argument("--lr", type=float, default=finetune.Recipe.lr)
    parser.add_argument("--jobs", type=int, default=2, help="trainings at a time (each on cores / jobs threads)")
    parser.add_argument("--data-dir", type=Path, default=REPO / "data" / "minilm",
                        help="binarized data sets, prepared with the model's WordPiece vocabulary when missing")
    parser.add_argument("--model-dir", type=Path, help="the converted encoder (default: DATA_DIR/model, "
                        "all-MiniLM-L6-v2 converted there when missing)")
    parser.add_argument("--out-dir", type=Path, default=REPO / "results",
                        help="the report; the run records in OUT_DIR/reproduce")
    parser.add_argument("--save-dir", type=Path, default=REPO / "checkpoints" / "reproduce")
    parser.add_argument("--stop-after", type=float, metavar="MINUTES", help="start no training after this many minutes")
    parser.add_argument("--report-only", action="store_true", help="train nothing: the report from the records")
    parser.add_argument("--no-measure", dest="measure", action="store_false",
                        help="report accuracies only (no FLOPs or latency)")
    parser.add_argument("--latency-repeats", type=int, default=5)
    parser.add_argument("--latency-batches", type=int, default=8, help="batches of 32 timed (the first N of test)")
    parser.add_argument("--latency-examples", type=int, default=32, help="single examples timed (the first N of test)")
    cfg = parser.parse_args(argv)
    cfg.updates = parse_updates(cfg.updates, UPDATES)
    missing = [d for d in cfg.datasets if d not in cfg.updates]
    if missing:
        parser.error(f"--updates has no number of updates for {', '.join(missing)} (give NAME=N)")
    for name in ("jobs", "latency_repeats", "latency_batches", "latency_examples"):
        if getattr(cfg, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    cfg.model_dir = cfg.model_dir or cfg.data_dir / "model"
    for name, value in vars(cfg).items():
        if isinstance(value, Path):
            setattr(cfg, name, value.resolve())
    cfg.records = cfg.out_dir / "reproduce"
    cfg.threads_per_job = max(1, (os.cpu_count() or 1) // cfg.jobs)
    cfg.start = time.time()
    return cfg


def prepare(cfg) -> None:
    """The converted encoder and the data sets, made when missing."""
    cache = cfg.data_dir.parent / "cache"
    if not (cfg.model_dir / "model.pt").is_file():
        finetune.pretrained_minilm(cfg.model_dir, cache, log)
    for dataset in cfg.datasets:
        if not (cfg.data_dir / f"{dataset}-bin" / "label" / "test.idx").is_file():
            if dataset not in ("MR", "TREC", "BBC"):
                raise SystemExit(f"error: {cfg.data_dir / f'{dataset}-bin'}: no binarized data set "
                                 "(input0/ and label/ with train, valid and test)")
            truncate = ["--truncate-tokens", TRUNCATE[dataset]] if dataset in TRUNCATE else []
            log(f"preparing {dataset} (scripts/get_data.py)")
            finetune.get_data([dataset], cfg.data_dir, cache, cfg.model_dir, *truncate)
    args = finetune.encoder_args(cfg.model_dir / "model.pt")
    cfg.num_heads, cfg.layers = args.encoder_attention_heads, args.encoder_layers


def main(argv=None):
    cfg = parse_args(argv)
    prepare(cfg)
    if not cfg.report_only:
        log(f"{len(cfg.datasets)} data sets x {len(cfg.seeds)} seeds, updates {cfg.updates}, {cfg.jobs} trainings "
            f"at a time; finished runs are read from {cfg.records}")
        train_all(cfg)
    report(cfg)


if __name__ == "__main__":
    main()
