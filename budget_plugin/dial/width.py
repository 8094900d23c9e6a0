"""The width dial (``--width``): one setting a user reads as cost, cutting every layer's
heads and FFN neurons together to their first (most important) ones, in a nested model
whose heads and neurons are in importance order (nested/reorder.py). ``--head-ratio``
keeps its meaning: the heads alone.

A setting is a ratio R or one ``heads:neurons`` pair per layer (``4:461,4:461,...``),
for experts and exports. A ratio runs R of the model's heads and R of its neurons in
all, allocated to the layers by the model's priorities (``allocated_width``: the
recipe stores them when dev prefers them, allocation.py) or else the same in
every layer (``uniform_width``: round(R x H) heads, at least --min-heads, and round(R x
F) neurons). A width runs no router: every input runs the same counts."""

from typing import Optional, Tuple

import torch

from .settings import Width

# the widths the recipe compares allocations at and budget-finetune reports (< 1: the
# full width is the same in any allocation)
WIDTHS = ("0.75", "0.5", "0.4", "0.3", "0.25")


def uniform_width(ratio: float, num_layers: int, num_heads: int, num_neurons: int, min_heads: int = 1) -> Width:
    """The same ratio in every layer: round(R x H) heads (within [min_heads, H]) and
    round(R x F) neurons (at least one)."""
    heads = max(min_heads, min(num_heads, round(ratio * num_heads)))
    neurons = max(1, min(num_neurons, round(ratio * num_neurons)))
    return Width((heads,) * num_layers, (neurons,) * num_layers)


def allocated(ratio: float, priority: torch.Tensor) -> Tuple[int, ...]:
    """Per layer, how many of its units (heads or neurons, L x N ``priority``, each row
    non-increasing: the units are in importance order) are among the round(R x L x N)
    of highest priority in the model; an infinite priority is a unit every width keeps
    (the trained minimum). Ties go to the earlier unit, then the earlier layer: a
    layer's count is a prefix, and equal priorities allocate evenly."""
    num_layers, units = priority.shape
    kept = int(torch.isinf(priority).sum())
    total = min(num_layers * units, max(kept, round(ratio * num_layers * units)))
    by_position = priority.t().flatten().double()  # unit 0 of every layer, then unit 1, ...
    order = torch.argsort(-by_position, stable=True)[:total]
    return tuple(torch.bincount(order % num_layers, minlength=num_layers).tolist())


def allocated_width(ratio: float, head_priority: torch.Tensor, neuron_priority: torch.Tensor) -> Width:
    """R of the model's heads and R of its neurons, each to the layers whose units have
    the highest priority (:func:`allocated`)."""
    return Width(allocated(ratio, head_priority), allocated(ratio, neuron_priority))


def stored_priorities(head: Optional[torch.Tensor], neuron: Optional[torch.Tensor]
                      ) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """A model's stored allocation (its ``head_priority`` and ``neuron_priority``
    buffers, or a checkpoint's), on the CPU; None where none is stored (uniform)."""
    if head is None or head.numel() == 0:
        return None
    return head.detach().cpu(), neuron.detach().cpu()
