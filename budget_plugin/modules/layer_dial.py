"""A layer's part of a dial setting, handed to it with each forward (an argument, never
layer or router state, so that concurrent calls can run at different settings)."""

from typing import NamedTuple, Optional


class LayerDial(NamedTuple):
    """The budget dial as one layer runs it. Its heads part (``shift``, ``heads``)
    applies at evaluation only (training ignores it: the predictor is trained as it
    predicts); its FFN width applies in training too (the sandwich's widths)."""

    shift: float = 0.0  # added to the budget logit of every input
    heads: Optional[int] = None  # a fixed count for every input, no predictor
    neurons: Optional[int] = None  # the FFN runs its first this many neurons (None: all)


NO_DIAL = LayerDial()
