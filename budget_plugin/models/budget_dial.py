"""The budget dial (``--head-ratio``): what a setting means, and how a BudgetFormer runs
at one. A ratio R shifts every layer's budget logit by the shift calibrated for R
(nested/calibration.py, stored in the model's ``head_dial`` buffer); counts per layer
run those heads with no router. Both apply at evaluation only. The setting reaches the
routers as an argument of the forward (a :class:`Dial`), never as router state, so
that concurrent calls (the hub's ``predict(..., head_ratio=)``) each run their own."""

import contextlib
from typing import Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy
import torch

from ..config import OptionError, require
from ..modules.layer_dial import NO_DIAL, LayerDial

# the mean head ratios at which nested/calibration.py calibrates the budget dial
# (--head-ratio) besides the ends of the range it accepts, --min-heads / H and 1
# (calibration_ratios); a ratio between two of them is interpolated. A checkpoint keeps
# the ratios it was calibrated at beside their shifts: changing this tuple leaves it valid
DIAL_RATIOS = (0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 0.9)

# The layout of a BudgetFormer's state dict, recorded in its ``budget_format`` buffer; a
# checkpoint without one is format 1. Format 1: ``head_dial`` has one row (ratio, shift)
# per ratio of that day's DIAL_RATIOS, zeros when uncalibrated, and rows at or under
# --min-heads / H hold a placeholder shift (-40), not a calibration. Format 2: every row
# of ``head_dial`` is calibrated (none when uncalibrated), sorted by ratio, any number.
# Format 3: also ``head_priority`` (L x H) and ``neuron_priority`` (L x F), the width
# dial's allocation (models/width.py), or no rows: the same width in every layer.
STATE_FORMAT = 3
# the buffers of a dial's calibration, which a model without a dial (an export) lacks
DIAL_BUFFERS = ("head_dial", "head_priority", "neuron_priority")


def calibration_ratios(min_heads: int, num_heads: int, ratios: Sequence[float] = DIAL_RATIOS) -> List[float]:
    """The ratios a dial is calibrated at: the whole range --head-ratio accepts, its ends
    (--min-heads / H, 1) and ``ratios`` between them, so no accepted ratio is outside
    the table."""
    low = min_heads / num_heads
    return [low, *sorted(r for r in set(ratios) if low < r < 1), 1.0]


def upgrade_table(table: torch.Tensor, state_format: int, min_ratio: float) -> torch.Tensor:
    """A ``head_dial`` table of an older format in today's: format 1's uncalibrated zeros
    become no rows, and its placeholder rows (ratios at or under ``min_ratio``) go."""
    if state_format >= 2:
        return table
    calibrated = table[:, 0] > min_ratio + 1e-9
    return table[calibrated] if bool(calibrated.any()) else table[:0]


class HeadRatio(NamedTuple):
    """A budget dial setting (--head-ratio): a mean head ratio for the per-input budgets
    (``ratio``, with ``counts`` None), or a fixed count per layer (``counts``)."""

    ratio: Optional[float]
    counts: Optional[List[int]]


class Dial(NamedTuple):
    """A setting as the model runs it: every budget logit shifted by ``shift``, or
    ``counts`` (one per layer) with no router; and each layer's FFN cut to its first
    ``neurons`` (one per layer; None: every neuron)."""

    shift: float = 0.0
    counts: Optional[Tuple[int, ...]] = None
    neurons: Optional[Tuple[int, ...]] = None

    def layer(self, index: int) -> LayerDial:
        """Layer ``index``'s part (its argument)."""
        neurons = None if self.neurons is None else self.neurons[index]
        if self.counts is not None:
            return LayerDial(heads=self.counts[index], neurons=neurons)
        return LayerDial(shift=self.shift, neurons=neurons) if self.shift or neurons is not None else NO_DIAL


def parse_head_ratio(value, num_layers: int, num_heads: int, min_heads: int = 1) -> Optional[HeadRatio]:
    """--head-ratio: None; one number R in [--min-heads / H, 1] (the per-input budgets
    dialled to a mean head ratio R; the ends run every layer at --min-heads, or every
    head, with no router); or ``num_layers`` comma-separated whole numbers (each
    layer's count, no router)."""
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
        for end in (min_heads, num_heads):  # the ends are exact without a calibration
            if ratio == end / num_heads:
                return HeadRatio(None, [end] * num_layers)
        return HeadRatio(ratio, None)
    require(len(numbers) == num_layers and all(n == int(n) and min_heads <= n <= num_heads for n in numbers),
            "head_ratio", f"one ratio in (0, 1], or {num_layers} comma-separated whole head counts (one per "
            f"layer) in [--min-heads, {num_heads}]", value)
    return HeadRatio(None, [int(n) for n in numbers])


class BudgetDial:
    """The dial's methods of BudgetFormerModel, which holds ``head_dial`` (the
    calibration), ``head_ratio`` (its --head-ratio), ``dial_setting`` (the :class:`Dial`
    its forward runs when the call names none) and ``budgeted_attentions()``."""

    def dial_shift(self, ratio: float) -> float:
        """The budget-logit shift that gives mean head ratio ``ratio`` on the calibration
        split, interpolated between the calibrated ratios; a ratio outside them is
        refused (a checkpoint calibrated before the table covered the whole range)."""
        table = self.head_dial.detach().cpu().double()
        if table.numel() == 0 or not bool((table[:, 0] > 0).all()):  # no calibrated ratio
            raise OptionError(
                "--head-ratio R needs the budget dial's calibration, which this checkpoint lacks: "
                "run budget-calibrate CHECKPOINT DATA_DIR (budget-finetune does it), or give "
                "fixed per-layer counts (--head-ratio 4,4,3,3,4,4)")
        ratios, shifts = table[:, 0].tolist(), table[:, 1].tolist()
        if not ratios[0] - 1e-9 <= ratio <= ratios[-1] + 1e-9:
            raise OptionError(
                f"--head-ratio {ratio:g}: this checkpoint's dial is calibrated for [{ratios[0]:.3g}, "
                f"{ratios[-1]:.3g}] only: calibrate it again (budget-calibrate CHECKPOINT DATA_DIR covers "
                f"[--min-heads / H, 1]), or give fixed per-layer counts (--head-ratio 4,4,3,3,4,4)")
        return float(numpy.interp(ratio, ratios, shifts))

    def dial_of(self, head_ratio: Union[None, str, float, HeadRatio, Dial]) -> Dial:
        """The :class:`Dial` of a --head-ratio value (or a parsed one); None: no dial
        (the router's own budgets). A model without a budget predictor has no dial."""
        if head_ratio is None or isinstance(head_ratio, Dial):
            return head_ratio or Dial()
        selection = self.budget.head_selection
        if selection == "pruned":
            if isinstance(head_ratio, HeadRatio):
                head_ratio = head_ratio.ratio if head_ratio.counts is None else ",".join(map(str, head_ratio.counts))
            raise self.no_dial("--head-ratio", head_ratio)
        if not self.budget.predicts_budget:
            raise OptionError(f"--head-ratio needs a model with a budget predictor (--head-selection nested or "
                              f"learned), not {selection}")
        if not isinstance(head_ratio, HeadRatio):
            H, L = self.args.encoder_attention_heads, self.args.encoder_layers
            head_ratio = parse_head_ratio(head_ratio, L, H, self.budget.min_heads)
        if head_ratio.counts is not None:
            return Dial(counts=tuple(head_ratio.counts))
        return Dial(shift=self.dial_shift(head_ratio.ratio))

    def no_dial(self, option: str, value) -> OptionError:
        """The refusal of a dial ``option`` on a fixed-width model (an export)."""
        return OptionError(
            f"{option} {value}: this is a fixed-width model (an export, --head-selection pruned, heads per layer "
            f"{self.args.fixed_heads}) and has no budget dial: dial the nested checkpoint it was exported from, "
            "or export another width")

    def width_dial(self, width) -> Dial:
        """The :class:`Dial` of a --width value (models/width.py): counts of heads and
        FFN neurons per layer, no router. A fixed-width model (an export) has no dial."""
        from .width import Width, parse_width

        if self.budget.head_selection == "pruned":
            raise self.no_dial("--width", width.option() if isinstance(width, Width) else width)
        if not isinstance(width, Width):
            args = self.args
            width = parse_width(width, args.encoder_layers, args.encoder_attention_heads,
                                args.encoder_ffn_embed_dim, self.budget.min_heads, self.width_priorities())
        return width.dial()

    def width_priorities(self) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """The heads' and neurons' priorities that allocate a --width ratio to the
        layers; None where none were stored (every layer the same ratio)."""
        from .width import stored_priorities

        return stored_priorities(getattr(self, "head_priority", None), getattr(self, "neuron_priority", None))

    def store_priorities(self, heads: Optional[torch.Tensor], neurons: Optional[torch.Tensor]):
        """Keep the width dial's allocation (None: the same ratio in every layer)."""
        self.head_priority = self.head_priority[:0] if heads is None else heads.to(self.head_priority)
        self.neuron_priority = self.neuron_priority[:0] if neurons is None else neurons.to(self.neuron_priority)

    def set_head_ratio(self, head_ratio: Optional[HeadRatio]):
        """The model's own dial setting at evaluation, which its forward runs when the
        call names none: its --width if it has one, else ``head_ratio`` (None: the
        router's own budgets)."""
        width = getattr(self, "width", None)
        self.dial_setting = self.width_dial(width) if width is not None else self.dial_of(head_ratio)

    @contextlib.contextmanager
    def dialled(self, head_ratio) -> Iterator[None]:
        """Inside ``with model.dialled("0.3"):`` (a --head-ratio value, or a
        :class:`Dial`) the model runs at that setting; at its own (--head-ratio, or
        none) after the block. It changes the model's own setting, so it is for one
        thread: concurrent callers pass theirs to the forward
        (``model(tokens, dial=model.dial_of("0.3"))``, as the hub's ``predict`` does)."""
        own = self.dial_setting
        self.dial_setting = self.dial_of(head_ratio)
        try:
            yield
        finally:
            self.dial_setting = own

    def store_dial(self, table: torch.Tensor):
        """Keep a calibration (rows: ratio, shift; nested/calibration.py) as the model's
        ``head_dial``, whatever its number of rows."""
        self.head_dial = table.detach().to(self.head_dial)
        self.set_head_ratio(self.head_ratio)

    def upgrade_dial(self, state_dict: dict, prefix: str):
        """Loading: refuse a state dict of a newer format than this code reads; bring
        an older one's ``head_dial`` to today's format, and fit the model's buffer to the
        checkpoint's number of rows (its own ratios, whatever DIAL_RATIOS is now)."""
        found = state_dict.get(prefix + "budget_format")
        state_format = 1 if found is None else int(found)
        if state_format > STATE_FORMAT:
            raise OptionError(f"the checkpoint's budget_format is {state_format}, newer than this budget_plugin "
                              f"reads ({STATE_FORMAT}): load it with the budget_plugin that wrote it, or a newer one")
        state_dict[prefix + "budget_format"] = torch.tensor(STATE_FORMAT)
        if not hasattr(self, "head_dial"):
            for name in DIAL_BUFFERS:  # a dial this model cannot run (an export's)
                state_dict.pop(prefix + name, None)
            return
        for name in ("head_priority", "neuron_priority"):  # none before format 3: uniform widths
            found = state_dict.setdefault(prefix + name, getattr(self, name)[:0])
            setattr(self, name, getattr(self, name).new_empty(found.shape))  # the checkpoint's rows
        table = state_dict.get(prefix + "head_dial")
        table = self.head_dial[:0] if table is None else upgrade_table(
            table, state_format, self.budget.min_heads / self.args.encoder_attention_heads)
        state_dict[prefix + "head_dial"] = table
        if table.shape != self.head_dial.shape:
            self.head_dial = torch.zeros(table.shape, dtype=self.head_dial.dtype, device=self.head_dial.device)
