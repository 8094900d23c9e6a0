"""The budget dial (``--head-ratio``): what a setting means, and how a BudgetFormer runs
at one. A ratio R shifts every layer's budget logit by the shift calibrated for R
(nested/calibration.py, stored in the model's ``head_dial`` buffer); counts per layer
run those heads with no router. Both apply at evaluation only."""

import contextlib
from typing import Iterator, List, NamedTuple, Optional, Sequence

import numpy

from ..config import OptionError, require

# the mean head ratios at which nested/calibration.py calibrates the budget dial
# (--head-ratio); a ratio between two of them is interpolated
DIAL_RATIOS = (0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 0.9)


class HeadRatio(NamedTuple):
    """A budget dial setting (--head-ratio): a mean head ratio for the per-input budgets
    (``ratio``, with ``counts`` None), or a fixed count per layer (``counts``)."""

    ratio: Optional[float]
    counts: Optional[List[int]]


def parse_head_ratio(value, num_layers: int, num_heads: int, min_heads: int = 1) -> Optional[HeadRatio]:
    """--head-ratio: None; one number R in (0, 1] (the per-input budgets dialled to a
    mean head ratio R; 1 runs every head with no router); or ``num_layers``
    comma-separated whole numbers (each layer's count, no router)."""
    if value is None or value == "":
        return None
    text = str(value)
    try:
        numbers = [float(v) for v in text.split(",")]
    except ValueError:
        numbers = []
    if "," not in text and len(numbers) == 1:
        ratio = numbers[0]
        require(min_heads / num_heads <= ratio <= 1, "head_ratio",
                f"a ratio in [--min-heads / H, 1] = [{min_heads / num_heads:.3f}, 1], or {num_layers} "
                "comma-separated head counts", value)
        return HeadRatio(None, [num_heads] * num_layers) if ratio == 1 else HeadRatio(ratio, None)
    require(len(numbers) == num_layers and all(n == int(n) and min_heads <= n <= num_heads for n in numbers),
            "head_ratio", f"one ratio in (0, 1], or {num_layers} comma-separated whole head counts (one per "
            f"layer) in [--min-heads, {num_heads}]", value)
    return HeadRatio(None, [int(n) for n in numbers])


class BudgetDial:
    """The dial's methods of BudgetFormerModel, which holds ``head_dial`` (the
    calibration), ``head_ratio`` (its own setting) and ``budgeted_attentions()``."""

    def dial_shift(self, ratio: float) -> float:
        """The budget-logit shift that gives mean head ratio ``ratio`` on the calibration
        split, interpolated between the calibrated ratios (and held past their ends)."""
        table = self.head_dial.detach().cpu().double()
        if not bool((table[:, 0] > 0).all()):  # no calibrated ratio
            raise OptionError(
                "--head-ratio R needs the budget dial's calibration, which this checkpoint lacks: "
                "run scripts/calibrate.py CHECKPOINT DATA_DIR (scripts/finetune.py does it), or give "
                "fixed per-layer counts (--head-ratio 4,4,3,3,4,4)")
        ratios, shifts = table[:, 0].tolist(), table[:, 1].tolist()
        return float(numpy.interp(ratio, ratios, shifts))

    def set_head_ratio(self, head_ratio: Optional[HeadRatio]):
        """The budget dial at evaluation (None: the router's own budgets)."""
        if head_ratio is None:
            self.dial_routers(0.0, None)
        elif head_ratio.counts is not None:
            self.dial_routers(0.0, head_ratio.counts)
        else:
            self.dial_routers(self.dial_shift(head_ratio.ratio), None)

    def dial_routers(self, shift: float, counts: Optional[Sequence[int]]):
        """Every router's evaluation setting: its budget logits shifted by ``shift``, or
        (``counts``, one per layer) a fixed count."""
        for i, attention in enumerate(self.budgeted_attentions()):
            attention.router.dial_shift = shift
            attention.router.dial_heads = None if counts is None else int(counts[i])

    @contextlib.contextmanager
    def dialled(self, head_ratio) -> Iterator[None]:
        """Inside ``with model.dialled("0.3"):`` (a --head-ratio value) the model runs at
        that setting; at its own (--head-ratio, or none) after the block."""
        H, L = self.args.encoder_attention_heads, self.args.encoder_layers
        self.set_head_ratio(parse_head_ratio(head_ratio, L, H, self.budget.min_heads))
        try:
            yield
        finally:
            self.set_head_ratio(self.head_ratio)
