"""Training the study's runs: every run whose prerequisites are done, ``jobs`` at a time,
fine-tuned with fairseq-train, scored once on dev and test with fairseq-validate, and
recorded (written last and atomically: a run with a record is never trained again)."""

import re
import shutil
import statistics
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict
from pathlib import Path
from typing import List, Optional

import torch

from budget_plugin.data.binarize import count_binarized, num_classes
from budget_plugin.nested import finetune
from budget_plugin.nested.importance import head_importance
from budget_plugin.tools.checkpoints import model_options, read
from budget_plugin.tools.fairseq_cli import run as run_command
from budget_plugin.tools.fairseq_cli import validate
from budget_plugin.tools.files import write_json
from budget_plugin.tools.progress import log
from budget_plugin.tools.teacher import save_logits, teacher_logits
from budget_research import adaprune
from budget_research.study.plan import FIXED, ROBERTA, Plan, Run, StudyConfig, cached_record, recipe_of

IMPORTANCE_EXAMPLES = 2048  # importance averaged over the first 2048 training examples
# the teacher's logits and the importance are computed in this process, one at a time:
# fairseq's checkpoint loading is not known to be thread-safe (they take seconds)
IN_PROCESS = threading.Lock()


def heads_per_layer(metrics: dict) -> List[float]:
    """The ``heads_l0``, ``heads_l1``, ... of a validation's metrics, in layer order."""
    layers = sum(1 for key in metrics if re.fullmatch(r"heads_l\d+", key))
    return [metrics[f"heads_l{i}"] for i in range(layers)]


def teacher_file(dense: Run, cfg: StudyConfig) -> Path:
    """The dense model's logits on the training set (computed once per seed)."""
    path = dense.checkpoints(cfg) / "teacher_train.pt"
    if not path.exists():
        with IN_PROCESS:
            save_logits(path, teacher_logits(dense.checkpoints(cfg) / "checkpoint_best.pt", dense.data(cfg)))
    return path


def dense_importance(dense: Run, cfg: StudyConfig) -> List[List[float]]:
    """Michel et al.'s head importance of the dense model, L x H."""
    with IN_PROCESS:
        return head_importance(dense.checkpoints(cfg) / "checkpoint_best.pt", dense.data(cfg), "train", 32,
                               IMPORTANCE_EXAMPLES).tolist()


def adapruned_file(run: Run, heads_to_keep: int, cfg: StudyConfig) -> Path:
    """The nested recipe's dense model of the same data set and seed, pruned by fairseq's
    AdaPrune to ``heads_to_keep`` heads per layer (made once)."""
    path = run.nested().checkpoints(cfg) / f"adapruned-{heads_to_keep}.pt"
    if not path.exists():
        with IN_PROCESS:
            kept = adaprune.magnitude_pruned(run.nested().checkpoints(cfg) / "dense" / "checkpoint_best.pt", run.data(cfg),
                                    path, heads_to_keep)
        write_json(path.with_suffix(".json"), kept)
    return path


def resolved(options: List[str], run: Run, cfg: StudyConfig) -> List[str]:
    """The options with their placeholders made files: TEACHER the dense model's logits,
    ADAPRUNED its AdaPrune checkpoint (at the options' --mha-heads-to-keep)."""
    def one(option: str) -> str:
        if option == "TEACHER":
            return str(teacher_file(run.dense(), cfg))
        if option == "ADAPRUNED":
            return str(adapruned_file(run, int(options[options.index("--mha-heads-to-keep") + 1]), cfg))
        return option

    return [one(o) for o in options]


def roberta_heads(checkpoint: Path) -> List[float]:
    """The heads per layer of a stock RoBERTa checkpoint (fewer layers or AdaPrune's heads)."""
    args = model_options(read(checkpoint))
    heads = args.encoder_attention_heads if getattr(args, "mha_heads_to_keep", -1) == -1 else args.mha_heads_to_keep
    return [float(heads)] * args.encoder_layers


def train(run: Run, options: List[str], cfg: StudyConfig) -> dict:
    """Fine-tune ``run`` with ``options`` (Plan.options), score dev and test once, and
    write its record; a record of the same recipe and options is returned as it is."""
    recipe = recipe_of(run, cfg)
    record = cached_record(run.record(cfg), recipe=asdict(recipe), options=options)
    if record is not None:
        return record
    save_dir, data = run.checkpoints(cfg), run.data(cfg)
    shutil.rmtree(save_dir, ignore_errors=True)
    save_dir.mkdir(parents=True)
    examples = count_binarized(data / "input0" / "train")
    updates = recipe.updates(examples)
    kind = "dense" if run.system in ROBERTA else "budget"
    # an AdaPrune checkpoint needs the research package's task to be loaded (adaprune.py)
    pruned = "--mha-heads-to-keep" in options
    command = [*finetune.command(kind, data, cfg.model_dir, save_dir, recipe, examples, num_classes(data)),
               *resolved(options, run, cfg), *(adaprune.FAIRSEQ_OPTIONS if pruned else [])]
    start = time.time()
    run_command(command, log_path=save_dir / "train.log", threads=cfg.threads_per_job)
    wall = round(time.time() - start, 1)
    for interval in save_dir.glob("checkpoint_*_*.pt"):  # only the best is kept
        interval.unlink()
    task = adaprune.TASK if pruned else "budget_sentence_prediction"
    scores = validate(save_dir / "checkpoint_best.pt", data, ["valid", "test"], task=task,
                      criterion="sentence_prediction" if kind == "dense" else task,
                      log_path=save_dir / "validate.log", threads=cfg.threads_per_job,
                      **({"user_dir": adaprune.FAIRSEQ_OPTIONS[1]} if pruned else {}))
    record = {
        "dataset": run.dataset, "system": run.system, "ratio": run.ratio, "seed": run.seed, "updates": updates,
        "lr": cfg.lr, "recipe": asdict(recipe), "options": options, "train_wall_s": wall,
        "dev_accuracy": scores["valid"]["accuracy"],
        "test_accuracy": scores["test"]["accuracy"], "test_examples": int(scores["test"]["bsz"]),
        "dev_heads_per_layer": (heads_per_layer(scores["valid"]) if kind == "budget"
                                else roberta_heads(save_dir / "checkpoint_best.pt")),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if run.system == "dense":
        record["importance"] = dense_importance(run, cfg)
    write_json(run.record(cfg), record)
    log(f"{run.dataset} {run.name} seed {run.seed}: dev {record['dev_accuracy']:.1f} test "
        f"{record['test_accuracy']:.1f}, heads/layer on dev "
        f"{statistics.mean(record['dev_heads_per_layer']):.2f} ({wall:.0f} s)")
    return record


def train_all(cfg: StudyConfig, deadline: Optional[float] = None) -> None:
    """Every run whose prerequisites are done, ``cfg.jobs`` at a time, until none is
    left or the ``deadline`` (a time.time()) has passed (runs under way finish). The
    plan is read again after every run: a finished run may decide the next ones."""
    torch.set_num_threads(cfg.threads_per_job)  # for what runs in this process
    started, pending = set(), {}
    with ThreadPoolExecutor(cfg.jobs) as pool:
        while True:
            late = deadline is not None and time.time() > deadline
            plan = Plan.read(cfg)
            for run in [] if late else plan.runs:
                if len(pending) >= cfg.jobs:
                    break
                # a fixed baseline's record counts only with the budget it copies: train() checks
                if run in started or run in plan.records and run.system not in FIXED:
                    continue
                if plan.ready(run):
                    started.add(run)
                    pending[pool.submit(train, run, plan.options(run), cfg)] = run
            if not pending:
                return
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                pending.pop(future)
                future.result()
