"""The budget dial's calibration (``--head-ratio R``): for each of ``DIAL_RATIOS``, the
shift of every layer's budget logit that makes the mean head ratio over a split's
examples R. One shift for all layers and inputs moves the mean and keeps what the
router learned: which inputs and layers get more heads than others.

A layer's budget depends on the layers before it (they ran fewer heads when shifted),
so the shifts are found on the model's own runs, by bisection (the mean ratio only
grows with the shift), each search starting from what the earlier ones found. The table
is stored in the checkpoint (the model's ``head_dial`` buffer), so that serving needs
no data; the model interpolates between its rows."""

import io
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import torch

from budget_plugin.models.budget_dial import DIAL_RATIOS
from budget_plugin.tools.checkpoints import load_checkpoint, read
from budget_plugin.tools.errors import DataError
from budget_plugin.tools.evaluation import layer_heads, split_batches
from budget_plugin.tools.files import write_atomic

SHIFT_BOUND = 40.0  # |shift| past which sigmoid's budget is at its ends for any router logit
TOLERANCE = 0.005  # a ratio within this of its aim ends the search (the dial promises 0.02)


def mean_ratio(model, batches: Sequence[dict]) -> float:
    """The mean head ratio over the batches' examples and the model's layers."""
    heads = layer_heads(model, batches)
    return sum(heads) / (len(heads) * model.args.encoder_attention_heads)


def calibrate(model, batches: Sequence[dict], ratios: Sequence[float] = DIAL_RATIOS,
              steps: int = 24, log: Callable[[str], None] = lambda _: None) -> torch.Tensor:
    """len(ratios) x 2: each ratio and the shift that gives it on ``batches`` (the
    closest found in at most ``steps`` runs a ratio). Every run's result is kept, so
    that each search starts from the tightest bracket the earlier ones left. ``model``
    is in eval mode; its own dial setting is restored afterwards."""
    seen: Dict[float, float] = {}  # shift -> the mean ratio it gave

    def ratio_at(shift: float) -> float:
        if shift not in seen:
            model.dial_routers(shift, None)
            seen[shift] = mean_ratio(model, batches)
        return seen[shift]

    rows: List[List[float]] = []
    smallest = model.budget.min_heads / model.args.encoder_attention_heads  # every layer at --min-heads
    try:
        for aim in sorted(ratios):
            if aim <= smallest:  # no shift goes lower: the dial refuses ratios under it
                rows.append([aim, -SHIFT_BOUND])
                continue
            for _ in range(steps):
                closest = min(seen.items(), key=lambda item: abs(item[1] - aim), default=None)
                if closest is not None and abs(closest[1] - aim) <= TOLERANCE:
                    break
                low = max((s for s, r in seen.items() if r < aim), default=-SHIFT_BOUND)
                high = min((s for s, r in seen.items() if r > aim), default=SHIFT_BOUND)
                ratio_at((low + high) / 2)
            shift, found = min(seen.items(), key=lambda item: abs(item[1] - aim))
            log(f"head ratio {aim:.2f}: shift {shift:+.3f} gives {found:.4f}")
            rows.append([aim, shift])
    finally:
        model.set_head_ratio(model.head_ratio)
    log(f"{len(seen)} runs over the split")
    return torch.tensor(rows)


def calibrate_checkpoint(checkpoint: Path, data: Path, split: str = "valid", batch_size: int = 64,
                         log: Callable[[str], None] = print) -> torch.Tensor:
    """Calibrate a checkpoint's dial on ``split`` of ``data`` and store the table in the
    checkpoint (rewritten atomically). Returns the table."""
    model, task = load_checkpoint(checkpoint, data)
    if not hasattr(model, "head_dial"):
        raise DataError(f"checkpoint {checkpoint}: no budget predictor to calibrate "
                        "(--head-selection nested or learned)")
    if model.head_ratio is not None:
        raise DataError("calibrate without --head-ratio: the dial is what is being calibrated")
    batches = split_batches(task, batch_size, split)
    if not batches:
        raise DataError(f"{data}: split '{split}' has no examples")
    table = calibrate(model, batches, log=log)
    state = read(checkpoint)
    state["model"]["head_dial"] = table.to(state["model"].get("head_dial", table).dtype)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_atomic(checkpoint, buffer.getvalue())
    return table
