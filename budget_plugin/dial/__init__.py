"""The dial: one trained model, run at the cost a user picks.

- ``settings``: what a setting is, from ``--head-ratio`` / ``--width`` to a layer's part
- ``parsing``: the one reader of every per-layer option
- ``width``: a ``--width`` ratio allocated to the layers
- ``model``: the model's dial methods (BudgetFormerModel's mixin)
- ``calibration``: the ``--head-ratio`` table calibrated on a split
- ``allocation``: the width dial's allocation chosen on dev
- ``state_format``: the checkpoint layout of the dial's buffers, and its upgrades
"""

from .settings import NO_DIAL, Dial, HeadRatio, LayerDial, Width

__all__ = ["NO_DIAL", "Dial", "HeadRatio", "LayerDial", "Width"]
