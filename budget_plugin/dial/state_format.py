"""The layout of a BudgetFormer's state dict, recorded in its ``budget_format`` buffer,
and the upgrade of older layouts at load. A checkpoint without the buffer is format 1.

- Format 1: ``head_dial`` has one row (ratio, shift) per ratio of that day's
  calibration ratios, zeros when uncalibrated, and rows at or under --min-heads / H
  hold a placeholder shift (-40), not a calibration.
- Format 2: every row of ``head_dial`` is calibrated (none when uncalibrated), sorted
  by ratio, any number of them.
- Format 3: also ``head_priority`` (L x H) and ``neuron_priority`` (L x F), the width
  dial's allocation (allocation.py), or no rows: the same width in every layer."""

import torch

from ..option_error import OptionError

STATE_FORMAT = 3
# the buffers of a dial's calibration and allocation, which a model without a dial (an export) lacks
DIAL_BUFFERS = ("head_dial", "head_priority", "neuron_priority")


def upgrade_table(table: torch.Tensor, state_format: int, min_ratio: float) -> torch.Tensor:
    """A ``head_dial`` table of an older format in today's: format 1's uncalibrated zeros
    become no rows, and its placeholder rows (ratios at or under ``min_ratio``) go."""
    if state_format >= 2:
        return table
    calibrated = table[:, 0] > min_ratio + 1e-9
    return table[calibrated] if bool(calibrated.any()) else table[:0]


def upgrade_state(model, state_dict: dict, prefix: str) -> None:
    """Loading into ``model``: refuse a state dict of a newer format than this code
    reads; bring an older one's dial buffers to today's format, and fit the model's
    buffers to the checkpoint's numbers of rows (its own ratios and allocation)."""
    found = state_dict.get(prefix + "budget_format")
    state_format = 1 if found is None else int(found)
    if state_format > STATE_FORMAT:
        raise OptionError(f"the checkpoint's budget_format is {state_format}, newer than this budget_plugin "
                          f"reads ({STATE_FORMAT}): load it with the budget_plugin that wrote it, or a newer one")
    state_dict[prefix + "budget_format"] = torch.tensor(STATE_FORMAT)
    if not hasattr(model, "head_dial"):
        for name in DIAL_BUFFERS:  # a dial this model cannot run (an export's)
            state_dict.pop(prefix + name, None)
        return
    for name in ("head_priority", "neuron_priority"):  # none before format 3: uniform widths
        found = state_dict.setdefault(prefix + name, getattr(model, name)[:0])
        setattr(model, name, getattr(model, name).new_empty(found.shape))  # the checkpoint's rows
    table = state_dict.get(prefix + "head_dial")
    table = model.head_dial[:0] if table is None else upgrade_table(
        table, state_format, model.budget.min_heads / model.args.encoder_attention_heads)
    state_dict[prefix + "head_dial"] = table
    if table.shape != model.head_dial.shape:
        model.head_dial = torch.zeros(table.shape, dtype=model.head_dial.dtype, device=model.head_dial.device)
