"""The budget dial's calibration (``--head-ratio R``): for each ratio of the range the
dial accepts (``calibration_ratios``: --min-heads / H, ``DIAL_RATIOS`` and 1), the shift
of every layer's budget logit that makes the mean head ratio over a split's examples R.
One shift for all layers and inputs moves the mean and keeps what the router learned:
which inputs and layers get more heads than others.

A layer's budget depends on the layers before it (they ran fewer heads when shifted),
so the shifts are found on the model's own runs, by bisection (the mean ratio only
grows with the shift), each search starting from what the earlier ones found. At the
ends, where every shift past a point gives the same ratio, the row holds the point (the
last shift at --min-heads, the first at every head), so that the ratios just inside
interpolate towards it. The table is stored in the checkpoint (the model's ``head_dial``
buffer) with the split it was calibrated on (``dial_calibration``, which the export
reads), so that serving needs no data; the model interpolates between its rows."""

from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ..tools.checkpoints import load_checkpoint, read, rewrite
from ..tools.errors import DataError
from ..tools.evaluation import layer_heads, split_batches
from .settings import Dial
from .state_format import STATE_FORMAT

# the mean head ratios calibrated besides the ends of the range --head-ratio accepts,
# --min-heads / H and 1 (calibration_ratios); a ratio between two rows is interpolated.
# A checkpoint keeps its own ratios beside their shifts: changing this leaves it valid
DIAL_RATIOS = (0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 0.9)
SHIFT_BOUND = 40.0  # |shift| past which sigmoid's budget is at its ends for any router logit
TOLERANCE = 0.005  # a ratio within this of its aim ends the search
MISSED = 0.02  # what the dial promises: a row further than this from its aim is reported
SHIFT_RESOLUTION = 0.01  # an end's point, found to this (a budget moves < (H - m) / 400 within it)
RECORD = "dial_calibration"  # the checkpoint's key for the calibration's split and data folder


def calibration_ratios(min_heads: int, num_heads: int, ratios: Sequence[float] = DIAL_RATIOS) -> List[float]:
    """The ratios a dial is calibrated at: the whole range --head-ratio accepts, its ends
    (--min-heads / H, 1) and ``ratios`` between them, so no accepted ratio is outside
    the table."""
    low = min_heads / num_heads
    return [low, *sorted(r for r in set(ratios) if low < r < 1), 1.0]


def mean_ratio(model, batches: Sequence[dict]) -> float:
    """The mean head ratio over the batches' examples and the model's layers."""
    heads = layer_heads(model, batches)
    return sum(heads) / (len(heads) * model.args.encoder_attention_heads)


def calibrate(model, batches: Sequence[dict], ratios: Sequence[float] = DIAL_RATIOS,
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
    for aim, shift in sorted(rows.items()):
        found = seen[shift]
        log(f"head ratio {aim:.3f}: shift {shift:+.3f} gives {found:.4f}")
        if abs(found - aim) > MISSED:
            log(f"warning: head ratio {aim:.3f} not reached: the closest shift gives {found:.4f}, further than the "
                f"tolerance {MISSED} (too few examples or heads in the split for that ratio, or budgets that do "
                "not vary); the dial runs that shift for it")
    log(f"{len(seen)} runs over the split")
    return torch.tensor(sorted(rows.items()))


def spread(batches: Sequence[dict], examples: int) -> Sequence[dict]:
    """About ``examples`` of the batches' examples: whole batches, evenly spaced (fairseq's
    evaluation batches go from the shortest inputs to the longest, so that the lengths,
    and the budgets that follow them, are spread as in the whole split)."""
    total = sum(sample["nsentences"] for sample in batches)
    if total <= examples:
        return batches
    kept = max(1, round(len(batches) * examples / total))
    return [batches[(2 * i + 1) * len(batches) // (2 * kept)] for i in range(kept)]  # each stretch's middle


def calibrate_checkpoint(checkpoint: Path, data: Path, split: str = "valid", batch_size: int = 64,
                         log: Callable[[str], None] = print, max_examples: Optional[int] = None) -> torch.Tensor:
    """Calibrate a checkpoint's dial on ``split`` of ``data`` (with ``max_examples``, on
    about that many of its examples: :func:`spread`) and store the table in the
    checkpoint (rewritten atomically), with the split it was calibrated on. Returns the
    table."""
    model, task = load_checkpoint(checkpoint, data)
    if not hasattr(model, "head_dial"):
        raise DataError(f"checkpoint {checkpoint}: no budget predictor to calibrate "
                        "(--head-selection nested or learned)")
    if model.head_ratio is not None:
        raise DataError("calibrate without --head-ratio: the dial is what is being calibrated")
    batches = split_batches(task, batch_size, split)
    if not batches:
        raise DataError(f"{data}: split '{split}' has no examples")
    if max_examples:
        batches = spread(batches, max_examples)
        log(f"calibrating on {sum(sample['nsentences'] for sample in batches)} of the split's examples")
    table = calibrate(model, batches, log=log)
    state = read(checkpoint)
    state["model"]["head_dial"] = table.to(state["model"].get("head_dial", table).dtype)
    state["model"]["budget_format"] = torch.tensor(STATE_FORMAT)  # the table is today's, whatever the rest was
    state[RECORD] = {"split": split, "data": str(data)}
    rewrite(checkpoint, state)
    return table
