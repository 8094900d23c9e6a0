"""The study's settings and its plan: which runs there are, in which order, what each
needs first and what it adds to the recipe. The plan depends on records (the learned
system that runs at the lower budget is chosen on dev; the fixed baselines copy a learned
run's budget), so it is read from them once and passed on as a value."""

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from budget_plugin.nested import finetune
from budget_plugin.nested.importance import kept_heads, kept_heads_option

# the update budget per data set: 2 epochs of TREC, 0.75 of MR, 1.1 of BBC News at 128
# tokens, so that the 99 runs (11 per data set and seed) fit about 4 hours on 2 cores
UPDATES = {"TREC": 270, "MR": 240, "BBC": 60}
TRUNCATE = {"BBC": 126}  # BBC News's first 126 pieces: 128 positions with <s> and </s>
RATIOS = (0.5, 0.3)
# the target ratio the budget term aims at: a layer runs a whole number of heads, and
# 0.3 x 12 = 3.6 rounds up to 4 for most inputs (0.32 on TREC's dev split aiming at 0.3)
AIM = {0.5: 0.5, 0.3: 0.28}
LEARNED = ("budget", "distill", "prior")
# systems fine-tuned as fairseq's own ``roberta`` (the latency study adds the last two:
# examples/budgetformer/latency_study.py)
ROBERTA = ("dense", "adaprune", "layers4")
FIXED = ("importance", "static", "random")
# the learned systems' router starts at the target budget instead of every head, and
# the budget term weighs 10: with the defaults (every head, 1) the mean stayed 0.09 above
# the target after 270 updates on TREC (results/reproduce/trials.json)
BUDGET_WEIGHT = 10.0
DESCRIPTION = {
    "dense": "dense (stock fairseq roberta)",
    "budget": "BudgetFormer",
    "distill": "BudgetFormer + distillation",
    "prior": "BudgetFormer + importance prior",
    "importance": "importance pruning (Michel et al.)",
    "static": "static learned gates",
    "random": "random heads",
    "adaprune": "fairseq AdaPrune (magnitude)",
    "layers4": "first 4 of 6 layers",
}


@dataclass(frozen=True)
class Latency:
    """What is timed on test: the first ``examples`` one at a time, the first ``batches``
    batches of 32; the median of ``repeats`` interleaved rounds."""

    repeats: int = 5
    batches: int = 8
    examples: int = 32


def cores() -> int:
    """The threads a study may use: OMP_NUM_THREADS where it is set (as torch reads it),
    else every core of the machine."""
    setting = os.environ.get("OMP_NUM_THREADS", "")
    return int(setting) if setting.isdigit() and int(setting) > 0 else os.cpu_count() or 1


@dataclass(frozen=True)
class StudyConfig:
    data_dir: Path  # DATA_DIR/NAME-bin, binarized with the model's WordPiece vocabulary
    model_dir: Path  # the converted encoder (model.pt)
    out_dir: Path  # the report; the run records in OUT_DIR/reproduce
    save_dir: Path  # checkpoints
    datasets: Tuple[str, ...] = ("TREC", "MR", "BBC")
    seeds: Tuple[int, ...] = (1, 2, 3)
    updates: Dict[str, int] = field(default_factory=lambda: dict(UPDATES))
    lr: float = finetune.Recipe.lr
    jobs: int = 2  # trainings at a time
    measure: bool = True  # FLOPs, heads and latency; False: accuracies only
    latency: Latency = Latency()
    heads: int = 0  # the encoder's heads per layer and layers: 0 until read from its model.pt
    layers: int = 0

    @property
    def records(self) -> Path:
        return self.out_dir / "reproduce"

    @property
    def threads_per_job(self) -> int:
        return max(1, cores() // self.jobs)


def parse_updates(items: Optional[Sequence[str]], defaults: Dict[str, int]) -> Dict[str, int]:
    """``NAME=N`` items over the ``defaults``."""
    updates = dict(defaults)
    for item in items or []:
        name, _, value = item.partition("=")
        if not value.isdigit() or int(value) < 1:
            raise SystemExit(f"error: --updates expects NAME=N with N >= 1, got {item!r}")
        updates[name] = int(value)
    return updates


@dataclass(frozen=True)
class Run:
    dataset: str
    system: str
    seed: int
    ratio: Optional[float] = None  # the head ratio aimed at; None: dense

    @property
    def name(self) -> str:
        return self.system if self.ratio is None else f"{self.system}-{self.ratio}"

    def checkpoints(self, cfg: StudyConfig) -> Path:
        return cfg.save_dir / self.dataset / self.name / f"seed{self.seed}"

    def record(self, cfg: StudyConfig) -> Path:
        return cfg.records / self.dataset / f"{self.name}-seed{self.seed}.json"

    def data(self, cfg: StudyConfig) -> Path:
        return cfg.data_dir / f"{self.dataset}-bin"

    def dense(self) -> "Run":
        """The dense run of the same data set and seed (the teacher, the importance)."""
        return Run(self.dataset, "dense", self.seed)

    def nested(self) -> "Run":
        """The nested run of the same data set and seed (budget-finetune's recipe,
        whose first step trains ``dense`` again: its checkpoint, unlike the record, was not kept)."""
        return Run(self.dataset, "nested", self.seed)


def recipe_of(run: Run, cfg: StudyConfig) -> finetune.Recipe:
    """The fine-tuning recipe of every run (what differs is the run's options): dev
    scored three times, the best checkpoint kept without the optimizer's state."""
    updates = cfg.updates[run.dataset]
    return finetune.Recipe(lr=cfg.lr, epochs=99, seed=run.seed, target_head_ratio=AIM.get(run.ratio, 1.0),
                           budget_weight=BUDGET_WEIGHT, start_at_budget=run.system in LEARNED, max_updates=updates,
                           validate_interval_updates=max(1, updates // 3), save_optimizer=False,
                           max_tokens=None)  # the records' batches: batch_size alone


def cached_record(path: Path, **expected) -> Optional[dict]:
    """The record of a finished run, if it was made with the ``expected`` settings
    (a missing key counts as None). Records are written last and atomically, so a
    half-done run has none and is redone."""
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    return record if matches(record, expected) else None


def matches(record: dict, expected: dict) -> bool:
    """Whether ``record`` holds ``expected``'s settings, nested dicts key by key (a key
    the record lacks counts as None: a setting added since, at its old behaviour)."""
    def same(old, new) -> bool:
        if isinstance(new, dict) and isinstance(old, dict):
            return matches(old, new)
        return old == new

    return all(same(record.get(key), value) for key, value in expected.items())


def finished(run: Run, cfg: StudyConfig) -> Optional[dict]:
    """``run``'s record, if it was trained with today's recipe."""
    return cached_record(run.record(cfg), recipe=asdict(recipe_of(run, cfg)))


@dataclass
class Plan:
    """Every run of the study known so far, in the order they should go (a seed at a
    time, data sets in the given order), and the records of those finished."""

    cfg: StudyConfig
    runs: List[Run]
    records: Dict[Run, dict]  # the finished runs' (today's recipe)
    choice: Dict[str, Optional[str]]  # per data set, the learned system at the lower ratio

    @classmethod
    def read(cls, cfg: StudyConfig) -> "Plan":
        choice = {dataset: choose(dataset, cfg) for dataset in cfg.datasets}
        runs = []
        for seed in cfg.seeds:
            for dataset in cfg.datasets:
                runs.append(Run(dataset, "dense", seed))
                runs += [Run(dataset, system, seed, RATIOS[0]) for system in LEARNED + FIXED]
                for ratio in RATIOS[1:]:
                    if choice[dataset]:
                        runs += [Run(dataset, choice[dataset], seed, ratio)]
                        runs += [Run(dataset, system, seed, ratio) for system in FIXED]
        records = {run: record for run in runs if (record := finished(run, cfg)) is not None}
        return cls(cfg, runs, records, choice)

    def learned_run(self, run: Run) -> Optional[Run]:
        """The run whose dev budget a fixed baseline copies: ``budget`` at the first
        ratio, the chosen learned system at the others (None until it is chosen)."""
        system = LEARNED[0] if run.ratio == RATIOS[0] else self.choice[run.dataset]
        return system and Run(run.dataset, system, run.seed, run.ratio)

    def prerequisites(self, run: Run) -> List[Optional[Run]]:
        if run.system in ("distill", "prior"):
            return [run.dense()]
        if run.system in FIXED:
            return [self.learned_run(run)] + ([run.dense()] if run.system == "importance" else [])
        return []

    def ready(self, run: Run) -> bool:
        return all(p is not None and p in self.records for p in self.prerequisites(run))

    def group(self, dataset: str, seed: int) -> List[Run]:
        """The runs of a data set and seed, in the plan's order."""
        return [r for r in self.runs if (r.dataset, r.seed) == (dataset, seed)]

    def complete(self, dataset: str, seed: int) -> bool:
        """Every run of a data set and seed is planned (the lower ratio's system chosen) and done."""
        runs = self.group(dataset, seed)
        return len(runs) == 2 + len(LEARNED) + 2 * len(FIXED) and all(r in self.records for r in runs)

    def options(self, run: Run) -> List[str]:
        """What ``run`` adds to the recipe's command line (recorded: a change retrains);
        TEACHER stands for the teacher's logits. Needs the run's prerequisites done."""
        if run.system == "distill":
            return ["--distill-logits", "TEACHER", "--distill-weight", "0.5", "--distill-temperature", "2"]
        if run.system == "prior":
            importance = self.records[run.dense()]["importance"]
            return ["--relevance-prior", ";".join(",".join(f"{v:.4f}" for v in layer) for layer in importance)]
        if run.system not in FIXED:
            return []
        dev_heads = self.records[self.learned_run(run)]["dev_heads_per_layer"]
        if run.system == "importance":
            importance = torch.tensor(self.records[run.dense()]["importance"])
            counts = [max(1, round(h)) for h in dev_heads]
            return ["--head-selection", "kept", "--kept-heads", kept_heads_option(kept_heads(importance, counts))]
        return ["--head-selection", run.system, "--fixed-heads", ",".join(f"{h:.2f}" for h in dev_heads)]


def choose(dataset: str, cfg: StudyConfig) -> Optional[str]:
    """The learned system that runs at the lower budget: the best of LEARNED on dev at
    the first ratio for the first seed (a tie keeps the earlier one); None until all are done."""
    found = [finished(Run(dataset, system, cfg.seeds[0], RATIOS[0]), cfg) for system in LEARNED]
    if None in found:
        return None
    return max(zip(LEARNED, found), key=lambda pair: (pair[1]["dev_accuracy"], -LEARNED.index(pair[0])))[0]
