"""Plain data for the compile cache: the syntax trees, lowered IR and kernel plans it stores,
as JSON and a section of raw bytes (arrays). Decoding constructs nothing but containers,
numbers, NumPy arrays and the dataclasses and enums of dslc's own packages, named in the
entry and looked up among the modules already imported, and primitives, by their name in the
registry, so that reading an entry can never run code. Objects reached more than once are
written once and referred to after, so the decoded graph shares what the encoded one shared (an
IR value used by several ops); so are frozen values equal in every attribute (the loads of many
kernels), which the decoded graph then shares too."""
from __future__ import annotations

import dataclasses
import enum
import json
import math
import struct
import sys
from typing import Any, Callable

import numpy as np

from ir.ops.base import REGISTRY, Primitive

PACKAGES = ("frontend", "ir", "backend", "runtime", "dsl")
DTYPE_KINDS = "biufc"           # bool, ints, floats, complex: arrays of plain bytes
PLAIN = frozenset({type(None), bool, int, str})    # values that are their own JSON
CONTAINERS = frozenset({tuple, list})
_SIZES = struct.Struct("<QQ")   # the lengths of the class table and of the document


# a value type whose first UNMATCHED objects are all unequal is not looked up further
UNMATCHED = 64


class EncodeError(ValueError):
    """A value the codec does not write (a type outside its list): it is not cached."""


class DecodeError(ValueError):
    """An entry that is not something encode wrote: treated as absent."""


# ---------------------------------------------------------------------------------------------
# Encoding
#
# The document is JSON whose scalars are themselves; anything else is an object of one key, its
# tag: {"l": [...]} a list, {"d": [k, v, ...]} a dict, {"t": [...]} a tuple, {"3": [field
# values...]} an object of the class in row 3 of the class table (or {"3": "NAME"}, an enum
# member), {"p": "NAME"} the primitive of that name. A tuple holding no tuple or list is a bare JSON array: tuples are the commonest
# container, and json.loads calls the decoder's hook on objects only. A tag ending in "!"
# marks a value referred to again later, as {"r": n}, n counting such values in the order their
# JSON ends (the order in which the decoder completes them).


def encode(value: Any) -> bytes:
    """value as the bytes decode reads back; EncodeError when it holds a type outside the list."""
    try:
        return _Encoder(value).finish()
    except RecursionError:              # a cycle through tuples, or a value nested too deeply
        raise EncodeError("a value nested too deeply (or a cycle through a tuple)") from None


class _Encoder:
    """One pass over the value; an object met again is written as a reference, and once the
    pass is over, the objects referred to are marked where they were written and numbered in
    the order their JSON ends (a pass beforehand to find them took a third of the time). An
    object of a frozen dataclass compared by value (a type, a size, a load, a source site) is
    a value: one equal to an earlier one in every attribute is written as a reference to it
    (the GPT step's entry: 440 KB instead of 615, decoded in 24 ms instead of 38). How a type
    is written is decided at its first object (the checks in order for each object were half
    the encoding)."""

    def __init__(self, value: Any):
        self.classes: dict[tuple[type, tuple[str, ...] | None], str] = {}
        self.table: list[list] = []
        self.binary = bytearray()
        self.written: dict[int, dict] = {}  # id of an object written -> its node, in the order
        self.shared: set[int] = set()       # their JSON ends; the ids of those met again,
        self.refs: list[dict] = []          # and the references to them (each {"r": id} yet)
        self.open: set[int] = set()         # objects being encoded: met again, they are a cycle
        self.nodes: dict[type, Callable[[Any], dict]] = {}   # how each type's objects are written
        self.values: dict[type, bool] = {}  # whether a type's objects are values (see above)
        self.first: dict[tuple, int] = {}   # a value's type and attributes -> the id of the first
        self.same: dict[int, int] = {}      # the id of a value equal to an earlier one -> that one's
        self.matched: set[type] = set()     # the value types with an object equal to an earlier one
        self.unmatched: dict[type, int] = {}    # and how many of each were not
        self.doc = self.value(value)
        self.number_the_shared()

    def number_the_shared(self) -> None:
        numbers: dict[int, int] = {}
        for key, node in self.written.items():
            if key in self.shared:
                numbers[key] = len(numbers)
                (tag, body), = node.items()
                del node[tag]
                node[tag + "!"] = body
        for ref in self.refs:
            ref["r"] = numbers[ref["r"]]

    def finish(self) -> bytes:
        table = json.dumps(self.table, separators=(",", ":")).encode()
        doc = json.dumps(self.doc, separators=(",", ":"), allow_nan=False).encode()
        return _SIZES.pack(len(table), len(doc)) + table + doc + bytes(self.binary)

    def value(self, x: Any) -> Any:
        t = type(x)
        if t in PLAIN:
            return x
        if t is tuple:
            if PLAIN.issuperset(map(type, x)):          # (most: shapes, strides, in C)
                return list(x)
            # (the plain items inline: most are, and a call each was a third of the encoding)
            items = [v if type(v) in PLAIN else self.value(v) for v in x]
            return items if CONTAINERS.isdisjoint(map(type, x)) else {"t": items}
        node = self.nodes.get(t) or self.node_of(t)
        if node is _primitive_node or node is _float_node:      # values, never referred to
            return node(x)
        key = self.same.get(id(x), id(x))
        if key in self.written:
            return self.ref(key)
        if key in self.open:
            raise EncodeError(f"a cycle through a {t.__name__}")
        self.open.add(key)
        written = node(x)
        self.open.discard(key)
        if self.values[t]:
            first = self.first.setdefault((t, *map(self.identity, vars(x).values())), key)
            if first != key:
                self.same[key] = first
                self.matched.add(t)
                return self.ref(first)
            self.unmatched[t] = n = self.unmatched.get(t, 0) + 1
            if n == UNMATCHED and t not in self.matched:   # (kernels, steps: each its own)
                self.values[t] = False
        self.written[key] = written
        return written

    def ref(self, key: int) -> dict:
        self.shared.add(key)
        ref = {"r": key}
        self.refs.append(ref)
        return ref

    def identity(self, v: Any) -> Any:
        """What tells an attribute's value from another's: a plain value with its type (True
        is not 1), a float by its bits (-0.0 is not 0.0, nor one NaN another), an object
        already written by the id it was written under."""
        t = type(v)
        if t in PLAIN:
            return t, v
        if t is float:
            return struct.pack("<d", v)
        if t is tuple:
            return tuple(map(self.identity, v))
        return self.same.get(id(v), id(v))

    def node_of(self, t: type) -> Callable[[Any], dict]:
        """How objects of type t are written (an EncodeError for a type outside the list)."""
        if t is float:
            node = _float_node
        elif issubclass(t, Primitive):
            node = _primitive_node
        elif t is list:
            node = self.list_node
        elif t is dict:
            node = self.dict_node
        elif t in (frozenset, set):
            tag = "s" if t is frozenset else "z"
            node = lambda x: {tag: [self.value(v) for v in x]}         # noqa: E731
        elif t is bytes:
            node = lambda x: {"b": self.bytes(x)}                       # noqa: E731
        elif t is type(Ellipsis):                                       # an index's `...`
            node = lambda x: {"x": 0}                                   # noqa: E731
        elif t is slice:
            node = lambda x: {"c": [self.value(x.start), self.value(x.stop), self.value(x.step)]}  # noqa: E731
        elif t is np.ndarray:
            node = self.array_node
        elif issubclass(t, np.generic):
            node = lambda x: {"n": [_dtype_name(x.dtype), self.bytes(x.tobytes())[0]]}  # noqa: E731
        elif issubclass(t, np.dtype):
            node = lambda x: {"y": _dtype_name(x)}                     # noqa: E731
        elif issubclass(t, enum.Enum) and _ours(t):
            tag = self.cls(t, None)
            node = lambda x: {tag: x.name}                              # noqa: E731
        elif dataclasses.is_dataclass(t) and _ours(t) and "__dict__" in dir(t):
            node = self.dataclass_node(t)
        else:
            raise EncodeError(f"no encoding for a {t.__module__}.{t.__qualname__}")
        params = getattr(t, "__dataclass_params__", None)
        self.values[t] = params is not None and params.frozen and params.eq
        self.nodes[t] = node
        return node

    def list_node(self, x: list) -> dict:
        return {"l": [v if type(v) in PLAIN else self.value(v) for v in x]}

    def dict_node(self, x: dict) -> dict:
        return {"d": [self.value(v) for kv in x.items() for v in kv]}

    def array_node(self, x: np.ndarray) -> dict:
        return {"a": [_dtype_name(x.dtype), list(x.shape), *self.bytes(np.ascontiguousarray(x).tobytes())]}

    def dataclass_node(self, t: type) -> Callable[[Any], dict]:
        tags: dict[tuple[str, ...], str] = {}       # by the attributes an object has (a cached
        value = self.value                          # property adds one)

        def node(x: Any) -> dict:
            fields = vars(x)
            names = tuple(fields)
            tag = tags.get(names) or tags.setdefault(names, self.cls(t, names))
            return {tag: [v if type(v) in PLAIN else value(v) for v in fields.values()]}
        return node

    def cls(self, t: type, names: tuple[str, ...] | None) -> str:
        """The tag of t's objects with these attributes (None: an enum)."""
        if (t, names) not in self.classes:
            self.classes[t, names] = str(len(self.table))
            self.table.append([f"{t.__module__}:{t.__qualname__}", None if names is None else list(names)])
        return self.classes[t, names]

    def bytes(self, data: bytes) -> list[int]:
        offset = len(self.binary)
        self.binary += data
        return [offset, len(data)]


def _float_node(x: float) -> Any:
    return x if math.isfinite(x) else {"f": struct.pack(">d", x).hex()}     # nan, ±inf, bit for bit


def _primitive_node(x: Primitive) -> dict:
    return {"p": x.name}


def _ours(t: type) -> bool:
    """Whether t is a class of dslc that decode can find again by its name."""
    return t.__module__.split(".")[0] in PACKAGES and "<locals>" not in t.__qualname__


def _dtype_name(dtype: np.dtype) -> str:
    if dtype.kind not in DTYPE_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise EncodeError(f"no encoding for dtype {dtype}")
    return dtype.str


# ---------------------------------------------------------------------------------------------
# Decoding


def decode(data: bytes) -> Any:
    """The value encode wrote into data; DecodeError for anything else, however it differs."""
    try:
        return _decode(memoryview(data))
    except DecodeError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError,
            OverflowError, struct.error) as e:
        raise DecodeError(f"not an entry: {type(e).__name__}: {e}") from None


def _decode(data: memoryview) -> Any:
    n_table, n_doc = _SIZES.unpack_from(data)
    start = _SIZES.size
    if start + n_table + n_doc > len(data):
        raise DecodeError("shorter than its header says")
    table = json.loads(bytes(data[start:start + n_table]))
    doc = bytes(data[start + n_table:start + n_table + n_doc])
    decoder = _Decoder([_resolve(*row) for row in table], data[start + n_table + n_doc:])
    return _items([json.loads(doc, object_pairs_hook=decoder.hook, parse_constant=_no_constant)])[0]


class _Decoder:
    """The hook of json.loads: called on each tagged object once its contents are decoded."""

    def __init__(self, classes: list[tuple[type, tuple[str, ...] | None]], binary: memoryview):
        self.binary = binary
        self.refs: list[Any] = []
        tags: dict[str, Callable[[Any], Any]] = {
            "t": _tuple, "l": _list, "d": _dict, "s": _frozenset, "z": _set, "f": _float,
            "b": self.bytes, "a": self.array, "n": self.scalar, "y": _dtype,
            "x": lambda _: ..., "c": _slice, "p": _primitive}
        tags.update((str(i), _maker(*row)) for i, row in enumerate(classes))
        tags.update([(tag + "!", self.remembered(make)) for tag, make in tags.items()])
        tags["r"] = self.ref

        def hook(pairs: list[tuple[str, Any]]) -> Any:      # a closure: called for every object
            (tag, body), = pairs
            return tags[tag](body)
        self.hook = hook

    def remembered(self, make: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def make_and_remember(body: Any) -> Any:
            value = make(body)
            self.refs.append(value)
            return value
        return make_and_remember

    def ref(self, n: int) -> Any:
        if type(n) is not int or not 0 <= n < len(self.refs):
            raise DecodeError(f"a reference to {n!r}, not to a value before it")
        return self.refs[n]

    def bytes(self, body: list) -> bytes:
        return bytes(self.span(*body))

    def array(self, body: list) -> np.ndarray:
        dtype, shape, offset, size = body
        return np.frombuffer(self.span(offset, size), _dtype(dtype)).reshape(shape).copy()

    def scalar(self, body: list) -> np.generic:
        dtype = _dtype(body[0])
        return np.frombuffer(self.span(body[1], dtype.itemsize), dtype)[0]

    def span(self, offset: int, size: int) -> memoryview:
        if not (0 <= offset and 0 <= size and offset + size <= len(self.binary)):
            raise DecodeError("bytes outside the entry")
        return self.binary[offset:offset + size]


def _resolve(name: str, names: list[str] | None) -> tuple[type, tuple[str, ...] | None]:
    """The class an entry names, if it is a dataclass or enum of dslc in a module already
    imported (an entry never makes Python import anything); names None for an enum."""
    module, _, qualname = name.partition(":")
    if module.split(".")[0] not in PACKAGES or module not in sys.modules:
        raise DecodeError(f"{name} is not a class of dslc")
    cls: Any = sys.modules[module]
    for part in qualname.split("."):
        cls = getattr(cls, part, None) if part.isidentifier() and not part.startswith("__") else None
    if not isinstance(cls, type) or cls.__module__ != module or cls.__qualname__ != qualname:
        raise DecodeError(f"{name} is not a class of dslc")
    if issubclass(cls, enum.Enum) and names is None:
        return cls, None
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else None
    if fields is None or type(names) is not list or not all(
            type(n) is str and n.isidentifier() and not n.startswith("__") for n in names) \
            or not fields <= set(names):
        raise DecodeError(f"{name} with fields {names} is not a dataclass of dslc")
    return cls, tuple(names)


def _maker(cls: type, names: tuple[str, ...] | None) -> Callable[[Any], Any]:
    """What makes an object of cls from its encoding: an enum member from its name, a dataclass
    instance from its attributes' values, as unpickling would (without calling __init__, and
    through __setstate__ where the class has one: ir.core.Value takes a fresh id)."""
    if names is None:
        return lambda name: cls[name]
    new, count = object.__new__, len(names)
    setstate = getattr(cls, "__setstate__", None)

    def make(values: list) -> Any:
        if type(values) is not list or len(values) != count:
            raise DecodeError(f"{cls.__qualname__} with other fields than its class")
        values = [tuple(v) if type(v) is list else v.items if type(v) is _List else v
                  for v in values]                          # _items, inlined: the hottest call
        x = new(cls)
        if setstate is None:
            x.__dict__.update(zip(names, values))
        else:
            setstate(x, dict(zip(names, values)))
        return x
    return make


class _List:
    """A decoded list, until its container is made: a list there is a JSON array, a tuple."""
    __slots__ = ("items",)

    def __init__(self, items: list):
        self.items = items


def _items(body: list) -> list:
    """The elements of a decoded container: bare arrays as tuples, lists as themselves."""
    return [tuple(v) if type(v) is list else v.items if type(v) is _List else v for v in body]


def _tuple(body: list) -> tuple:
    return tuple([tuple(v) if type(v) is list else v.items if type(v) is _List else v for v in body])


def _list(body: list) -> _List:
    return _List(_items(body))


def _frozenset(body: list) -> frozenset:
    return frozenset(_items(body))


def _set(body: list) -> set:
    return set(_items(body))


def _dict(body: list) -> dict:
    if len(body) % 2:
        raise DecodeError("a dict with a key and no value")
    body = _items(body)
    return dict(zip(body[::2], body[1::2]))


def _slice(body: list) -> slice:
    return slice(*_items(body))


def _primitive(name: str) -> Primitive:
    if type(name) is not str or name not in REGISTRY:
        raise DecodeError(f"{name!r} is not a primitive")
    return REGISTRY[name]


def _float(hexbits: str) -> float:
    return struct.unpack(">d", bytes.fromhex(hexbits))[0]


def _dtype(name: str) -> np.dtype:
    dtype = np.dtype(name)
    if dtype.kind not in DTYPE_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise DecodeError(f"dtype {name} is not one of plain numbers")
    return dtype


def _no_constant(name: str) -> None:
    raise DecodeError(f"{name} in an entry (encode writes no NaN or Infinity)")
