"""Which importance orders heads and FFN neurons better (issue 34, point 1): the mask
gradient the recipe uses (Michel et al.: |dL/dxi| per example, xi a gate on the unit's
output, the head's before out_proj, the neuron's before fc2) or DynaBERT's first-order
|w . dL/dw| over the unit's weights (a neuron: its fc1 row and bias and its fc2 column; a
head: its q, k and v rows and biases and its out_proj columns).

Both are mask gradients: a gate psi on a linear map's output rows has dL/dpsi = the sum of
w . dL/dw over those rows and their biases. So per example |w . dL/dw| of neuron j is
|dL/dpsi_j + dL/dxi_j| with psi on fc1's output j, and a head's the same with psi on its q,
k and v rows; the recipe's importance is xi's term alone. Both are taken here in one
backward pass per batch, per example, on the recipe's training examples, and normalised
per layer as the recipe normalises.

An order is scored as DynaBERT scores one: the dense fine-tuned model cut to each order's
first units at several widths (the same fraction of heads and neurons in every layer), no
retraining, accuracy on dev. The order that keeps more accuracy when cut is the better
start for the nested step."""

import functools
from pathlib import Path
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

from budget_plugin.dial.settings import Dial
from budget_plugin.nested.importance import HEAD, Importance, all_heads_twin, normalised
from budget_plugin.tools.checkpoints import load_checkpoint
from budget_plugin.tools.evaluation import samples, split_batches
from budget_plugin.tools.files import write_atomic, write_json

WIDTHS = (0.75, 0.5, 0.4, 0.3, 0.25)
ORDERS = ("mask gradient (the recipe's)", "abs(w . dL/dw) (DynaBERT's)", "random (seed 1)")


def both_importances(model, batches, max_examples: int) -> Dict[str, Importance]:
    """The mask gradient and |w . dL/dw| of every head and neuron over ``batches``."""
    twin = all_heads_twin(model)
    attentions = list(twin.budgeted_attentions())
    layers = twin.encoder.sentence_encoder.layers
    H, neurons = attentions[0].num_heads, layers[0].fc2.in_features
    gates: Dict[str, List[torch.Tensor]] = {"xi_heads": [], "psi_heads": [], "xi_neurons": [], "psi_neurons": []}

    def gate(kind: str, units: int, x: torch.Tensor) -> torch.Tensor:  # x: T x B x C
        mask = torch.ones(x.size(1), units, requires_grad=True)
        gates[kind].append(mask)
        return x * mask.to(x).repeat_interleave(x.size(-1) // units, dim=1)

    def gate_qkv(module, inputs, output, psi: dict, first: bool = False):  # a head's psi: its q, k and v rows
        if first:  # q_proj runs first: one gate, shared by the head's three projections
            psi["mask"] = torch.ones(output.size(1), H, requires_grad=True)
            gates["psi_heads"].append(psi["mask"])
        return output * psi["mask"].to(output).repeat_interleave(output.size(-1) // H, dim=1)

    hooks = []
    for attention, layer in zip(attentions, layers):
        psi = {}
        hooks.append(attention.q_proj.register_forward_hook(functools.partial(gate_qkv, psi=psi, first=True)))
        hooks += [proj.register_forward_hook(functools.partial(gate_qkv, psi=psi))
                  for proj in (attention.k_proj, attention.v_proj)]
        hooks.append(attention.out_proj.register_forward_pre_hook(lambda m, i: (gate("xi_heads", H, i[0]),)))
        hooks.append(layer.fc1.register_forward_hook(lambda m, i, o: gate("psi_neurons", neurons, o)))
        hooks.append(layer.fc2.register_forward_pre_hook(lambda m, i: (gate("xi_neurons", neurons, i[0]),)))

    L = len(layers)
    mask_total = Importance(torch.zeros(L, H), torch.zeros(L, neurons))
    taylor_total = Importance(torch.zeros(L, H), torch.zeros(L, neurons))
    examples, dial = 0, Dial.heads_per_layer(H, L)
    try:
        for sample in batches:
            for found in gates.values():
                found.clear()
            logits, _ = twin(sample["net_input"]["src_tokens"], classification_head_name=HEAD, dial=dial)
            loss = F.cross_entropy(logits.float(), sample["target"].view(-1), reduction="sum")
            order = ("xi_heads", "psi_heads", "xi_neurons", "psi_neurons")
            grads = torch.autograd.grad(loss, [mask for kind in order for mask in gates[kind]])
            xi_h, psi_h, xi_n, psi_n = (grads[i * L:(i + 1) * L] for i in range(4))
            mask_total.heads.add_(torch.stack([g.abs().sum(0) for g in xi_h]))
            mask_total.neurons.add_(torch.stack([g.abs().sum(0) for g in xi_n]))
            taylor_total.heads.add_(torch.stack([(a + b).abs().sum(0) for a, b in zip(xi_h, psi_h)]))
            taylor_total.neurons.add_(torch.stack([(a + b).abs().sum(0) for a, b in zip(xi_n, psi_n)]))
            examples += logits.size(0)
            if examples >= max_examples:
                break
    finally:
        for hook in hooks:
            hook.remove()
    generator = torch.Generator().manual_seed(1)
    random = Importance(torch.rand(L, H, generator=generator), torch.rand(L, neurons, generator=generator))
    found = [Importance(*(normalised(t / examples) for t in total)) for total in (mask_total, taylor_total)]
    return dict(zip(ORDERS, found + [random]))


@torch.no_grad()
def cut_accuracy(model, batches, importance: Importance, width: float) -> float:
    """Dev accuracy of ``model`` keeping, in every layer, the round(width x H) heads and
    round(width x F) neurons ``importance`` ranks first: the others' out_proj columns and
    fc1 rows zeroed (an exact removal: GELU(0) = 0), then restored."""
    attentions = list(model.budgeted_attentions()) if hasattr(model, "budgeted_attentions") else [
        layer.self_attn for layer in model.encoder.sentence_encoder.layers]
    layers = model.encoder.sentence_encoder.layers
    saved = {name: p.clone() for name, p in model.named_parameters()}
    try:
        for attention, layer, heads, neurons in zip(attentions, layers, importance.heads, importance.neurons):
            d = attention.head_dim
            for h in heads.argsort(descending=True)[max(1, round(width * heads.numel())):].tolist():
                attention.out_proj.weight[:, h * d:(h + 1) * d] = 0
            dropped = neurons.argsort(descending=True)[max(1, round(width * neurons.numel())):]
            layer.fc1.weight[dropped] = 0
            layer.fc1.bias[dropped] = 0
        right = total = 0
        for sample in batches:
            logits, _ = model(sample["net_input"]["src_tokens"], features_only=True, classification_head_name=HEAD)
            right += int((logits.argmax(-1) == sample["target"].view(-1)).sum())
            total += logits.size(0)
        return 100.0 * right / total
    finally:
        for name, p in model.named_parameters():
            p.copy_(saved[name])


def importance_study(save_dir: Path, data: Path, examples: int = 2048, batch_size: int = 32,
                     log: Callable[[str], None] = print) -> dict:
    """Both importances of ``save_dir``'s dense model on ``examples`` training examples
    and the dev accuracy of each order's cuts at :data:`WIDTHS`."""
    dense = save_dir / "dense" / "checkpoint_best.pt"
    model, task = load_checkpoint(dense, data)
    model.eval()
    log(f"importance of {dense} on {examples} training examples")
    found = both_importances(model, samples(task, "train", batch_size), examples)
    dev = split_batches(task, batch_size, "valid")
    table = {order: {str(w): cut_accuracy(model, dev, importance, w) for w in (1.0, *WIDTHS)}
             for order, importance in found.items()}
    agreement = {kind: spearman(getattr(found[ORDERS[0]], kind), getattr(found[ORDERS[1]], kind))
                 for kind in Importance._fields}
    return {"checkpoint": str(dense), "examples": examples, "dev_accuracy": table, "spearman": agreement}


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean over layers of the rank correlation of two importances."""
    ranks = lambda t: t.argsort(dim=1).argsort(dim=1).float()  # noqa: E731
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(1, keepdim=True), rb - rb.mean(1, keepdim=True)
    return float(((ra * rb).sum(1) / (ra.norm(dim=1) * rb.norm(dim=1))).mean())


def report(study: dict, dataset: str) -> str:
    widths = list(next(iter(study["dev_accuracy"].values())))
    lines = [f"# Head and neuron importance on {dataset}: which order cuts better",
             "", f"The dense model `{study['checkpoint']}` cut to each order's first units "
             f"(the same fraction of heads and FFN neurons in every layer, no retraining); dev accuracy. "
             f"Importance on {study['examples']} training examples.", "",
             "| order | " + " | ".join(f"width {w}" for w in widths) + " | mean below 1 |",
             "|---|" + "---|" * (len(widths) + 1)]
    for order, row in study["dev_accuracy"].items():
        below = [row[w] for w in widths if float(w) < 1]
        lines.append(f"| {order} | " + " | ".join(f"{row[w]:.2f}" for w in widths) +
                     f" | {sum(below) / len(below):.2f} |")
    lines += ["", "Rank agreement of the two importances (Spearman, mean over layers): " +
              ", ".join(f"{kind} {value:.3f}" for kind, value in study["spearman"].items()), ""]
    return "\n".join(lines)


def save(study: dict, dataset: str, out_dir: Path) -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / f"importance-{dataset}.json", study)
    text = report(study, dataset)
    write_atomic(out_dir / f"importance-{dataset}.md", text)
    return text
