#!/usr/bin/env python3
"""Pictures of head usage: which heads a trained BudgetFormer runs, and how many.

    python scripts/plot_heads.py --checkpoint-dir checkpoints/mr --data data/MR-bin \\
        --split test --out-dir results/heads

Writes, for the split:
  heads_overall.png    layer x head: how often each head is selected
  heads_by_class.png   the same map for every gold class, side by side
  budgets.png          per layer, the distribution of per-example head counts
and heads.json with the numbers behind them. Needs matplotlib (pip install -e .[viz]).
With --tensorboard-logdir it also writes, per layer, a TensorBoard histogram of the
per-example head counts (tag budget_heads/layer<i>, step = the checkpoint's update).
"""

import argparse
import logging
from pathlib import Path

import torch

from budget_plugin.tools.files import atomic_path, write_json
from budget_plugin.tools.hub import add_checkpoint_arguments, load_hub


def collect(hub, split, batch_size):
    """selected: N x L x H bool, heads: N x L, targets: N (or None)."""
    task, model = hub.task, hub.model
    task.load_dataset(split)
    dataset = task.dataset(split)
    iterator = task.get_batch_iterator(dataset, max_sentences=batch_size).next_epoch_itr(shuffle=False)
    selected, heads, targets = [], [], []
    with torch.no_grad():
        for sample in iterator:
            _, extra = model(sample["net_input"]["src_tokens"].to(hub.device), features_only=True)
            selected.append(torch.stack([s["selected"] for s in extra["budget"]], dim=1).cpu())
            heads.append(torch.stack([s["heads"] for s in extra["budget"]], dim=1).cpu())
            if "target" in sample:
                targets.append(sample["target"].view(-1).cpu())
    return torch.cat(selected), torch.cat(heads), (torch.cat(targets) if targets else None)


def heat_map(ax, frequency, title):
    image = ax.imshow(frequency.numpy(), vmin=0, vmax=1, cmap="viridis", aspect="auto")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(frequency.size(1)))
    ax.set_yticks(range(frequency.size(0)))
    ax.set_title(title)
    return image


def save(fig, path):
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_arguments(parser)
    parser.add_argument("--split", default="valid")
    parser.add_argument("--out-dir", required=True, type=Path)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--tensorboard-logdir", type=Path, help="also write per-layer budget histograms here")
    args = parser.parse_args()
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("error: plot_heads.py needs matplotlib: pip install -e '.[viz]'")

    hub = load_hub(args)
    selected, heads, targets = collect(hub, args.split, args.batch_size)
    n, num_layers, num_heads = selected.shape
    args.out_dir.mkdir(parents=True, exist_ok=True)
    overall = selected.float().mean(dim=0)

    fig, ax = plt.subplots(figsize=(1 + 0.5 * num_heads, 1 + 0.5 * num_layers))
    fig.colorbar(heat_map(ax, overall, f"{args.split}: share of {n} inputs running each head"), ax=ax)
    save(fig, args.out_dir / "heads_overall.png")

    labels = hub.task.label_dictionary
    by_class = {}
    if targets is not None and not hub.task.cfg.regression_target:
        classes = sorted(set(targets.tolist()))
        size = (1 + 0.5 * num_heads * len(classes), 1 + 0.5 * num_layers)
        fig, axes = plt.subplots(1, len(classes), figsize=size, squeeze=False)
        for ax, c in zip(axes[0], classes):
            name = labels.string([c + labels.nspecial])
            by_class[name] = selected[targets == c].float().mean(dim=0)
            image = heat_map(ax, by_class[name], f"class {name} ({int((targets == c).sum())})")
        fig.colorbar(image, ax=list(axes[0]))
        save(fig, args.out_dir / "heads_by_class.png")

    fig, axes = plt.subplots(1, num_layers, figsize=(2.2 * num_layers, 2.4), sharey=True, squeeze=False)
    for layer, ax in enumerate(axes[0]):
        counts = torch.bincount(heads[:, layer], minlength=num_heads + 1)[1:]
        ax.bar(range(1, num_heads + 1), (counts / n).numpy())
        ax.set_title(f"layer {layer}: mean {heads[:, layer].float().mean():.2f}")
        ax.set_xlabel("heads run")
    axes[0][0].set_ylabel("share of inputs")
    save(fig, args.out_dir / "budgets.png")

    summary = {
        "split": args.split, "examples": n,
        "selection_frequency": overall.tolist(),
        "selection_frequency_by_class": {k: v.tolist() for k, v in by_class.items()},
        "mean_heads_per_layer": heads.float().mean(dim=0).tolist(),
        "std_heads_per_layer": heads.float().std(dim=0).tolist() if n > 1 else None,
    }
    if args.tensorboard_logdir:
        from torch.utils.tensorboard import SummaryWriter

        step = torch.load(args.checkpoint_dir / args.checkpoint_file, map_location="cpu", weights_only=True)
        step = step["optimizer_history"][-1]["num_updates"]
        with SummaryWriter(str(args.tensorboard_logdir / args.split)) as writer:
            for layer in range(num_layers):
                writer.add_histogram(f"budget_heads/layer{layer}", heads[:, layer], step,
                                     bins=list(range(num_heads + 2)))

    write_json(args.out_dir / "heads.json", summary)
    print(f"wrote {args.out_dir}/heads_overall.png, heads_by_class.png, budgets.png, heads.json ({n} inputs)")


if __name__ == "__main__":
    main()
