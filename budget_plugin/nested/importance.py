"""Head and FFN-neuron importance of a fine-tuned model (Michel et al. 2019, "Are
Sixteen Heads Really Better than One?"): the static pruning baseline's choice of heads
(budget-importance, examples/budgetformer/reproduce.py), and the order the nested
recipe gives heads and neurons (reorder.py).

Importance of head h in layer l: the mean over examples of |dL/d xi_lh|, where xi_lh = 1
multiplies the head's output before the output projection and L is the example's
cross-entropy; normalised per layer by its L2 norm, as Michel et al.'s code does. A
neuron's is the same with xi multiplying its activation before fc2 (one mask per FFN
neuron, as DynaBERT's head masks; taken in the same backward pass as the heads')."""

from pathlib import Path
from typing import Iterable, List, NamedTuple, Optional

import torch
import torch.nn.functional as F

from budget_plugin.dial.settings import Dial
from budget_plugin.tools.building import twin
from budget_plugin.tools.checkpoints import load_checkpoint
from budget_plugin.tools.errors import DataError
from budget_plugin.tools.evaluation import samples

HEAD = "sentence_classification_head"


ROUTER_OPTIONS = ("kept_heads", "min_heads", "initial_budget", "relevance_prior", "budget_pooling",
                  "budget_mask_temperature", "head_ratio")


def all_heads_twin(model):
    """A BudgetFormer with ``model``'s weights running every head on the reference path
    (each head's output a tensor of its own), whatever subset ``model`` ran. Its router
    is a static one at every head: a router that reads its input (learned, nested)
    would add its straight-through gradients (zero in the forward pass, not in the
    backward) to the heads' gradients, and the twin's is freshly initialised."""
    heads = model.args.encoder_attention_heads
    return twin(model, "budgetformer", attention_path="reference", head_selection="static", fixed_heads=str(heads),
                **dict.fromkeys(ROUTER_OPTIONS))


class Importance(NamedTuple):
    heads: torch.Tensor  # L x H
    neurons: torch.Tensor  # L x F (F: FFN neurons per layer)


def head_importance(checkpoint: Path, data: Path, split: str, batch_size: int,
                    max_examples: Optional[int] = None) -> torch.Tensor:
    """L x H importance over the split's examples (with ``max_examples``: its first
    batches holding at least that many)."""
    return layer_importance(checkpoint, data, split, batch_size, max_examples).heads


def layer_importance(checkpoint: Path, data: Path, split: str, batch_size: int,
                     max_examples: Optional[int] = None) -> Importance:
    """Heads' and neurons' importance over the split's examples, as :func:`head_importance`."""
    model, task = load_checkpoint(checkpoint, data)
    importance = importance_of(model, samples(task, split, batch_size), max_examples)
    if importance is None:
        raise DataError(f"{data}: split '{split}' has no examples")
    return importance


def importance_of(model, batches: Iterable[dict], max_examples: Optional[int] = None) -> Optional[Importance]:
    """The importance of ``model``'s heads and FFN neurons over fairseq's labelled
    ``batches`` (None if there are none)."""
    every_head = all_heads_twin(model)
    attentions = list(every_head.budgeted_attentions())
    H = attentions[0].num_heads
    gates = {"heads": [], "neurons": []}

    def gated(kind: str, width: int):
        def gate(module, inputs):  # T x B x C: out_proj's input (the heads side by side) or fc2's (the neurons)
            (x,) = inputs
            mask = torch.ones(x.size(1), width, requires_grad=True)
            gates[kind].append(mask)
            return (x * mask.to(x).repeat_interleave(x.size(-1) // width, dim=1),)
        return gate

    layers = every_head.encoder.sentence_encoder.layers
    hooks = [a.out_proj.register_forward_pre_hook(gated("heads", H)) for a in attentions]
    hooks += [layer.fc2.register_forward_pre_hook(gated("neurons", layer.fc2.in_features)) for layer in layers]
    total = Importance(torch.zeros(len(layers), H), torch.zeros(len(layers), layers[0].fc2.in_features))
    examples, dial = 0, Dial.heads_per_layer(H, len(layers))
    try:
        for sample in batches:
            for found in gates.values():
                found.clear()
            logits, _ = every_head(sample["net_input"]["src_tokens"], classification_head_name=HEAD, dial=dial)
            loss = F.cross_entropy(logits.float(), sample["target"].view(-1), reduction="sum")
            grads = torch.autograd.grad(loss, gates["heads"] + gates["neurons"])
            total.heads.add_(torch.stack([g.abs().sum(dim=0) for g in grads[:len(layers)]]))
            total.neurons.add_(torch.stack([g.abs().sum(dim=0) for g in grads[len(layers):]]))
            examples += logits.size(0)
            if max_examples and examples >= max_examples:
                break
    finally:
        for hook in hooks:
            hook.remove()
    if not examples:
        return None
    return Importance(*(normalised(t / examples) for t in total))


def normalised(importance: torch.Tensor) -> torch.Tensor:
    """Each layer's importance divided by its L2 norm (Michel et al.)."""
    return importance / importance.norm(dim=1, keepdim=True).clamp_min(1e-20)


def kept_heads(importance: torch.Tensor, heads_per_layer: List[int]) -> List[List[int]]:
    """Each layer's most important heads, ascending."""
    return [sorted(row.argsort(descending=True)[:k].tolist()) for row, k in zip(importance, heads_per_layer)]


def kept_heads_option(kept: List[List[int]]) -> str:
    """``--kept-heads``'s value: a layer's heads comma-separated, layers separated by ';'."""
    return ";".join(",".join(map(str, heads)) for heads in kept)
