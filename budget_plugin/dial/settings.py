"""The dial's settings, from what a user writes to what a layer runs.

- :class:`HeadRatio`: a parsed ``--head-ratio`` (a mean head ratio, or counts per layer);
- :class:`Width`: a parsed ``--width`` (heads and FFN neurons per layer);
- :class:`Dial`: a setting as the model runs it (a budget-logit shift, or counts);
- :class:`LayerDial`: one layer's part of a :class:`Dial`.

A setting reaches the layers as an argument of each forward, never as module state, so
that concurrent calls can run at different settings."""

from typing import List, NamedTuple, Optional, Sequence, Tuple, Union


class LayerDial(NamedTuple):
    """The dial as one layer runs it. Its ``shift`` applies at evaluation only (training
    ignores it: the predictor is trained as it predicts); its fixed counts, ``heads`` and
    ``neurons``, apply in training too (the sandwich's widths)."""

    shift: float = 0.0  # added to the budget logit of every input
    heads: Optional[int] = None  # a fixed count for every input, no predictor
    neurons: Optional[int] = None  # the FFN runs its first this many neurons (None: all)


NO_DIAL = LayerDial()


class Dial(NamedTuple):
    """A setting as the model runs it: every budget logit shifted by ``shift``, or
    ``counts`` (one per layer) with no router; and each layer's FFN cut to its first
    ``neurons`` (one per layer; None: every neuron)."""

    shift: float = 0.0
    counts: Optional[Tuple[int, ...]] = None
    neurons: Optional[Tuple[int, ...]] = None

    @classmethod
    def heads_per_layer(cls, heads: Union[int, Sequence[int]], layers: int,
                        neurons: Optional[Sequence[int]] = None) -> "Dial":
        """``heads`` heads in each of ``layers`` layers (a sequence: one count per layer),
        and ``neurons`` as the constructor's."""
        counts = [heads] * layers if isinstance(heads, int) else list(heads)
        if len(counts) != layers:
            raise ValueError(f"a dial's heads: {len(counts)} counts for {layers} layers")
        return cls(counts=tuple(int(c) for c in counts), neurons=None if neurons is None else tuple(neurons))

    def layer(self, index: int) -> LayerDial:
        """Layer ``index``'s part (its argument)."""
        neurons = None if self.neurons is None else self.neurons[index]
        if self.counts is not None:
            return LayerDial(heads=self.counts[index], neurons=neurons)
        return LayerDial(shift=self.shift, neurons=neurons) if self.shift or neurons is not None else NO_DIAL


class HeadRatio(NamedTuple):
    """A ``--head-ratio``: a mean head ratio for the per-input budgets (``ratio``, with
    ``counts`` None), or a fixed count per layer (``counts``)."""

    ratio: Optional[float]
    counts: Optional[List[int]]

    def option(self) -> str:
        """As ``--head-ratio`` writes it."""
        return f"{self.ratio:g}" if self.counts is None else ",".join(map(str, self.counts))


class Width(NamedTuple):
    """A ``--width``: heads and FFN neurons per layer, the same for every input."""

    heads: Tuple[int, ...]
    neurons: Tuple[int, ...]

    def dial(self) -> Dial:
        return Dial(counts=self.heads, neurons=self.neurons)

    def option(self) -> str:
        """As ``--width`` writes it, one pair per layer."""
        return ",".join(f"{h}:{f}" for h, f in zip(self.heads, self.neurons))
