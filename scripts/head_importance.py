#!/usr/bin/env python3
"""Head importance of a fine-tuned model (Michel et al. 2019, "Are Sixteen Heads Really
Better than One?") and the heads to keep at a given budget: the static pruning baseline.

Importance of head h in layer l: the mean over the examples of a split (the training set
by default) of |dL/d xi_lh|, where xi_lh = 1 multiplies the head's output before the
output projection and L is the example's cross-entropy; normalised per layer by its L2
norm, as Michel et al.'s code does. The checkpoint (a dense ``roberta`` or a BudgetFormer)
is loaded into a BudgetFormer of its size running every head on its reference path, so
that each head's output is a tensor of its own (stock fairseq's fused attention has none).

Writes ``--out`` (JSON: the importance, L x H, and for ``--heads-per-layer`` the kept
heads) atomically and prints the option that fine-tunes with them:
``--head-selection kept --kept-heads '...'``.

    python scripts/head_importance.py --checkpoint checkpoints/dense/checkpoint_best.pt \\
        --data data/minilm/MR-bin --heads-per-layer 6 --out checkpoints/dense/importance.json
"""

import argparse
import logging
import sys
from pathlib import Path
from typing import List

logging.basicConfig(level=logging.WARNING)  # before fairseq sets up INFO logging

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from budget_plugin.tools.building import build_model, copy_weights  # noqa: E402
from budget_plugin.tools.errors import DataError, run_cli  # noqa: E402
from budget_plugin.tools.files import write_json  # noqa: E402
from budget_plugin.tools.measure import load_checkpoint, samples  # noqa: E402

HEAD = "sentence_classification_head"


def all_heads_twin(model):
    """A BudgetFormer with ``model``'s options and weights, every head on the reference path."""
    args = argparse.Namespace(**vars(model.args))
    for key in ("head_selection", "fixed_heads", "kept_heads", "min_heads", "initial_budget"):
        vars(args).pop(key, None)
    args.attention_path = "reference"
    vocab = model.encoder.sentence_encoder.embed_tokens.num_embeddings
    classes = model.classification_heads[HEAD].out_proj.out_features
    twin = build_model("budgetformer", vocab, args=args, num_classes=classes)
    copy_weights(model.state_dict(), twin, classification_heads=True)
    return twin.eval()


def head_importance(checkpoint: Path, data: Path, split: str, batch_size: int) -> torch.Tensor:
    model, task = load_checkpoint(checkpoint, data)
    twin = all_heads_twin(model)
    attentions = list(twin.budgeted_attentions())
    H = attentions[0].num_heads
    gates: List[torch.Tensor] = []

    def gate_heads(module, inputs):  # out_proj's input: T x B x (H*d), the heads side by side
        (x,) = inputs
        gate = torch.ones(x.size(1), H, requires_grad=True)
        gates.append(gate)
        return (x * gate.to(x).repeat_interleave(x.size(-1) // H, dim=1),)

    hooks = [a.out_proj.register_forward_pre_hook(gate_heads) for a in attentions]
    total, examples = torch.zeros(len(attentions), H), 0
    try:
        with twin.forced_heads(H):
            for sample in samples(task, split, batch_size):
                gates.clear()
                logits, _ = twin(sample["net_input"]["src_tokens"], classification_head_name=HEAD)
                loss = F.cross_entropy(logits.float(), sample["target"].view(-1), reduction="sum")
                grads = torch.autograd.grad(loss, gates)
                total += torch.stack([g.abs().sum(dim=0) for g in grads])
                examples += logits.size(0)
    finally:
        for hook in hooks:
            hook.remove()
    if not examples:
        raise DataError(f"{data}: split '{split}' has no examples")
    importance = total / examples
    return importance / importance.norm(dim=1, keepdim=True).clamp_min(1e-20)


def kept_heads(importance: torch.Tensor, heads_per_layer: List[int]) -> List[List[int]]:
    """Each layer's most important heads, ascending."""
    return [sorted(row.argsort(descending=True)[:k].tolist()) for row, k in zip(importance, heads_per_layer)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="the fine-tuned model")
    parser.add_argument("--data", type=Path, required=True, help="its binarized data set")
    parser.add_argument("--split", default="train", help="the examples to average over (default: %(default)s)")
    parser.add_argument("--heads-per-layer", required=True,
                        help="heads to keep: one number, or one per layer separated by commas")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args(argv)

    def body():
        importance = head_importance(args.checkpoint, args.data, args.split, args.batch_size)
        L, H = importance.shape
        try:
            counts = [int(v) for v in args.heads_per_layer.split(",")]
        except ValueError:
            counts = []
        counts = counts * L if len(counts) == 1 else counts
        if len(counts) != L or not all(1 <= k <= H for k in counts):
            raise DataError(f"--heads-per-layer {args.heads_per_layer}: one number or {L} comma-separated "
                            f"numbers, each in [1, {H}]")
        kept = kept_heads(importance, counts)
        option = ";".join(",".join(map(str, heads)) for heads in kept)
        write_json(args.out, {"checkpoint": str(args.checkpoint), "split": args.split,
                              "importance": importance.tolist(), "heads_per_layer": counts, "kept_heads": option},
                   indent=1)
        for layer, row in enumerate(importance):
            print(f"layer {layer}: " + " ".join(f"{v:.2f}" for v in row.tolist()) + f"  keep {kept[layer]}")
        print(f"--head-selection kept --kept-heads '{option}'")

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
