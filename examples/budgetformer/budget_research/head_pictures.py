"""Pictures of the heads a trained BudgetFormer runs on a split (examples/budgetformer/plot_heads.py,
examples/budgetformer/demo.py): how often each head runs, per gold class, and how many heads inputs
run per layer; the numbers behind them as a dict."""

from pathlib import Path
from typing import Optional

import torch

from budget_plugin.tools.errors import DataError
from budget_plugin.tools.evaluation import heads_per_input, samples
from budget_research import figures


def heat_map(ax, frequency, title):
    image = ax.imshow(frequency.numpy(), vmin=0, vmax=1, cmap="viridis", aspect="auto")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(frequency.size(1)))
    ax.set_yticks(range(frequency.size(0)))
    ax.set_title(title)
    return image


def head_pictures(hub, split: str, out_dir: Path, batch_size: int = 64, tensorboard_logdir: Optional[Path] = None,
                  step: int = 0) -> dict:
    """heads_overall.png, heads_by_class.png and budgets.png in ``out_dir`` for the hub
    interface's model on ``split``; with ``tensorboard_logdir``, per layer a histogram of
    the heads each input ran (tag budget_heads/layer<i>, at ``step``). Returns the numbers."""
    plt = figures.pyplot()
    if plt is None:
        raise DataError("pictures of the heads need matplotlib: pip install -e '.[viz]'")
    selected, targets = heads_per_input(hub.model, samples(hub.task, split, batch_size))
    heads = selected.sum(-1)
    n, num_layers, num_heads = selected.shape
    out_dir.mkdir(parents=True, exist_ok=True)
    overall = selected.float().mean(dim=0)

    fig, ax = plt.subplots(figsize=(1 + 0.5 * num_heads, 1 + 0.5 * num_layers))
    fig.colorbar(heat_map(ax, overall, f"{split}: share of {n} inputs running each head"), ax=ax)
    figures.save(fig, out_dir / "heads_overall.png")

    labels = hub.task.label_dictionary
    by_class = {}
    if targets is not None and not hub.task.cfg.regression_target:
        classes = sorted(set(targets.tolist()))
        fig, axes = plt.subplots(1, len(classes), figsize=(1 + 0.5 * num_heads * len(classes), 1 + 0.5 * num_layers),
                                 squeeze=False)
        for ax, c in zip(axes[0], classes):
            name = labels.string([c + labels.nspecial])
            by_class[name] = selected[targets == c].float().mean(dim=0)
            image = heat_map(ax, by_class[name], f"class {name} ({int((targets == c).sum())})")
        fig.colorbar(image, ax=list(axes[0]))
        figures.save(fig, out_dir / "heads_by_class.png")

    fig, axes = plt.subplots(1, num_layers, figsize=(2.2 * num_layers, 2.4), sharey=True, squeeze=False)
    for layer, ax in enumerate(axes[0]):
        counts = torch.bincount(heads[:, layer], minlength=num_heads + 1)[1:]
        ax.bar(range(1, num_heads + 1), (counts / n).numpy())
        ax.set_title(f"layer {layer}: mean {heads[:, layer].float().mean():.2f}")
        ax.set_xlabel("heads run")
    axes[0][0].set_ylabel("share of inputs")
    figures.save(fig, out_dir / "budgets.png")

    if tensorboard_logdir:
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(str(tensorboard_logdir / split)) as writer:
            for layer in range(num_layers):
                writer.add_histogram(f"budget_heads/layer{layer}", heads[:, layer], step,
                                     bins=list(range(num_heads + 2)))
    return {
        "split": split, "examples": n,
        "selection_frequency": overall.tolist(),
        "selection_frequency_by_class": {k: v.tolist() for k, v in by_class.items()},
        "mean_heads_per_layer": heads.float().mean(dim=0).tolist(),
        "std_heads_per_layer": heads.float().std(dim=0).tolist() if n > 1 else None,
    }
