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
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo import REPO, metrics_of, train_args, write_atomic  # noqa: E402
from reproduce import (  # noqa: E402
    EXPLORATION_SHARE, UPDATES, Run, log, num_classes, parse_updates, run_logged, system_args, validate,
)


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
    Variant("exploration_weight_0", "no entropy bonus on the relevance distribution", args=("--exploration-weight", "0")),
    Variant("budget_weight_0.3", "budget weight 0.3 (a looser pull to ratio 0.5)", args=("--budget-weight", "0.3")),
    Variant("pooling_first", "the router reads the <s> token instead of the mean over tokens",
            args=("--budget-pooling", "first")),
]}


def best_validation(train_log: str) -> dict:
    """Metrics of the validation that checkpoint_best.pt holds: the last one at the best
    accuracy (fairseq keeps a tie as the new best)."""
    lines = [metrics_of(line) for line in train_log.splitlines() if "valid on 'valid' subset" in line]
    if not lines:
        raise RuntimeError("the training log has no validation line")
    best = max(m["accuracy"] for m in lines)
    return [m for m in lines if m["accuracy"] == best][-1]


def study_run_dir(cfg, dataset: str, variant: Variant, seed: int):
    """The study's run of this variant and seed, if it was trained with these settings."""
    if not variant.study_system:
        return None
    run_dir = Run(dataset, variant.study_system, seed).dir(cfg.study_dir)
    record = run_dir / "result.json"
    if not (record.exists() and (run_dir / "train.log").exists()):
        return None
    study = json.loads(record.read_text())
    same = study["updates"] == cfg.updates[dataset] and study["lr"] == cfg.lr
    return run_dir if same else None


def train(cfg, dataset: str, variant: Variant, seed: int) -> dict:
    """Train (or reuse) one variant and seed; the record is written last, so a half-done
    run is redone."""
    run_dir = cfg.save_dir / dataset / variant.name / f"seed{seed}"
    record_path = run_dir / "sweep.json"
    updates = cfg.updates[dataset]
    if record_path.exists():
        record = json.loads(record_path.read_text())
        if record["updates"] == updates and record["lr"] == cfg.lr:
            return record
    study_dir = study_run_dir(cfg, dataset, variant, seed)
    start = time.time()
    if study_dir is None:
        run_dir.mkdir(parents=True, exist_ok=True)
        data = cfg.data_dir / f"{dataset}-bin"
        hyper = argparse.Namespace(lr=cfg.lr, max_update=updates, seed=seed)
        cmd = [*train_args(hyper, data, run_dir, num_classes=num_classes(data)),
               *system_args("budget", updates, cfg.quick, exploration_share=variant.exploration_share),
               *variant.args]
        train_log = run_logged(cmd, run_dir / "train.log", cfg.threads_per_job)
        wall = time.time() - start
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        train_log = (study_dir / "train.log").read_text()
        wall = json.loads((study_dir / "result.json").read_text())["train_wall_s"]
    best = best_validation(train_log)
    layers = sorted(int(k[len("heads_l"):]) for k in best if k.startswith("heads_l"))
    record = {
        "dataset": dataset, "variant": variant.name, "seed": seed, "updates": updates, "lr": cfg.lr,
        "checkpoint_dir": str(study_dir or run_dir), "reused_from_study": study_dir is not None,
        "train_wall_s": round(wall, 1), "dev_accuracy": best["accuracy"], "dev_head_ratio": best["head_ratio"],
        "dev_heads_per_layer": [best[f"heads_l{i}"] for i in layers],
    }
    write_atomic(record_path, json.dumps(record, indent=2) + "\n")
    log(f"{dataset} {variant.name} seed {seed}: dev {record['dev_accuracy']:.1f} "
        f"head ratio {record['dev_head_ratio']:.3f}" + (" (the study's run)" if study_dir else f" ({wall:.0f}s)"))
    return record


def score_test(cfg, record: dict) -> dict:
    """Test accuracy of a run chosen on dev: scored once, every example."""
    run_dir = Path(record["checkpoint_dir"])
    if record["reused_from_study"]:
        study = json.loads((run_dir / "result.json").read_text())
        return dict(record, test_accuracy=study["test_accuracy"], test_examples=study["test_examples"])
    data = cfg.data_dir / f"{record['dataset']}-bin"
    test = validate(Run(record["dataset"], "budget", record["seed"]), data, run_dir, "test", cfg.threads_per_job)
    return dict(record, test_accuracy=test["accuracy"], test_examples=int(test["bsz"]))


def study_reference(cfg, dataset: str, system: str) -> dict:
    """Dev and test accuracy of one of the study's systems over the seeds it has."""
    records = [json.loads(p.read_text()) for p in sorted((cfg.study_dir / dataset / system).glob("seed*/result.json"))]
    records = [r for r in records if r["updates"] == cfg.updates[dataset] and r["lr"] == cfg.lr]
    if not records:
        return {}
    return {"seeds": [r["seed"] for r in records], "dev": mean_std([r["dev_accuracy"] for r in records]),
            "test": mean_std([r["test_accuracy"] for r in records])}


def mean_std(values) -> list:
    return [round(statistics.mean(values), 2), round(statistics.stdev(values), 2) if len(values) > 1 else 0.0]


def summarise(cfg, records: list) -> dict:
    summary = {}
    for dataset in cfg.datasets:
        rows = {}
        for name in cfg.variants:
            runs = [r for r in records if r["dataset"] == dataset and r["variant"] == name and r["seed"] in cfg.seeds]
            rows[name] = {"dev": mean_std([r["dev_accuracy"] for r in runs]),
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
        test = mean_std([r["test_accuracy"] for r in runs])
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
    parser.add_argument("--datasets", nargs="+", default=["TREC", "MR"], help="data sets under --data-dir (NAME-bin)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2], help="seeds the choice on dev averages")
    parser.add_argument("--test-seeds", nargs="+", type=int, default=[1, 2, 3],
                        help="seeds the chosen variant is trained with and scored on test")
    parser.add_argument("--updates", nargs="*", metavar="NAME=N", help=f"updates per data set (default {UPDATES})")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--jobs", type=int, default=2, help="trainings at a time (each on cores / jobs threads)")
    parser.add_argument("--data-dir", type=Path, default=REPO / "data")
    parser.add_argument("--out-dir", type=Path, default=REPO / "results")
    parser.add_argument("--save-dir", type=Path, default=REPO / "checkpoints" / "sweep")
    parser.add_argument("--study-dir", type=Path, default=REPO / "checkpoints" / "reproduce",
                        help="scripts/reproduce.py's --save-dir: its runs are reused, its full attention reported")
    parser.add_argument("--quick", action="store_true", help="tiny models, 20 updates: keeps the script working")
    cfg = parser.parse_args(argv)
    cfg.updates = parse_updates(cfg.updates)
    if cfg.quick:
        cfg.updates = {d: 20 for d in cfg.datasets}
    missing = [d for d in cfg.datasets if d not in cfg.updates]
    if missing:
        parser.error(f"--updates has no number of updates for {', '.join(missing)} (give NAME=N)")
    if cfg.jobs < 1:
        parser.error("--jobs must be >= 1")
    for dataset in cfg.datasets:
        if not (cfg.data_dir / f"{dataset}-bin" / "input0" / "valid.bin").exists():
            parser.error(f"{cfg.data_dir / f'{dataset}-bin'} has no binarized data (run scripts/get_data.py)")
    cfg.threads_per_job = max(1, (os.cpu_count() or 1) // cfg.jobs)
    cfg.data_dir, cfg.save_dir, cfg.out_dir, cfg.study_dir = (
        p.resolve() for p in (cfg.data_dir, cfg.save_dir, cfg.out_dir, cfg.study_dir))
    return cfg


def main(argv=None):
    cfg = parse_args(argv)
    start = time.time()
    runs = [(d, VARIANTS[v], s) for d in cfg.datasets for v in cfg.variants for s in cfg.seeds]
    log(f"dev sweep: {len(runs)} runs, {cfg.jobs} at a time, updates {cfg.updates}")
    with ThreadPoolExecutor(cfg.jobs) as pool:
        records = list(pool.map(lambda run: train(cfg, *run), runs))
        summary = summarise(cfg, records)
        chosen = [(d, VARIANTS[summary[d]["chosen_on_dev"]], s) for d in cfg.datasets for s in cfg.test_seeds]
        log("chosen on dev: " + ", ".join(f"{d} {summary[d]['chosen_on_dev']}" for d in cfg.datasets)
            + f"; scoring them on test (seeds {' '.join(map(str, cfg.test_seeds))})")
        tested_runs = list(pool.map(lambda run: score_test(cfg, train(cfg, *run)), chosen))
    tested = {d: [r for r in tested_runs if r["dataset"] == d] for d in cfg.datasets}
    wall = time.time() - start
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    report = {"config": {"datasets": cfg.datasets, "variants": cfg.variants, "seeds": cfg.seeds,
                         "test_seeds": cfg.test_seeds, "updates": cfg.updates, "lr": cfg.lr, "jobs": cfg.jobs,
                         "wall_s": round(wall, 1)},
              "summary": summary, "runs": records, "tested": tested}
    write_atomic(cfg.out_dir / "sweep.json", json.dumps(report, indent=2) + "\n")
    table = markdown(cfg, summary, tested) + f"\nThe sweep took {wall / 60:.0f} minutes ({cfg.jobs} trainings at a time).\n"
    write_atomic(cfg.out_dir / "sweep.md", table)
    print("\n" + table)
    log(f"written {cfg.out_dir / 'sweep.md'}, {cfg.out_dir / 'sweep.json'}")


if __name__ == "__main__":
    main()
