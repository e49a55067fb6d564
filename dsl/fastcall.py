"""The fast path of an entry point's calls: a call whose arguments have the structure, shapes
and dtypes (and Python numbers) of an earlier call that was checked and lowered reuses that
lowering, its arrays passed through as they are. Anything else (a new shape, a wrong input, an
argument that is not a NumPy array, a Python number or a container of them) takes the full
path, with its diagnostics.

A signature's check is compiled to Python, one straight line of tests a leaf, as the guards of
PyTorch's dynamo are: a training loop calls with one signature over and over, and the check of
the signature last met costs a names MLP step's 18 arrays 3 µs where walking them to build its
key and looking that up cost 12."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable

import numpy as np

from dsl.values import Key, Record

MAX_SIGNATURES = 64         # per entry point: Python numbers that change each call would grow it
# the containers a signature holds: sequences by their items, mappings (a record a call
# returned, passed back in, is one) by their keys and values
SEQUENCES, MAPPINGS = (tuple, list), (dict, Record)

Check = Callable[[tuple, dict], "list | None"]


@dataclass
class Known:
    """A signature met before: what remember() was given, where the call's arrays come from
    (leaf slots[i] of the signature, or constants[i] where that is None), and once the
    signature is met again, its check (made then: a signature met once, as a number that
    changes each call makes them, is not worth compiling)."""
    lowered: Any
    slots: list[int | None]
    constants: list
    check: Check | None = None


class Signatures:
    """The lowerings of an entry point's earlier calls, by their arguments' signature."""

    def __init__(self):
        self._known: dict[Hashable, Known] = {}
        self._last: Known | None = None      # the signature last met again, checked first

    def get(self, args: tuple, kwargs: dict) -> tuple[Any, list] | None:
        """(what remember() was given, the call's arrays) for a known signature, else None."""
        last = self._last
        if last is not None and (arrays := last.check(args, kwargs)) is not None:
            return last.lowered, arrays
        leaves: list[np.ndarray] = []
        key = _signature((args, kwargs), leaves, {})
        known = self._known.get(key) if key is not None else None
        if known is None:
            return None
        if known.check is None:
            known.check = compile_check((args, kwargs), known.constants, known.slots)
        self._last = known
        return known.lowered, [leaves[j] if j is not None else c
                               for j, c in zip(known.slots, known.constants)]

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
        self._known[key] = Known(lowered, slots, [None if j is not None else a for j, a in zip(slots, arrays)])


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
    if t in SEQUENCES:
        parts = [_signature(v, leaves, seen) for v in value]
        return None if None in parts else (t, tuple(parts))
    if t in MAPPINGS:
        parts = [_signature(v, leaves, seen) for v in value.values()]
        return None if None in parts else (t, tuple(value), tuple(parts))
    if t is Key:
        words = _signature(value.words, leaves, seen)
        return None if words is None else (t, words)
    if t is float or isinstance(value, np.generic):
        return t, repr(value)              # (-0.0 is not 0.0, nor nan a miss each time)
    if t is int or t is bool or t is str:
        return t, value
    return None


def compile_check(value: tuple, constants: list, slots: list[int | None]) -> Check:
    """The check of value's signature as a Python function of a call's (args, kwargs): a test
    for each container and leaf that the signature holds, then the call's arrays in the order
    of the lowering (leaf slots[i], or constants[i] where slots[i] is None)."""
    lines, names, leaves = [], {}, []

    def constant(x: Any) -> str:
        names[f"K{len(names)}"] = x
        return f"K{len(names) - 1}"

    def test(v: str, x: Any) -> None:
        t = type(x)
        lines.append(f"if type({v}) is not {constant(t)}: return None")
        if t is np.ndarray:
            first = next((name for name, a in leaves if a is x), None)
            if first is not None:                       # the same array again
                lines.append(f"if {v} is not {first}: return None")
                return
            leaves.append((v, x))
            lines.append(f"if {v}.shape != {x.shape!r} or {v}.dtype != {constant(x.dtype)} or "
                         f"{v}.flags.c_contiguous is not {x.flags.c_contiguous}: return None")
        elif t in SEQUENCES or t in MAPPINGS:
            mapping = t in MAPPINGS
            items = list(x.values()) if mapping else list(x)
            parts = [f"{v}_{i}" for i in range(len(items))]
            lines.append(f"if len({v}) != {len(items)}: return None")
            if mapping:
                lines.append(f"if tuple({v}) != {constant(tuple(x))}: return None")
            if parts:
                lines.append(f"{', '.join(parts)}, = {v}{'.values()' if mapping else ''}")
            for part, item in zip(parts, items):
                test(part, item)
        elif t is Key:
            lines.append(f"{v}_words = {v}.words")
            test(f"{v}_words", x.words)
        elif t is float or isinstance(x, np.generic):
            lines.append(f"if repr({v}) != {constant(repr(x))}: return None")
        else:                                           # int, bool, str
            lines.append(f"if {v} != {constant(x)}: return None")

    test("v", value)
    result = [leaves[j][0] if j is not None else constant(c) for j, c in zip(slots, constants)]
    source = "def check(args, kwargs):\n    v = (args, kwargs)\n" + "".join(
        f"    {line}\n" for line in lines) + f"    return [{', '.join(result)}]\n"
    exec(compile(source, "<dsl signature check>", "exec"), names)
    return names["check"]
