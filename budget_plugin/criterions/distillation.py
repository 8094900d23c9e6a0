"""The distillation terms of the loss: a teacher's softened class distribution (Hinton et
al. 2015), and its layer outputs (DynaBERT's hidden-state term), each summed over the
batch as the task loss is."""

from typing import List

import torch.nn.functional as F
from torch import Tensor


def soft_distillation(logits: Tensor, teacher: Tensor, temperature: float) -> Tensor:
    """T^2 * KL(teacher || model) of the softened class distributions, summed over the
    batch (T^2 keeps its gradients on the cross-entropy's scale)."""
    T = temperature
    if logits.size(1) != teacher.size(1):
        raise ValueError(f"the teacher has {teacher.size(1)} classes; the model {logits.size(1)}")
    target = F.log_softmax(teacher.float() / T, dim=-1)
    model = F.log_softmax(logits.float() / T, dim=-1)
    return T * T * F.kl_div(model, target, reduction="sum", log_target=True)


def hidden_distillation(states: List[Tensor], teacher: List[Tensor], padding: Tensor) -> Tensor:
    """Sum over layers and examples of the mean squared difference of a layer's output
    (T x B x C) from the teacher's over the example's tokens (``padding``, B x T, left
    out) and features."""
    keep = (~padding).t().unsqueeze(-1).float()  # T x B x 1
    per_example = keep.sum(dim=0).squeeze(-1) * states[0].size(-1)  # B: its tokens x features
    loss = sum((((state.float() - target.float()) ** 2) * keep).sum(dim=(0, 2))
               for state, target in zip(states, teacher))
    return (loss / per_example).sum()
