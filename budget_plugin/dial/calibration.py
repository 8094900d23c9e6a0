"""The budget dial's calibration (``--head-ratio R``): for each ratio of the range the
dial accepts (``calibration_ratios``: --min-heads / H, ``DIAL_RATIOS`` and 1), the shift
of every layer's budget logit that makes the mean head ratio over a split's examples R.
One shift for all layers and inputs moves the mean and keeps what the router learned:
which inputs and layers get more heads than others.

A layer's budget depends on the layers before it (they ran fewer heads when shifted),
so the shifts are found on the model's own runs. Each run also records every layer's
budget logit for every example, from which the ratio at a nearby shift is modelled on
the host: a search proposes the modelled shift, runs it, and models again from that
run, so that most ratios take one run (the mean ratio only grows with the shift, so the
runs so far bracket each search, and it bisects where a proposal does not close in).
At the ends, where every shift past a point gives the same ratio, the row holds the
point (the last shift at --min-heads, the first at every head), so that the ratios just
inside interpolate towards it; one run at the bound gives it exactly (``end``). The
table is stored in the checkpoint (the model's ``head_dial`` buffer) with the split it
was calibrated on (``dial_calibration``, which the export reads), so that serving needs
no data; the model interpolates between its rows."""

import math
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ..tools.checkpoints import load_checkpoint, read, rewrite
from ..tools.errors import DataError
from ..tools.evaluation import layer_heads, split_batches, tokens
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


class Runs:
    """The model's runs over the batches, one per shift (each at most once): the mean
    head ratio, and every layer's budget logit for every example (L x N, before the
    shift), which is what the budgets of nearby shifts are modelled from."""

    def __init__(self, model, batches: Sequence[dict]):
        self.model, self.batches = model, batches
        self.min_heads, self.heads = model.budget.min_heads, model.args.encoder_attention_heads
        self.ratio: Dict[float, float] = {}
        self.logits: Dict[float, torch.Tensor] = {}
        self.count = 0  # the model's runs (``copy`` adds a shift, not a run)

    @torch.no_grad()
    def __call__(self, shift: float) -> float:
        if shift not in self.ratio:
            heads, logits = 0.0, []
            with self.model.dialled(Dial(shift=shift)):
                for sample in self.batches:
                    layers = self.model(tokens(sample), features_only=True)[1]["budget"]
                    heads += sum(float(layer["heads"].sum()) for layer in layers)
                    logits.append(torch.stack([layer["budget_logit"] for layer in layers]))
            logits = torch.cat(logits, dim=1)
            self.ratio[shift], self.logits[shift] = heads / (logits.numel() * self.heads), logits
            self.count += 1
        return self.ratio[shift]

    def copy(self, shift: float, to: float):
        """``to`` runs what ``shift`` ran (the same counts in every layer: see ``end``)."""
        self.ratio[to], self.logits[to] = self.ratio[shift], self.logits[shift]

    def modelled(self, shift: float, near: float) -> float:
        """The mean ratio at ``shift`` if every layer's logits were those of the run at
        ``near`` (they move as the layers before run other heads: a model, not a run)."""
        H, m = self.heads, self.min_heads
        return float(torch.round(m + (H - m) * torch.sigmoid(self.logits[near] + shift)).mean()) / H

    def modelled_shift(self, aim: float, near: float, low: float, high: float) -> float:
        """The shift in (low, high) whose modelled ratio is closest to ``aim`` (bisection
        on the host: the modelled ratio only grows with the shift)."""
        for _ in range(40):
            middle = (low + high) / 2
            if self.modelled(middle, near) < aim:
                low = middle
            else:
                high = middle
        return min((low, high), key=lambda s: abs(self.modelled(s, near) - aim))


def calibrate(model, batches: Sequence[dict], ratios: Sequence[float] = DIAL_RATIOS,
              steps: int = 24, log: Callable[[str], None] = lambda _: None) -> torch.Tensor:
    """N x 2: each ratio of ``calibration_ratios(ratios)`` and the shift that gives it on
    ``batches`` (the closest found in at most ``steps`` runs a ratio; one that misses by
    more than MISSED is logged as a warning), and a row at the middle of two rows whose
    interpolation would miss it by more than MISSED. Each search proposes the shift that the
    logits of the nearest run predict (most searches end after one run), inside the
    tightest bracket the runs so far leave, and bisects where a proposal did not halve
    its miss. ``model`` is in eval mode; its own dial setting is untouched."""
    runs = Runs(model, batches)
    aims = calibration_ratios(runs.min_heads, runs.heads, ratios)
    rows = {aims[0]: end(runs, top=False), aims[-1]: end(runs, top=True)}
    for aim in aims[1:-1]:
        rows[aim] = inside(runs, aim, steps)
    # where the interpolation between two rows would miss their middle by more than
    # MISSED (modelled from the nearest run's logits, not run), a row there too (if the
    # split has a shift for it: a row that misses too would not help)
    pending = list(zip(aims, aims[1:]))
    while pending:
        low, high = pending.pop()
        middle, halfway = (low + high) / 2, (rows[low] + rows[high]) / 2
        if high - low <= 2 * MISSED or abs(runs.modelled(halfway, nearest(runs, halfway)) - middle) <= MISSED:
            continue
        shift = inside(runs, middle, steps)
        if abs(runs.ratio[shift] - middle) <= MISSED:
            rows[middle] = shift
            pending += [(low, middle), (middle, high)]
    return table(rows, runs.ratio, runs.count, log)


def table(rows: Dict[float, float], ratio: Dict[float, float], runs: int, log: Callable[[str], None]) -> torch.Tensor:
    """The N x 2 table of ``rows`` (aim -> shift), each row and the ratio its shift gave
    (``ratio``: shift -> ratio) logged, a row that misses its aim by more than MISSED as
    a warning, and the count of ``runs``."""
    for aim, shift in sorted(rows.items()):
        found = ratio[shift]
        log(f"head ratio {aim:.3f}: shift {shift:+.3f} gives {found:.4f}")
        if abs(found - aim) > MISSED:
            log(f"warning: head ratio {aim:.3f} not reached: the closest shift gives {found:.4f}, further than the "
                f"tolerance {MISSED} (too few examples or heads in the split for that ratio, or budgets that do "
                "not vary); the dial runs that shift for it")
    log(f"{runs} runs over the split")
    return torch.tensor(sorted(rows.items()))


def nearest(runs: Runs, shift: float) -> float:
    return min(runs.ratio, key=lambda s: abs(s - shift))


def inside(runs: Runs, aim: float, steps: int) -> float:
    """The shift whose ratio is closest to ``aim``: proposed from the logits of the run
    whose ratio is closest, or bisected where the last proposal did not halve the miss."""
    previous = None
    for _ in range(steps):
        closest = min(runs.ratio, key=lambda s: abs(runs.ratio[s] - aim), default=None)
        miss = None if closest is None else abs(runs.ratio[closest] - aim)
        if miss is not None and miss <= TOLERANCE:
            break
        low = max((s for s, r in runs.ratio.items() if r < aim), default=-SHIFT_BOUND)
        high = min((s for s, r in runs.ratio.items() if r > aim), default=SHIFT_BOUND)
        modelled = closest is not None and (previous is None or miss <= previous / 2)
        runs(runs.modelled_shift(aim, closest, low, high) if modelled else (low + high) / 2)
        previous = miss
    return min(runs.ratio, key=lambda s: abs(runs.ratio[s] - aim))


def end(runs: Runs, top: bool) -> float:
    """The first shift at which every layer runs every head (``top``), or the last at
    which every layer runs --min-heads, to SHIFT_RESOLUTION. One run at the bound finds
    it: there every layer runs those counts, so its logits are exactly those of every
    shift up to the point, and the point is where the one logit furthest from it (the
    smallest, or the largest) crosses: every layer before that one still runs the same
    counts there."""
    H, m = runs.heads, runs.min_heads
    bound = SHIFT_BOUND if top else -SHIFT_BOUND
    runs(bound)
    if H <= m:
        return bound
    logits = runs.logits[bound]
    # round(b) = H from b >= H - 1/2, and = m below m + 1/2: where sigmoid reaches these
    edge = (H - m - 0.5) / (H - m) if top else 0.5 / (H - m)
    point = math.log(edge / (1 - edge)) - float(logits.min() if top else logits.max())
    shift = point + SHIFT_RESOLUTION / 2 if top else point - SHIFT_RESOLUTION / 2
    if not -SHIFT_BOUND < shift < SHIFT_BOUND:  # past the bound: the bound itself
        return bound
    runs.copy(bound, shift)
    return shift


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
