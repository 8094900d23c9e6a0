"""Why BudgetFormer misses the accuracy study's targets: its training options varied one
at a time from the study's defaults, chosen on dev only.

Every variant trains like ``budget`` in scripts/reproduce.py (``budgetformer_small``, same
optimiser, updates and seeds) and is scored on dev at its best checkpoint (accuracy and
heads per layer, from fairseq-train's own validation). The study's ``budget`` and
``no_explore`` runs are reused where they exist with the same updates and learning rate.
Then, per data set, the variant with the best mean dev accuracy is trained for every
``--test-seeds`` and scored on the test split once, with fairseq-validate, next to the
study's full attention and BudgetFormer. The test split plays no part in the choice.

Writes ``results/sweep.{json,md}``; resumable (a run whose ``sweep.json`` exists is kept).

    python scripts/sweep.py                  # MR and TREC, 8 variants x 2 seeds (~80 min on 2 cores)
    python scripts/sweep.py --variants default no_explore explore_20 temperature_start_1 \
        budget_weight_0.3 pooling_first      # the committed run: 6 variants, 60 min
    python scripts/sweep.py --quick --data-dir D --datasets TOY --variants default temperature_start_1
"""

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from budget_plugin.tools.fairseq_cli import best_validation, validate
from budget_plugin.tools.files import write_atomic, write_json
from budget_plugin.tools.study import (
    EXPLORATION_SHARE, Run, add_study_arguments, cached_record, check_study_arguments, fairseq_train,
    heads_per_layer, log, mean_std, system_args, task_of,
)

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Variant:
    name: str
    change: str  # what differs from the study's BudgetFormer
    exploration_share: float = EXPLORATION_SHARE
    args: tuple = ()
    study_system: str = ""  # the study's system that is this variant, if any


VARIANTS = {v.name: v for v in [
    Variant("default", "the study's BudgetFormer: budget weight 1 (target ratio 0.5), exploration over "
            "40% of the updates, temperature 2 -> 1, exploration weight 0.01, mean pooling", study_system="budget"),
    Variant("no_explore", "no exploration schedule (the study's ablation)", 0.0, study_system="no_explore"),
    Variant("explore_20", "exploration over 20% of the updates", 0.2),
    Variant("explore_70", "exploration over 70% of the updates", 0.7),
    Variant("temperature_start_1", "relevance temperature 1 throughout (no 2 -> 1 annealing)",
            args=("--temperature-start", "1.0")),
    Variant("exploration_weight_0", "no entropy bonus on the relevance distribution",
            args=("--exploration-weight", "0")),
    Variant("budget_weight_0.3", "budget weight 0.3 (a looser pull to ratio 0.5)", args=("--budget-weight", "0.3")),
    Variant("pooling_first", "the router reads the <s> token instead of the mean over tokens",
            args=("--budget-pooling", "first")),
]}


def study_run_dir(cfg, run: Run, variant: Variant) -> Optional[Path]:
    """The study's run of this variant and seed, if it was trained with these settings."""
    if not variant.study_system:
        return None
    run_dir = Run(run.dataset, variant.study_system, run.seed).dir(cfg.study_dir)
    same = cached_record(run_dir / "result.json", updates=cfg.updates[run.dataset], lr=cfg.lr)
    return run_dir if same and (run_dir / "train.log").exists() else None


def train(cfg, run: Run) -> dict:
    """Train (or reuse) one variant and seed: its dev accuracy and heads at the best
    checkpoint. A finished run with the same settings is not trained again."""
    variant = VARIANTS[run.system]
    run_dir = run.dir(cfg.save_dir)
    record_path = run_dir / "sweep.json"
    updates = cfg.updates[run.dataset]
    record = cached_record(record_path, updates=updates, lr=cfg.lr)
    if record is not None:
        return record
    run_dir.mkdir(parents=True, exist_ok=True)
    study_dir = study_run_dir(cfg, run, variant)
    if study_dir is None:
        model_args = [*system_args("budget", updates, cfg.quick, exploration_share=variant.exploration_share),
                      *variant.args]
        train_log, wall = fairseq_train(run, cfg, model_args)
    else:
        train_log = (study_dir / "train.log").read_text()
        wall = json.loads((study_dir / "result.json").read_text())["train_wall_s"]
    best = best_validation(train_log)
    record = {
        "dataset": run.dataset, "variant": variant.name, "seed": run.seed, "updates": updates, "lr": cfg.lr,
        "checkpoint_dir": str(study_dir or run_dir), "reused_from_study": study_dir is not None,
        "train_wall_s": wall, "dev_accuracy": best["accuracy"], "dev_head_ratio": best["head_ratio"],
        "dev_heads_per_layer": heads_per_layer(best),
    }
    write_json(record_path, record)
    log(f"{run.dataset} {variant.name} seed {run.seed}: dev {record['dev_accuracy']:.1f} "
        f"head ratio {record['dev_head_ratio']:.3f}" + (" (the study's run)" if study_dir else f" ({wall:.0f}s)"))
    return record


def score_test(cfg, record: dict) -> dict:
    """Test accuracy of a run chosen on dev: scored once, every example."""
    run_dir = Path(record["checkpoint_dir"])
    if record["reused_from_study"]:
        study = json.loads((run_dir / "result.json").read_text())
        return dict(record, test_accuracy=study["test_accuracy"], test_examples=study["test_examples"])
    test = validate(run_dir / "checkpoint_best.pt", cfg.data_dir / f"{record['dataset']}-bin", ["test"],
                    task=task_of("budget"), log_path=run_dir / "validate.log", threads=cfg.threads_per_job)["test"]
    return dict(record, test_accuracy=test["accuracy"], test_examples=int(test["bsz"]))


def study_reference(cfg, dataset: str, system: str) -> dict:
    """Dev and test accuracy of one of the study's systems over the seeds it has."""
    paths = sorted((cfg.study_dir / dataset / system).glob("seed*/result.json"))
    records = [r for r in (cached_record(p, updates=cfg.updates[dataset], lr=cfg.lr) for p in paths) if r]
    if not records:
        return {}
    return {"seeds": [r["seed"] for r in records], "dev": mean_std([r["dev_accuracy"] for r in records], 2),
            "test": mean_std([r["test_accuracy"] for r in records], 2)}


def summarise(cfg, records: list) -> dict:
    summary = {}
    for dataset in cfg.datasets:
        rows = {}
        for name in cfg.variants:
            runs = [r for r in records if r["dataset"] == dataset and r["variant"] == name and r["seed"] in cfg.seeds]
            rows[name] = {"dev": mean_std([r["dev_accuracy"] for r in runs], 2),
                          "dev_per_seed": [r["dev_accuracy"] for r in runs],
                          "head_ratio": round(statistics.mean(r["dev_head_ratio"] for r in runs), 3)}
        chosen = max(cfg.variants, key=lambda name: rows[name]["dev"][0])
        summary[dataset] = {"variants": rows, "chosen_on_dev": chosen,
                            "full_attention": study_reference(cfg, dataset, "full"),
                            "study_budgetformer": study_reference(cfg, dataset, "budget")}
    return summary


def markdown(cfg, summary: dict, tested: dict) -> str:
    seeds = " ".join(map(str, cfg.seeds))
    out = []
    for dataset, found in summary.items():
        out += [f"### {dataset}: dev accuracy (seeds {seeds}), one change at a time from the study's BudgetFormer", "",
                "| variant | change | dev acc (per seed) | mean | head ratio (dev) |", "|---|---|---|---|---|"]
        for name, row in found["variants"].items():
            mark = " **(chosen)**" if name == found["chosen_on_dev"] else ""
            per_seed = ", ".join(f"{a:.1f}" for a in row["dev_per_seed"])
            out.append(f"| {name}{mark} | {VARIANTS[name].change} | {per_seed} | {row['dev'][0]:.2f} | "
                       f"{row['head_ratio']:.3f} |")
        full, study = found["full_attention"], found["study_budgetformer"]
        if full:
            out.append(f"| full attention (the study's) | stock roberta, seeds {' '.join(map(str, full['seeds']))} "
                       f"| | {full['dev'][0]:.2f} | 1.000 |")
        runs = tested[dataset]
        test = mean_std([r["test_accuracy"] for r in runs], 2)
        per_seed = ", ".join(f"{r['test_accuracy']:.1f}" for r in runs)
        out += ["", f"Test accuracy of the variant chosen on dev, `{found['chosen_on_dev']}` "
                f"(seeds {' '.join(str(r['seed']) for r in runs)}; per seed "
                f"{per_seed}): **{test[0]:.2f} +- {test[1]:.2f}**, "
                f"head ratio {statistics.mean(r['dev_head_ratio'] for r in runs):.3f} on dev"
                + (f"; the study's full attention {full['test'][0]:.2f} +- {full['test'][1]:.2f} "
                   f"({test[0] - full['test'][0]:+.2f} points)" if full else "")
                + (f", its BudgetFormer {study['test'][0]:.2f} +- {study['test'][1]:.2f}" if study else "") + ".", ""]
    return "\n".join(out)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_study_arguments(parser, REPO, datasets=["TREC", "MR"], save_dir="sweep")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2], help="seeds the choice on dev averages")
    parser.add_argument("--test-seeds", nargs="+", type=int, default=[1, 2, 3],
                        help="seeds the chosen variant is trained with and scored on test")
    parser.add_argument("--study-dir", type=Path, default=REPO / "checkpoints" / "reproduce",
                        help="scripts/reproduce.py's --save-dir: its runs are reused, its full attention reported")
    parser.add_argument("--quick", action="store_true", help="tiny models, 20 updates: keeps the script working")
    cfg = check_study_arguments(parser, parser.parse_args(argv))
    for dataset in cfg.datasets:
        if not (cfg.data_dir / f"{dataset}-bin" / "input0" / "valid.bin").exists():
            parser.error(f"{cfg.data_dir / f'{dataset}-bin'} has no binarized data (run scripts/get_data.py)")
    return cfg


def main(argv=None):
    cfg = parse_args(argv)
    start = time.time()
    runs = [Run(d, v, s) for d in cfg.datasets for v in cfg.variants for s in cfg.seeds]
    log(f"dev sweep: {len(runs)} runs, {cfg.jobs} at a time, updates {cfg.updates}")
    with ThreadPoolExecutor(cfg.jobs) as pool:
        records = list(pool.map(lambda run: train(cfg, run), runs))
        summary = summarise(cfg, records)
        chosen = [Run(d, summary[d]["chosen_on_dev"], s) for d in cfg.datasets for s in cfg.test_seeds]
        log("chosen on dev: " + ", ".join(f"{d} {summary[d]['chosen_on_dev']}" for d in cfg.datasets)
            + f"; scoring them on test (seeds {' '.join(map(str, cfg.test_seeds))})")
        tested_runs = list(pool.map(lambda run: score_test(cfg, train(cfg, run)), chosen))
    tested = {d: [r for r in tested_runs if r["dataset"] == d] for d in cfg.datasets}
    wall = time.time() - start
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    report = {"config": {"datasets": cfg.datasets, "variants": cfg.variants, "seeds": cfg.seeds,
                         "test_seeds": cfg.test_seeds, "updates": cfg.updates, "lr": cfg.lr, "jobs": cfg.jobs,
                         "wall_s": round(wall, 1)},
              "summary": summary, "runs": records, "tested": tested}
    write_json(cfg.out_dir / "sweep.json", report)
    table = markdown(cfg, summary, tested)
    table += f"\nThe sweep took {wall / 60:.0f} minutes ({cfg.jobs} trainings at a time).\n"
    write_atomic(cfg.out_dir / "sweep.md", table)
    print("\n" + table)
    log(f"written {cfg.out_dir / 'sweep.md'}, {cfg.out_dir / 'sweep.json'}")


if __name__ == "__main__":
    main()
