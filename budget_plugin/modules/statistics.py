"""A layer's statistics, returned with its output: a mapping whose derived entries
(the selection mask of a prefix, its relevance, the FLOP counts) are computed when
first read. The criterion reads them all; a model serving predictions reads none, and
at batch 1 on CPU the small ops they take cost about as much as a head."""

from collections.abc import MutableMapping
from typing import Callable, Dict, Iterator, Tuple

from torch import Tensor

Derived = Dict[Tuple[str, ...], Callable[[], Tuple[Tensor, ...]]]  # names -> the function computing them together


class LayerStatistics(MutableMapping):
    def __init__(self, values: Dict[str, Tensor], derived: Derived):
        self._values = values
        self._derived = derived
        self._pending = {name: names for names in derived for name in names}

    def __getitem__(self, key: str):
        names = self._pending.get(key)
        if names is not None:
            for name, value in zip(names, self._derived.pop(names)()):
                if self._pending.get(name) is names:  # not overwritten meanwhile
                    del self._pending[name]
                    self._values[name] = value
        return self._values[key]

    def __setitem__(self, key: str, value):
        self._pending.pop(key, None)
        self._values[key] = value

    def __delitem__(self, key: str):
        if self._pending.pop(key, None) is None:
            del self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter([*self._values, *self._pending])

    def __len__(self) -> int:
        return len(self._values) + len(self._pending)

    def __repr__(self) -> str:
        return f"LayerStatistics({dict(self)!r})"
