"""Plain data for the compile cache: the syntax trees, lowered IR and kernel plans it stores.
Written by Python's pickle, whose C implementation walks an object graph ten times faster than
the same walk in Python, and read back by an unpickler that calls nothing but this module's
makers and imports nothing: it makes containers, numbers, strings and bytes, slices, NumPy
arrays, scalars and dtypes of plain numbers, primitives (by their name in the registry), and
objects of the dataclasses and enums of dslc's own packages found among the modules already
imported, each with its class's fields. Anything else in an entry (a function to call, a
class of another package, an object without its fields) is a DecodeError, never code run.
Objects reached more than once (an IR value used by several ops) are written once, so the
decoded graph shares what the encoded one shared."""
from __future__ import annotations

import builtins
import dataclasses
import enum
import io
import pickle
import sys
import types
from typing import Any, Callable

import numpy as np

from ir.ops.base import REGISTRY, Primitive

PACKAGES = ("frontend", "ir", "backend", "runtime", "dsl")
DTYPE_KINDS = "biufc"           # bool, ints, floats, complex: arrays of plain bytes
PROTOCOL = 4                    # (5 would write a bytearray as itself, outside the list)


class EncodeError(ValueError):
    """A value the codec does not write (a type outside its list): it is not cached."""


class DecodeError(ValueError):
    """An entry that is not something encode wrote: treated as absent."""


def encode(value: Any) -> bytes:
    """value as the bytes decode reads back; EncodeError when it holds a type outside the list."""
    out = io.BytesIO()
    try:
        _Pickler(out, PROTOCOL).dump(value)
    except RecursionError:
        raise EncodeError("a value nested too deeply") from None
    return out.getvalue()


def decode(data: bytes) -> Any:
    """The value encode wrote into data; DecodeError for anything else, however it differs."""
    try:
        return _Unpickler(io.BytesIO(data)).load()
    except DecodeError:
        raise
    except Exception as e:              # (a damaged pickle fails in a dozen types of error)
        raise DecodeError(f"not an entry: {type(e).__name__}: {e}") from None


# ---------------------------------------------------------------------------------------------
# Encoding: the pickler asks reducer_override about each object of a type outside its own
# (containers, numbers, strings, bytes) before writing it; how a type is written is kept.

class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, protocol: int):
        super().__init__(file, protocol)
        self.writers: dict[type, Callable[[Any], Any]] = {}

    def reducer_override(self, x: Any) -> Any:
        t = type(x)
        write = self.writers.get(t) or self.writers.setdefault(t, _writer(t))
        return write(x)


def _writer(t: type) -> Callable[[Any], Any]:
    """How objects of type t are written: as a maker of this module and its arguments, or
    (NotImplemented) as pickle writes them; an EncodeError for a type outside the list."""
    if issubclass(t, Primitive):
        return lambda x: (_primitive, (x.name,))
    if t is np.ndarray:
        return lambda x: (_array, (_dtype_name(x.dtype), x.shape, np.ascontiguousarray(x).tobytes()))
    if issubclass(t, np.generic):
        return lambda x: (_scalar, (_dtype_name(x.dtype), x.tobytes()))
    if issubclass(t, np.dtype):
        return lambda x: (_dtype, (_dtype_name(x),))
    if _readable_class(t) and issubclass(t, enum.Enum):
        return lambda x: (_member, (t, x.name))
    if _readable_class(t) and "__dict__" in dir(t):     # (not a dataclass with slots)
        return lambda x: (_object, (t, x.__dict__))
    if t in (slice, type(Ellipsis)):                    # builtins.slice(…), builtins.Ellipsis
        return lambda x: NotImplemented
    if t is types.FunctionType:                         # a maker, written as its name
        return lambda x: NotImplemented if MAKERS.get(x.__name__) is x else _refuse(x)
    if t is type or issubclass(t, enum.EnumMeta):       # a class, written as its name
        return lambda x: NotImplemented if _readable_class(x) or x is slice else _refuse(x)
    return _refuse


def _refuse(x: Any) -> None:
    t = x if isinstance(x, type) else type(x)
    raise EncodeError(f"no encoding for a {t.__module__}.{t.__qualname__}")


def _readable_class(c: type) -> bool:
    """Whether c is a dataclass or enum of dslc that decode finds again by its name."""
    return (c.__module__.split(".")[0] in PACKAGES and "<locals>" not in c.__qualname__
            and (dataclasses.is_dataclass(c) or issubclass(c, enum.Enum)))


def _dtype_name(dtype: np.dtype) -> str:
    if dtype.kind not in DTYPE_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise EncodeError(f"no encoding for dtype {dtype}")
    return dtype.str


# ---------------------------------------------------------------------------------------------
# Decoding: every class and function an entry names passes through find_class. A class of
# dslc comes back as a _Class, which only the makers use: pickle's own ways of making an
# object (calling its class, or making it empty and then setting what the entry holds) would
# make one without its fields.

@dataclasses.dataclass(frozen=True)
class _Class:
    cls: type


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == __name__ and name in MAKERS:
            return MAKERS[name]
        if module == "builtins" and name in ("slice", "Ellipsis"):
            return getattr(builtins, name)
        return _dslc_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise DecodeError("a persistent id in an entry")


def _dslc_class(module: str, qualname: str) -> _Class:
    """The class an entry names, if it is a dataclass or enum of dslc in a module already
    imported (an entry never makes Python import anything)."""
    if module.split(".")[0] not in PACKAGES or module not in sys.modules:
        raise DecodeError(f"{module}.{qualname} is not a class of dslc")
    cls: Any = sys.modules[module]
    for part in qualname.split("."):
        cls = getattr(cls, part, None) if part.isidentifier() and not part.startswith("__") else None
    if not (isinstance(cls, type) and cls.__module__ == module and cls.__qualname__ == qualname
            and _readable_class(cls)):
        raise DecodeError(f"{module}.{qualname} is not a dataclass or enum of dslc")
    return _Class(cls)


# the fields and the __setstate__ of each dataclass met
_dataclasses: dict[type, tuple[frozenset[str], Callable | None]] = {}
_new, _set = object.__new__, object.__setattr__


def _object(c: _Class, state: dict) -> Any:
    """An object of a dataclass of dslc with these attributes, made as unpickling makes one
    (without calling __init__, and through __setstate__ where the class has one: ir.core.Value
    takes a fresh id), once they hold the class's fields."""
    known = _dataclasses.get(c.cls) if type(c) is _Class else None
    if known is None:
        if type(c) is not _Class or not dataclasses.is_dataclass(c.cls):
            raise DecodeError(f"{c!r} is not a dataclass of dslc")
        known = _dataclasses[c.cls] = (frozenset(f.name for f in dataclasses.fields(c.cls)),
                                       getattr(c.cls, "__setstate__", None))
    fields, setstate = known
    if type(state) is not dict or not fields <= state.keys():
        raise DecodeError(f"a {c.cls.__qualname__} without its fields")
    x = _new(c.cls)
    if setstate is None:
        _set(x, "__dict__", state)          # (a new dict of the unpickler's, held by no other)
    else:
        setstate(x, state)
    return x


def _member(c: _Class, name: str) -> enum.Enum:
    if type(c) is not _Class or not issubclass(c.cls, enum.Enum) or type(name) is not str \
            or name not in c.cls.__members__:
        raise DecodeError(f"{name!r} is not a member of {c!r}")
    return c.cls[name]


def _primitive(name: str) -> Primitive:
    if type(name) is not str or name not in REGISTRY:
        raise DecodeError(f"{name!r} is not a primitive")
    return REGISTRY[name]


def _dtype(name: str) -> np.dtype:
    dtype = np.dtype(name) if type(name) is str else None
    if dtype is None or dtype.kind not in DTYPE_KINDS or dtype.fields is not None \
            or dtype.subdtype is not None:
        raise DecodeError(f"dtype {name!r} is not one of plain numbers")
    return dtype


def _array(dtype: str, shape: tuple, data: bytes) -> np.ndarray:
    return np.frombuffer(data, _dtype(dtype)).reshape(shape).copy()    # the caller's own


def _scalar(dtype: str, data: bytes) -> np.generic:
    return np.frombuffer(data, _dtype(dtype))[0]


MAKERS = {f.__name__: f for f in (_object, _member, _primitive, _dtype, _array, _scalar)}
