"""An update's forward passes (the sandwich's widths, criterions/budget_sentence_prediction.py)
and their losses: one backward for their sum, or one backward each as it comes."""

import contextlib
from typing import Callable, Optional

from torch import Tensor


class UpdatePasses:
    """An update's losses, one per forward pass: summed into one loss for one backward,
    or, given ``backward``, each backpropagated as it comes (then the total is detached).
    Under data parallelism every pass but the last accumulates its gradients locally
    (DDP's ``no_sync``), so that they are reduced once per update."""

    def __init__(self, model, backward: Optional[Callable[[Tensor], None]]):
        self.model, self.backward, self.total = model, backward, 0.0

    def unsynced(self, last: bool = False):
        """A pass's context: DDP's ``no_sync`` unless it is the update's ``last``, whose
        backward reduces every pass's gradients."""
        no_sync = getattr(self.model, "no_sync", None)
        if last or self.backward is None or no_sync is None:
            return contextlib.nullcontext()
        return no_sync()

    def add(self, loss: Tensor) -> Tensor:
        if self.backward is None:
            self.total = self.total + loss
            return loss
        self.backward(loss)
        self.total = self.total + loss.detach()
        return loss.detach()
