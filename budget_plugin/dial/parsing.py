"""The one reader of the per-layer options: ``--head-ratio``, ``--width``,
``--ffn-neurons`` and the baselines' ``--fixed-heads``, ``--kept-heads`` and
``--relevance-prior``. Each is a list with one item per layer (separated by commas, or
by ';' where an item is itself a list), and a bad one is refused in one line naming the
option and what it accepts."""

import math
from typing import Callable, List, Optional, Sequence, Tuple, TypeVar

import torch

from ..option_error import require
from .settings import HeadRatio, Width
from .width import allocated_width, uniform_width

T = TypeVar("T")


def whole(text: str) -> int:
    """A whole number, written ``3`` or ``3.0``."""
    number = float(text)
    if not math.isfinite(number) or number != int(number):
        raise ValueError(text)
    return int(number)


def numbers(text: str, item: Callable[[str], T] = float, separator: str = ",") -> List[T]:
    """The items of a ``separator``-separated list, each read by ``item``."""
    return [item(part) for part in str(text).split(separator)]


def per_layer(value, option: str, allowed: str, num_layers: int, item: Callable[[str], T] = float,
              accepted: Callable[[T], bool] = lambda _: True, separator: str = ",",
              one_for_all: bool = False) -> List[T]:
    """One item per layer (``one_for_all``: or one for every layer), each read by
    ``item`` and ``accepted``; anything else refused as ``--option must be allowed``."""
    try:
        items = numbers(value, item, separator)
    except (ValueError, OverflowError):
        items = []
    if one_for_all and len(items) == 1:
        items *= num_layers
    require(len(items) == num_layers and all(accepted(i) for i in items), option, allowed, value)
    return items


def one_number(text: str) -> Optional[float]:
    """A single number (no separator), else None."""
    if "," in text or ":" in text or ";" in text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_head_ratio(value, num_layers: int, num_heads: int, min_heads: int = 1) -> Optional[HeadRatio]:
    """--head-ratio: None; one number R in [--min-heads / H, 1] (the per-input budgets
    dialled to a mean head ratio R; the ends run every layer at --min-heads, or every
    head, with no router); or one whole head count per layer (no router)."""
    if value is None or value == "":
        return None
    low = min_heads / num_heads
    ratio = one_number(str(value))
    if ratio is not None:
        require(low <= ratio <= 1, "head_ratio", f"a ratio in [--min-heads / H, 1] = [{low:.3f}, 1], or "
                f"{num_layers} comma-separated head counts", value)
        for end in (min_heads, num_heads):  # the ends are exact without a calibration
            if ratio == end / num_heads:
                return HeadRatio(None, [end] * num_layers)
        return HeadRatio(ratio, None)
    counts = per_layer(value, "head_ratio", f"one ratio in (0, 1], or {num_layers} comma-separated whole head "
                       f"counts (one per layer) in [--min-heads, {num_heads}]", num_layers, whole,
                       lambda n: min_heads <= n <= num_heads)
    return HeadRatio(None, counts)


def parse_width(value, num_layers: int, num_heads: int, num_neurons: int, min_heads: int = 1,
                priorities: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> Optional[Width]:
    """--width: None; a ratio R in (0, 1] (allocated by ``priorities``, heads' and
    neurons', if given, else the same in every layer); or one ``heads:neurons`` pair per
    layer."""
    if value is None or value == "":
        return None
    ratio = one_number(str(value))
    allowed = f"a ratio in (0, 1], or {num_layers} comma-separated heads:neurons pairs"
    if ratio is not None or ":" not in str(value):
        require(ratio is not None and 0 < ratio <= 1, "width", allowed, value)
        if priorities is not None:
            return allocated_width(ratio, *priorities)
        return uniform_width(ratio, num_layers, num_heads, num_neurons, min_heads)
    pairs = per_layer(value, "width", f"{allowed} (heads in [--min-heads, {num_heads}], neurons in [1, "
                      f"{num_neurons}])", num_layers, lambda pair: tuple(numbers(pair, int, ":")),
                      lambda c: len(c) == 2 and min_heads <= c[0] <= num_heads and 1 <= c[1] <= num_neurons)
    return Width(tuple(h for h, _ in pairs), tuple(f for _, f in pairs))


def parse_ffn_neurons(value, num_layers: int, num_neurons: int) -> List[Optional[int]]:
    """--ffn-neurons: each layer's FFN neurons (an export's), or None per layer (all)."""
    if value is None:
        return [None] * num_layers
    return per_layer(value, "ffn_neurons", f"{num_layers} comma-separated whole numbers in [1, "
                     f"--encoder-ffn-embed-dim = {num_neurons}]", num_layers, int, lambda n: 1 <= n <= num_neurons)


def parse_fixed_heads(value, num_layers: int, num_heads: int, min_heads: int, whole_only: bool) -> List[float]:
    """--fixed-heads: one number for every layer, or one per layer, in [--min-heads, H]
    (``whole_only``: whole numbers)."""
    return per_layer(value, "fixed_heads", f"one number or {num_layers} comma-separated numbers (one per layer), "
                     f"each in [--min-heads, {num_heads}]" + (" and whole" if whole_only else ""), num_layers,
                     float, lambda v: min_heads <= v <= num_heads and (not whole_only or v == int(v)),
                     one_for_all=True)


def parse_kept_heads(value, num_layers: int, num_heads: int, min_heads: int) -> List[List[int]]:
    """--kept-heads '0,3,5;1,2;...': each layer's heads (ascending, distinct)."""
    return per_layer(value, "kept_heads", f"{num_layers} ';'-separated lists (one per layer) of comma-separated "
                     f"head indices in [0, {num_heads}), at least --min-heads each", num_layers,
                     lambda layer: sorted(set(numbers(layer, int))),
                     lambda heads: min_heads <= len(heads) and all(0 <= h < num_heads for h in heads), ";")


def parse_relevance_prior(value, num_layers: int, num_heads: int) -> List[List[float]]:
    """--relevance-prior '0.1,0.5,...;...': each layer's H head scores."""
    return per_layer(value, "relevance_prior", f"{num_layers} ';'-separated lists (one per layer) of {num_heads} "
                     "comma-separated finite numbers", num_layers, numbers,
                     lambda scores: len(scores) == num_heads and all(math.isfinite(v) for v in scores), ";")


def parse_counts(value: Sequence, option: str, num_layers: int, low: int, high: int) -> List[int]:
    """A whole number for every layer, or one per layer, in [low, high]."""
    return per_layer(value, option, f"one whole number or {num_layers} comma-separated ones in [{low}, {high}]",
                     num_layers, whole, lambda n: low <= n <= high, one_for_all=True)
