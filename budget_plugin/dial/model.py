"""The dial on the model: :class:`DialMixin`, BudgetFormerModel's methods that turn a
``--head-ratio`` or ``--width`` into the :class:`Dial` its forward runs.

A ratio R of ``--head-ratio`` shifts every layer's budget logit by the shift calibrated
for R (calibration.py, stored in the ``head_dial`` buffer); counts per layer run those
heads with no router. A ``--width`` runs heads and FFN neurons per layer, a ratio
allocated to the layers as the checkpoint stores it (allocation.py). Both apply at
evaluation only. A call's setting is an argument of the forward, never model state, so
that concurrent calls (the hub's ``predict(..., head_ratio=)``) each run their own."""

import argparse
import contextlib
from typing import Iterator, Optional, Tuple, Union

import numpy
import torch
from fairseq.utils import safe_getattr

from ..option_error import OptionError, require
from .parsing import parse_head_ratio, parse_width
from .settings import Dial, HeadRatio, Width
from .width import stored_priorities

NEEDS_CALIBRATION = ("--head-ratio R needs the budget dial's calibration, which this checkpoint lacks: run "
                     "budget-calibrate CHECKPOINT DATA_DIR (budget-finetune does it), or give fixed per-layer counts "
                     "(--head-ratio 4,4,3,3,4,4)")


class DialMixin:
    """The dial's part of BudgetFormerModel. The model provides ``args`` and ``budget``
    (its BudgetConfig); :meth:`init_dial` adds the rest."""

    args: argparse.Namespace
    budget: "BudgetConfig"  # noqa: F821  (config.py's)
    head_dial: torch.Tensor  # rows (mean head ratio, budget-logit shift): the calibration
    head_priority: torch.Tensor  # L x H, or no rows: the width dial's allocation of heads
    neuron_priority: torch.Tensor  # L x F, or no rows: ... of FFN neurons
    head_ratio: Optional[HeadRatio]  # the model's own --head-ratio
    width: Optional[str]  # the model's own --width
    dial_setting: Dial  # what the forward runs when a call names no dial

    def init_dial(self, args) -> None:
        """The dial's buffers (a model with a budget predictor) and the model's own
        setting from ``--head-ratio`` or ``--width`` (task options, so that
        fairseq-validate parses them), applied once the weights are loaded
        (:meth:`reset_dial`)."""
        if self.budget.predicts_budget:
            self.register_buffer("head_dial", torch.zeros(0, 2))  # none until calibration.py fills it
            self.register_buffer("head_priority", torch.zeros(0, args.encoder_attention_heads))
            self.register_buffer("neuron_priority", torch.zeros(0, args.encoder_ffn_embed_dim))
        head_ratio = safe_getattr(args, "head_ratio", None)
        if head_ratio is not None and not self.budget.predicts_budget:
            self.dial_of(head_ratio)  # refused, in one line: this model has no dial
        self.head_ratio = parse_head_ratio(head_ratio, args.encoder_layers, args.encoder_attention_heads,
                                           self.budget.min_heads)
        self.width = safe_getattr(args, "width", None)
        require(self.width is None or head_ratio is None, "width", "given without --head-ratio (a width sets the "
                "heads too)", self.width)
        self.dial_setting = Dial()
        if self.width is not None or (self.head_ratio is not None and self.head_ratio.counts is not None):
            self.reset_dial()  # no calibration needed

    def refuse_dial(self, option: str, value) -> None:
        """A fixed-width model (an export) has no dial: refuse ``option``."""
        if self.budget.head_selection == "pruned":
            raise OptionError(
                f"{option} {value}: this is a fixed-width model (an export, --head-selection pruned, heads per "
                f"layer {self.args.fixed_heads}) and has no budget dial: dial the nested checkpoint it was exported "
                "from, or export another width")
        if option == "--head-ratio" and not self.budget.predicts_budget:
            raise OptionError(f"--head-ratio needs a model with a budget predictor (--head-selection nested or "
                              f"learned), not {self.budget.head_selection}")

    def dial_shift(self, ratio: float) -> float:
        """The budget-logit shift that gives mean head ratio ``ratio`` on the calibration
        split, interpolated between the calibrated ratios; a ratio outside them is
        refused (a checkpoint calibrated before the table covered the whole range)."""
        table = self.head_dial.detach().cpu().double()
        if table.numel() == 0 or not bool((table[:, 0] > 0).all()):  # no calibrated ratio
            raise OptionError(NEEDS_CALIBRATION)
        ratios, shifts = table[:, 0].tolist(), table[:, 1].tolist()
        if not ratios[0] - 1e-9 <= ratio <= ratios[-1] + 1e-9:
            raise OptionError(
                f"--head-ratio {ratio:g}: this checkpoint's dial is calibrated for [{ratios[0]:.3g}, "
                f"{ratios[-1]:.3g}] only: calibrate it again (budget-calibrate CHECKPOINT DATA_DIR covers "
                f"[--min-heads / H, 1]), or give fixed per-layer counts (--head-ratio 4,4,3,3,4,4)")
        return float(numpy.interp(ratio, ratios, shifts))

    def dial_of(self, head_ratio: Union[None, str, float, HeadRatio, Dial]) -> Dial:
        """The :class:`Dial` of a --head-ratio value (or a parsed one); None: no dial
        (the router's own budgets)."""
        if head_ratio is None or isinstance(head_ratio, Dial):
            return head_ratio or Dial()
        self.refuse_dial("--head-ratio", head_ratio.option() if isinstance(head_ratio, HeadRatio) else head_ratio)
        if not isinstance(head_ratio, HeadRatio):
            H, L = self.args.encoder_attention_heads, self.args.encoder_layers
            head_ratio = parse_head_ratio(head_ratio, L, H, self.budget.min_heads)
        if head_ratio.counts is not None:
            return Dial(counts=tuple(head_ratio.counts))
        return Dial(shift=self.dial_shift(head_ratio.ratio))

    def width_dial(self, width: Union[str, float, Width]) -> Dial:
        """The :class:`Dial` of a --width value: counts of heads and FFN neurons per
        layer, no router."""
        self.refuse_dial("--width", width.option() if isinstance(width, Width) else width)
        if not isinstance(width, Width):
            args = self.args
            width = parse_width(width, args.encoder_layers, args.encoder_attention_heads,
                                args.encoder_ffn_embed_dim, self.budget.min_heads, self.width_priorities())
        return width.dial()

    def width_priorities(self) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """The heads' and neurons' priorities that allocate a --width ratio to the
        layers; None where none were stored (every layer the same ratio)."""
        return stored_priorities(getattr(self, "head_priority", None), getattr(self, "neuron_priority", None))

    def store_priorities(self, heads: Optional[torch.Tensor], neurons: Optional[torch.Tensor]):
        """Keep the width dial's allocation (None: the same ratio in every layer)."""
        self.head_priority = self.head_priority[:0] if heads is None else heads.to(self.head_priority)
        self.neuron_priority = self.neuron_priority[:0] if neurons is None else neurons.to(self.neuron_priority)

    def store_dial(self, table: torch.Tensor):
        """Keep a calibration (rows: ratio, shift; calibration.py) as the model's
        ``head_dial``, whatever its number of rows."""
        self.head_dial = table.detach().to(self.head_dial)
        self.reset_dial()

    def reset_dial(self):
        """The model's own setting, which its forward runs when a call names none: its
        --width if it has one, else its --head-ratio (None: the router's own budgets).
        Called again once a calibration is loaded or stored."""
        width = getattr(self, "width", None)
        self.dial_setting = self.width_dial(width) if width is not None else self.dial_of(self.head_ratio)

    @contextlib.contextmanager
    def dialled(self, head_ratio) -> Iterator[None]:
        """Inside ``with model.dialled("0.3"):`` (a --head-ratio value, or a
        :class:`Dial`) the model runs at that setting; at its own after the block. It
        changes the model's own setting, so it is for one thread: concurrent callers
        pass theirs to the forward (``model(tokens, dial=model.dial_of("0.3"))``, as the
        hub's ``predict`` does)."""
        own = self.dial_setting
        self.dial_setting = self.dial_of(head_ratio)
        try:
            yield
        finally:
            self.dial_setting = own
