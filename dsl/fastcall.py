"""The fast path of an entry point's calls: a call whose arguments have the structure, shapes
and dtypes (and static Python numbers) of an earlier call that was checked and lowered reuses
that lowering, its arrays passed through as they are, and a float that made an array of a
float tensor (a learning rate) made into that array again. Anything else (a new shape, a wrong
input, an argument that is not a NumPy array, a Python number or a container of them) takes
the full path, with its diagnostics.

A signature's check is compiled to Python, one straight line of tests a leaf, as the guards of
PyTorch's dynamo are: a training loop calls with one signature over and over, and the check of
the signature last met costs a names MLP step's 18 arrays 3 µs where walking them to build its
key and looking that up cost 12."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Hashable

import numpy as np

from dsl.values import Key, Record

MAX_SIGNATURES = 64         # per entry point: static numbers that change each call would grow it
# the containers a signature holds: sequences by their items, mappings (a record a call
# returned, passed back in, is one) by their keys and values
SEQUENCES, MAPPINGS = (tuple, list), (dict, Record)


def least_beyond(dtype: type) -> np.longdouble:
    """Float dtype's largest number and half a step more, which rounds to infinity (exact in an
    x86 long double; infinity for f64 where a long double is no wider than a double)."""
    f = np.finfo(dtype)
    with np.errstate(over="ignore"):
        return np.ldexp(np.longdouble(1), f.maxexp) - np.ldexp(np.longdouble(1), f.maxexp - f.nmant - 2)


# A float (Python's or NumPy's) passed for a float tensor, as a learning rate, makes the
# call's array of that dtype: a signature holds it by its type, so that a schedule keeps one
# signature. Each dtype's limit is the least magnitude beyond its range (from_python's error).
MADE = {np.dtype(t): least_beyond(t) for t in (np.float32, np.float64)}


def may_exceed(number_type: type, dtype: np.dtype) -> bool:
    """Whether a float of number_type can be beyond dtype's range: a Python float can for f32,
    a long double for both, an np.float32 never."""
    return np.finfo(np.float64 if number_type is float else number_type).max >= MADE[dtype]


Check = Callable[[tuple, dict], "list | None"]
# where a call's array comes from: leaf j of the signature, float number i made into an array
# of a dtype, or a constant (made from numbers the signature holds by value)
Source = int | tuple[int, np.dtype] | np.ndarray


@dataclass
class Known:
    """A signature met before: what remember() was given, where each of the call's arrays
    comes from, the float numbers it holds by value (the others each call makes arrays of),
    and once the signature is met again, its check (made then: a signature met once, as a
    static number that changes each call makes them, is not worth compiling)."""
    lowered: Any
    sources: list[Source]
    statics: tuple[tuple[int, str], ...]        # (number, its repr)
    check: Check | None = None

    def arrays(self, leaves: list[np.ndarray], numbers: list) -> list[np.ndarray] | None:
        """The call's arrays, from its leaves and numbers; None where a number is out of its
        array's range."""
        out = []
        for source in self.sources:
            if type(source) is tuple:
                i, dtype = source
                if may_exceed(type(numbers[i]), dtype) and MADE[dtype] <= abs(numbers[i]) < math.inf:
                    return None
                source = np.array(numbers[i], dtype)
            out.append(leaves[source] if type(source) is int else source)
        return out


class Signatures:
    """The lowerings of an entry point's earlier calls, by their arguments' signature."""

    def __init__(self):
        self._known: dict[Hashable, list[Known]] = {}
        self._last: Known | None = None      # the signature last met again, checked first

    def get(self, args: tuple, kwargs: dict) -> tuple[Any, list] | None:
        """(what remember() was given, the call's arrays) for a known signature, else None."""
        last = self._last
        if last is not None and (arrays := last.check(args, kwargs)) is not None:
            return last.lowered, arrays
        leaves: list[np.ndarray] = []
        numbers: list = []
        key = _signature((args, kwargs), leaves, {}, numbers)
        known = next((k for k in self._known.get(key, ()) if all(
            repr(numbers[i]) == r for i, r in k.statics)), None) if key is not None else None
        if known is None or (arrays := known.arrays(leaves, numbers)) is None:
            return None
        if known.check is None:
            known.check = compile_check((args, kwargs), known.sources, known.statics)
        self._last = known
        return known.lowered, arrays

    def remember(self, args: tuple, kwargs: dict, lowered: Any, arrays: list,
                 made: dict[int, Any]) -> None:
        """That a call of these arguments lowered to `lowered` and ran on `arrays`: each the
        very array it was given, or one made from its Python numbers (made[position], where
        one number made it)."""
        leaves: list[np.ndarray] = []
        numbers: list = []
        key = _signature((args, kwargs), leaves, {}, numbers)
        if key is None:
            return
        position = {id(a): j for j, a in enumerate(leaves)}
        number = {}                     # a float's position among numbers; -1 where it repeats
        for i, n in enumerate(numbers):
            number[id(n)] = -1 if id(n) in number else i
        sources: list[Source] = []
        for k, a in enumerate(arrays):
            i = number.get(id(made[k]), -1) if k in made else -1
            sources.append(position[id(a)] if id(a) in position else
                           (i, a.dtype) if i >= 0 and a.dtype in MADE and a.shape == () else a)
        if {s for s in sources if type(s) is int} != set(range(len(leaves))):
            return                      # an array was converted: its contents vary by call
        dynamic = {s[0] for s in sources if type(s) is tuple}
        statics = tuple((i, repr(n)) for i, n in enumerate(numbers) if i not in dynamic)
        known = [k for k in self._known.pop(key, []) if k.statics != statics]
        if sum(map(len, self._known.values())) + len(known) >= MAX_SIGNATURES:
            if known:
                del known[0]
            else:
                oldest = next(iter(self._known))
                del self._known[oldest][0]
                if not self._known[oldest]:
                    del self._known[oldest]
        self._known[key] = known + [Known(lowered, sources, statics)]


def _signature(value: Any, leaves: list, seen: dict[int, int], numbers: list) -> Hashable | None:
    """What the lowering of value depends on, but its float numbers' values; its arrays
    appended to leaves (an array passed twice appears once: the signature says where it
    repeats) and its floats to numbers; None where it has something the fast path does not
    know."""
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
        parts = [_signature(v, leaves, seen, numbers) for v in value]
        return None if None in parts else (t, tuple(parts))
    if t in MAPPINGS:
        parts = [_signature(v, leaves, seen, numbers) for v in value.values()]
        return None if None in parts else (t, tuple(value), tuple(parts))
    if t is Key:
        words = _signature(value.words, leaves, seen, numbers)
        return None if words is None else (t, words)
    if t is float or isinstance(value, np.floating):
        numbers.append(value)
        return t
    if isinstance(value, np.generic):
        return t, repr(value)
    if t is int or t is bool or t is str:
        return t, value
    return None


def compile_check(value: tuple, sources: list[Source], statics: tuple[tuple[int, str], ...]) -> Check:
    """The check of value's signature as a Python function of a call's (args, kwargs): a test
    for each container and leaf that the signature holds, then the call's arrays in the order
    of the lowering (from `sources`, statics' numbers tested by their repr)."""
    lines, names, leaves, numbers = [], {}, [], []
    by_value = dict(statics)

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
        elif t is float or isinstance(x, np.floating):
            if len(numbers) in by_value:
                lines.append(f"if repr({v}) != {constant(by_value[len(numbers)])}: return None")
            numbers.append((v, t))
        elif isinstance(x, np.generic):
            lines.append(f"if repr({v}) != {constant(repr(x))}: return None")
        else:                                           # int, bool, str
            lines.append(f"if {v} != {constant(x)}: return None")

    def array(source: Source) -> str:
        if type(source) is int:
            return leaves[source][0]
        if type(source) is not tuple:
            return constant(source)
        i, dtype = source
        v, number_type = numbers[i]
        if may_exceed(number_type, dtype):
            lines.append(f"if {constant(MADE[dtype])} <= abs({v}) < {constant(math.inf)}: return None")
        return f"{constant(np.array)}({v}, {constant(dtype)})"

    test("v", value)
    result = [array(source) for source in sources]
    source = "def check(args, kwargs):\n    v = (args, kwargs)\n" + "".join(
        f"    {line}\n" for line in lines) + f"    return [{', '.join(result)}]\n"
    names["__name__"] = __name__                       # whose code it is, in warnings and tracebacks
    exec(compile(source, "<dsl signature check>", "exec"), names)
    return names["check"]
