"""The Python values dslc's API exchanges besides arrays: records, keys, a result's arrays by
name (as `dslc run` and checkpoints write them), and numbers as dslc prints them."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
from numpy.typing import DTypeLike

from frontend.diagnostics import DslError
from frontend.lower import Layout


class Record(dict):
    """A record value: a dict of its fields, also readable as attributes (p.W1)."""

    def __init__(self, type_name: str, fields: dict[str, Any]):
        super().__init__(fields)
        self.type_name = type_name

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __repr__(self) -> str:
        return f"{self.type_name}{dict.__repr__(self)}"


@dataclass(frozen=True)
class Key:
    """A random key: two 32-bit words (docs/random.md)."""
    words: np.ndarray

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and np.array_equal(self.words, other.words)

    def __hash__(self) -> int:
        return hash(self.words.tobytes())


def key(seed: int) -> Key:
    """dsl.key(seed): the key a program's key(seed) makes."""
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, (bool, np.bool_)) or \
            not 0 <= seed < 2 ** 64:
        raise DslError(None, f"a seed is an integer in [0, 2**64), got {seed!r}")
    seed = int(seed)
    return Key(np.array([seed & 0xFFFFFFFF, seed >> 32], dtype=np.uint32))


def flatten_python(value: Any, path: str, array: Callable[[Any], Any] = np.asarray) -> dict[str, Any]:
    """A result as named arrays (`out`, `out[0]`, `out.W1`), as `dslc run` writes them; each
    leaf made an array by `array` (a copy to the host, by default)."""
    if isinstance(value, dict):
        return {k: a for f, v in value.items() for k, a in flatten_python(v, f"{path}.{f}", array).items()}
    if isinstance(value, (list, tuple)):
        return {k: a for i, v in enumerate(value) for k, a in flatten_python(v, f"{path}[{i}]", array).items()}
    if isinstance(value, Key):
        return {path: value.words}
    return {path: array(value)}


def builder(layout: Layout) -> Callable[[Sequence[Any]], Any]:
    """The function from a value's leaves (a function's result arrays) to the Python value
    `layout` describes (Records, Keys, tuples), compiled to Python, a statement a record, tuple
    or list: a names MLP step's results built in 2 µs, where walking the layout took 7."""
    lines: list[str] = []
    names: dict[str, Any] = {"Record": Record, "Key": Key}
    leaf = itertools.count()

    def node(x: Layout) -> str:
        match x.kind:
            case "tensor":
                return f"leaves[{next(leaf)}]"
            case "static":
                names[f"K{len(names)}"] = x.value
                return f"K{len(names) - 1}"
            case "key":
                made = f"Key(leaves[{next(leaf)}])"
            case "tuple":
                made = "(" + "".join(f"{node(i)}, " for i in x.items) + ")"
            case "list":
                made = "[" + ", ".join(node(i) for i in x.items) + "]"
            case _:
                made = f"Record({x.name!r}, {{" + ", ".join(
                    f"{f!r}: {node(i)}" for f, i in zip(x.fields, x.items)) + "})"
        lines.append(f"    n{len(lines)} = {made}\n")
        return f"n{len(lines) - 1}"

    value = node(layout)
    exec(compile(f"def build(leaves):\n{''.join(lines)}    return {value}\n",
                 "<dsl result layout>", "exec"), names)
    return names["build"]


def shortest(value: Any, dtype: DTypeLike = None) -> str:
    """A number or an array as text, each float the shortest that reads back as the same value
    of its dtype (or of `dtype`): an f32 loss prints 0.6931472, not 0.6931471824645996."""
    a = np.asarray(value, dtype)
    return str(a[()]) if a.ndim == 0 else np.array2string(a, floatmode="unique")
