"""The head dial's calibration as it was before issue 51 (commit f226bfd's
``budget_plugin/dial/calibration.py: calibrate``): plain bisection on the model's runs,
kept for calibration_cost.py's side-by-side comparison with the product's."""

from typing import Callable, Dict, Sequence

import torch

from budget_plugin.dial.calibration import DIAL_RATIOS, MISSED, SHIFT_BOUND, SHIFT_RESOLUTION, TOLERANCE
from budget_plugin.dial.calibration import calibration_ratios, mean_ratio, table
from budget_plugin.dial.settings import Dial


def bisection_calibrate(model, batches: Sequence[dict], ratios: Sequence[float] = DIAL_RATIOS,
              steps: int = 24, log: Callable[[str], None] = lambda _: None) -> torch.Tensor:
    """N x 2: each ratio of ``calibration_ratios(ratios)`` and the shift that gives it on
    ``batches`` (the closest found in at most ``steps`` runs a ratio; one that misses by
    more than MISSED is logged as a warning), and a row at the middle of two rows whose
    interpolation misses it by more than MISSED. Every run's result is kept, so that each
    search starts from the tightest bracket the earlier ones left. ``model`` is in eval
    mode; its own dial setting is untouched."""
    seen: Dict[float, float] = {}  # shift -> the mean ratio it gave

    def ratio_at(shift: float) -> float:
        if shift not in seen:
            with model.dialled(Dial(shift=shift)):
                seen[shift] = mean_ratio(model, batches)
        return seen[shift]

    def inside(aim: float) -> float:
        """The shift whose ratio is closest to ``aim``."""
        for _ in range(steps):
            closest = min(seen.items(), key=lambda item: abs(item[1] - aim), default=None)
            if closest is not None and abs(closest[1] - aim) <= TOLERANCE:
                break
            low = max((s for s, r in seen.items() if r < aim), default=-SHIFT_BOUND)
            high = min((s for s, r in seen.items() if r > aim), default=SHIFT_BOUND)
            ratio_at((low + high) / 2)
        return min(seen.items(), key=lambda item: abs(item[1] - aim))[0]

    def end(aim: float, top: bool) -> float:
        """The first shift that reaches ``aim`` (``top``: every head), or the last that
        stays at it (--min-heads)."""
        ratio_at(SHIFT_BOUND if top else -SHIFT_BOUND)
        for _ in range(steps):
            at = {s for s, r in seen.items() if abs(r - aim) <= 1e-9}
            low = max((s for s in seen if s not in at and seen[s] < aim) if top else at, default=-SHIFT_BOUND)
            high = min(at if top else (s for s in seen if s not in at and seen[s] > aim), default=SHIFT_BOUND)
            if high - low <= SHIFT_RESOLUTION:
                break
            ratio_at((low + high) / 2)
        at = [s for s, r in seen.items() if abs(r - aim) <= 1e-9]
        if not at:  # never reached: the closest
            return min(seen.items(), key=lambda item: abs(item[1] - aim))[0]
        return min(at) if top else max(at)

    aims = calibration_ratios(model.budget.min_heads, model.args.encoder_attention_heads, ratios)
    rows = {aim: end(aim, aim == aims[-1]) if aim in (aims[0], aims[-1]) else inside(aim) for aim in aims}
    # where the interpolation between two rows misses their middle, a row there too (if
    # the split has a shift for it: a row that misses too would not help)
    pending = list(zip(aims, aims[1:]))
    while pending:
        low, high = pending.pop()
        middle = (low + high) / 2
        if high - low > 2 * MISSED and abs(ratio_at((rows[low] + rows[high]) / 2) - middle) > MISSED:
            shift = inside(middle)
            if abs(seen[shift] - middle) <= MISSED:
                rows[middle] = shift
                pending += [(low, middle), (middle, high)]
    return table(rows, seen, len(seen), log)
