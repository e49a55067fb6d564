"""The fast path of an entry point's calls: a call whose arguments have the structure, shapes
and dtypes (and Python numbers) of an earlier call that was checked and lowered reuses that
lowering, its arrays passed through as they are, in one dict lookup. Anything else (a new
shape, a wrong input, an argument that is not a NumPy array, a Python number or a container
of them) takes the full path, with its diagnostics."""
from __future__ import annotations

from typing import Any, Hashable

import numpy as np

MAX_SIGNATURES = 64         # per entry point: Python numbers that change each call would grow it


class Signatures:
    """The lowerings of an entry point's earlier calls, by their arguments' signature."""

    def __init__(self):
        self._known: dict[Hashable, tuple[Any, list[int | None], list]] = {}

    def get(self, args: tuple, kwargs: dict) -> tuple[Any, list] | None:
        """(what remember() was given, the call's arrays) for a known signature, else None."""
        leaves: list[np.ndarray] = []
        key = _signature((args, kwargs), leaves, {})
        known = self._known.get(key) if key is not None else None
        if known is None:
            return None
        lowered, slots, constants = known
        return lowered, [leaves[j] if j is not None else c for j, c in zip(slots, constants)]

    def remember(self, args: tuple, kwargs: dict, lowered: Any, arrays: list) -> None:
        """That a call of these arguments lowered to `lowered` and ran on `arrays`: each the
        very array it was given, or one made from its Python numbers (the same each time)."""
        leaves: list[np.ndarray] = []
        key = _signature((args, kwargs), leaves, {})
        if key is None:
            return
        position = {id(a): j for j, a in enumerate(leaves)}
        slots = [position.get(id(a)) for a in arrays]
        if {j for j in slots if j is not None} != set(range(len(leaves))):
            return                      # an array was converted: its contents vary by call
        if len(self._known) >= MAX_SIGNATURES:
            del self._known[next(iter(self._known))]
        self._known[key] = (lowered, slots, [None if j is not None else a for j, a in zip(slots, arrays)])


def _signature(value: Any, leaves: list, seen: dict[int, int]) -> Hashable | None:
    """What the lowering of value depends on; its arrays appended to leaves (an array passed
    twice appears once: the signature says where it repeats); None where it has something
    the fast path does not know."""
    t = type(value)
    if t is np.ndarray:
        at = seen.get(id(value))
        if at is not None:
            return at
        seen[id(value)] = len(leaves)
        leaves.append(value)
        return value.shape, value.dtype, value.flags.c_contiguous
    # (lists, not generators: a names MLP step's arguments, 18 arrays in a record and a tuple
    # of records, took 13.8 µs to sign with generators, 9 with lists)
    if t is tuple or t is list:
        parts = [_signature(v, leaves, seen) for v in value]
        return None if None in parts else (t, tuple(parts))
    if t is dict:
        parts = [_signature(v, leaves, seen) for v in value.values()]
        return None if None in parts else (t, tuple(value), tuple(parts))
    if t is float or isinstance(value, np.generic):
        return t, repr(value)              # (-0.0 is not 0.0, nor nan a miss each time)
    if t is int or t is bool or t is str:
        return t, value
    return None
