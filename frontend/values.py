"""Abstract values: what the checker knows about a value at compile time.

Static values (ints, floats, bools, strings, ADT values, lists) are known exactly when the
checker is specialising, and may be symbolic or unknown when it checks a generic function.
Runtime values (tensors, keys) are known only by their type. Below the values: static
arithmetic as Python does it, the value a type describes, and what is known of a value that
branches give differently (`merge`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from frontend import ast
from frontend.diagnostics import CheckError, Span
from ir.dims import Dim
from ir.types import (AdtType, DTypeType, FunctionType, KeyType, ListType, RecordType, StaticType,
                      TensorType, TupleType, Type, UnknownType, types_agree)


@dataclass(frozen=True)
class Origin:
    """Where a tensor's type was declared, for notes: `p.W1 is f32[T * E, H] (model.bend:4)`."""
    what: str
    declared: ast.TypeExpr
    span: Span


@dataclass(frozen=True)
class TensorV:
    """A runtime tensor; `ir` is its IR value when the checker is lowering (frontend/lower.py)."""
    type: TensorType
    origin: Origin | None = field(default=None, compare=False)
    ir: Any = field(default=None, compare=False)


@dataclass(frozen=True)
class StaticV:
    """kind 'int' (value a Dim), 'float' (float | None), 'bool' (bool | None) or 'str'."""
    kind: str
    value: Any

    @property
    def known(self) -> bool:
        return not (self.value is None or isinstance(self.value, Dim) and self.value.value is None)

    @property
    def python(self) -> Any:
        """The plain Python value (an int for ints); only when known."""
        return self.value.value if isinstance(self.value, Dim) else self.value


@dataclass(frozen=True)
class KeyV:
    ir: Any = field(default=None, compare=False)


@dataclass(frozen=True)
class DTypeV:
    name: str


@dataclass(frozen=True)
class TupleV:
    items: tuple[Any, ...]


@dataclass(frozen=True)
class ListV:
    """A static list: its items, or (when its length is symbolic) one abstract element."""
    items: tuple[Any, ...] | None
    elem: Any = None
    length: Dim = Dim.const(0)

    @staticmethod
    def of(items) -> ListV:
        items = tuple(items)
        return ListV(items, None, Dim.const(len(items)))


@dataclass(frozen=True)
class RecordV:
    name: str
    fields: tuple[tuple[str, Any], ...]
    decl: Any = field(compare=False, repr=False)      # the resolve.Entity of its object

    def get(self, name: str):
        return dict(self.fields).get(name)

    @property
    def buffers(self) -> frozenset[str]:
        """The fields declared `buffer`: state that grad and map leave alone."""
        return frozenset(f.name for f in self.decl.node.fields if f.buffer)


@dataclass(frozen=True)
class AdtV:
    """A value of a `type`; ctor None when the checker does not know which constructor."""
    type_name: str
    ctor: str | None
    fields: tuple[tuple[str, Any], ...]
    decl: Any = field(compare=False, repr=False)      # the resolve.Entity of its type


@dataclass(frozen=True, eq=False)
class FuncV:
    """A def; env is the enclosing function's variables for a local def, else None."""
    node: ast.Def
    module: Any
    env: dict | None = None


@dataclass(frozen=True, eq=False)
class LambdaV:
    node: ast.Lambda
    module: Any
    env: dict


@dataclass(frozen=True)
class PrimV:
    name: str


@dataclass(frozen=True)
class SpecialV:
    name: str


@dataclass(frozen=True, eq=False)
class GradV:
    """grad(f, wrt=…) or value_and_grad(f, wrt=…): a function of f's arguments."""
    f: Any
    wrt: tuple[str, ...]
    wrt_spans: tuple[Span, ...]
    wrt_tuple: bool
    has_aux: bool
    with_value: bool
    f_span: Span


@dataclass(frozen=True, eq=False)
class CheckpointV:
    f: Any


@dataclass(frozen=True, eq=False)
class CtorV:
    """A constructor with fields, waiting to be called: Tree/Node(l, r)."""
    entity: Any
    ctor: ast.Ctor


@dataclass(frozen=True, eq=False)
class ForkV:
    """`fork` inside a bend: recurses into the bend with new state."""
    run: Callable
    arity: int


@dataclass(frozen=True, eq=False)
class ModuleV:
    module: Any


@dataclass(frozen=True, eq=False)
class TypeV:
    entity: Any


@dataclass(frozen=True)
class UnknownV:
    pass


UNKNOWN = UnknownV()


def type_of(v) -> Type:
    """The type of an abstract value, for messages and for comparing results."""
    match v:
        case TensorV():
            return v.type
        case StaticV():
            return StaticType(v.kind)
        case KeyV():
            return KeyType()
        case DTypeV():
            return DTypeType()
        case TupleV():
            return TupleType(tuple(type_of(i) for i in v.items))
        case ListV():
            elem = type_of(v.items[0]) if v.items else type_of(v.elem) if v.elem is not None else UnknownType()
            return ListType(elem, v.length)
        case RecordV():
            return RecordType(v.name, tuple((n, type_of(f)) for n, f in v.fields))
        case AdtV():
            return AdtType(v.type_name)
        case UnknownV():
            return UnknownType()
        case FuncV():
            return FunctionType(v.node.name)
        case _:
            return FunctionType(type(v).__name__.removesuffix("V").lower())


def describe(v) -> str:
    """A value's type as users read it."""
    return str(type_of(v))


def signature(v) -> Any:
    """A hashable summary of what the checker knows of a value: calls are specialised on it."""
    match v:
        case TensorV() | KeyV() if v.ir is not None:
            return (type(v), getattr(v, "type", None), id(v.ir))
        case TensorV() | StaticV() | KeyV() | DTypeV() | UnknownV() | PrimV() | SpecialV():
            return v
        case TupleV():
            return ("tuple", tuple(signature(i) for i in v.items))
        case ListV():
            items = None if v.items is None else tuple(signature(i) for i in v.items)
            return ("list", items, signature(v.elem) if v.elem is not None else None, v.length)
        case RecordV():
            return ("record", v.name, tuple((n, signature(f)) for n, f in v.fields))
        case AdtV():
            return ("adt", v.type_name, v.ctor, tuple((n, signature(f)) for n, f in v.fields))
        case _:
            return ("object", id(v))


def abstract(t: Type):
    """An abstract value of a type: what a parameter is known to be in a generic check."""
    match t:
        case TensorType():
            return TensorV(t)
        case StaticType(kind="int"):
            return StaticV("int", Dim.unknown())
        case StaticType():
            return StaticV(t.kind, None)
        case KeyType():
            return KeyV()
        case TupleType():
            return TupleV(tuple(abstract(i) for i in t.items))
        case ListType():
            n = t.length.value
            elem = abstract(t.elem)
            return ListV.of([elem] * n) if n is not None else ListV(None, elem, t.length)
        case _:
            return UNKNOWN


def literal_shape(v) -> tuple[tuple[int, ...], str] | None:
    """The shape and kind ('int' or 'float') of a nested static list of numbers, if it is one."""
    if isinstance(v, StaticV) and v.kind in ("int", "float"):
        return (), v.kind
    if isinstance(v, ListV) and v.items:
        parts = [literal_shape(i) for i in v.items]
        if any(p is None for p in parts) or len({p[0] for p in parts}) != 1:
            return None
        kind = "float" if any(p[1] == "float" for p in parts) else "int"
        return (len(v.items),) + parts[0][0], kind
    return None


def static_value(kind: str, x) -> StaticV:
    """A known static int, float or bool."""
    if kind == "int":
        return StaticV("int", Dim.const(int(x)))
    if kind == "float":
        return StaticV("float", float(x))
    return StaticV("bool", bool(x))


def static_binary(op: str, a: StaticV, b: StaticV, span: Span) -> StaticV:
    """Arithmetic on static values, as Python does it; ints may be symbolic dimensions."""
    if a.kind == "str" or b.kind == "str":
        if op == "+" and a.kind == b.kind == "str":
            return StaticV("str", a.value + b.value)
        if op in ("==", "!=") and a.kind == b.kind:
            return StaticV("bool", (a.value == b.value) == (op == "=="))
        raise CheckError(span, f"'{op}' does not apply to {a.kind} and {b.kind}")
    if a.kind == b.kind == "int" and op in ("+", "-", "*", "//") and not (a.known and b.known):
        if op == "//" and b.known and b.python == 0:
            raise CheckError(span, "division by zero in a static expression")
        return StaticV("int", {"+": a.value.__add__, "-": a.value.__sub__, "*": a.value.__mul__,
                               "//": a.value.__floordiv__}[op](b.value))
    if op in ("==", "!=") and a.kind == b.kind == "int" and a.value == b.value and not a.value.is_unknown:
        return StaticV("bool", op == "==")
    kind = _result_kind(op, a.kind, b.kind, span)
    if not (a.known and b.known):
        return StaticV(kind, Dim.unknown() if kind == "int" else None)
    x, y = a.python, b.python
    if op == "**" and kind == "int" and y < 0:
        kind = "float"                          # 2 ** -1 is 0.5, as in Python
    try:
        out = _PY_OPS[op](x, y)
    except ZeroDivisionError:
        raise CheckError(span, "division by zero in a static expression") from None
    except (OverflowError, ValueError) as err:
        raise CheckError(span, f"static arithmetic failed: {err}") from None
    if isinstance(out, complex) or isinstance(out, float) and not math.isfinite(out) and kind == "int":
        raise CheckError(span, "static arithmetic has no real result")
    if kind == "int" and isinstance(out, int) and abs(out) > 2 ** 62:
        raise CheckError(span, "static int overflows")
    return static_value(kind, out)


_PY_OPS = {
    "+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
    "/": lambda x, y: x / y, "//": lambda x, y: x // y, "%": lambda x, y: x % y,
    "**": lambda x, y: _power(x, y), "==": lambda x, y: x == y, "!=": lambda x, y: x != y,
    "<": lambda x, y: x < y, "<=": lambda x, y: x <= y, ">": lambda x, y: x > y,
    ">=": lambda x, y: x >= y, "&": lambda x, y: x & y, "|": lambda x, y: x | y,
    "^": lambda x, y: x ^ y, "<<": lambda x, y: x << y, ">>": lambda x, y: x >> y,
}


def _power(x, y):
    if isinstance(x, int) and isinstance(y, int) and abs(y) > 4096:
        raise OverflowError("exponent too large")
    return x ** y


def _result_kind(op: str, ka: str, kb: str, span: Span) -> str:
    if op in ("==", "!=", "<", "<=", ">", ">="):
        if (ka == "bool") != (kb == "bool") and op not in ("==", "!="):
            raise CheckError(span, f"cannot compare {ka} with {kb}")
        return "bool"
    if op in ("&", "|", "^"):
        if ka == kb and ka in ("bool", "int"):
            return ka
        raise CheckError(span, f"'{op}' needs two bools or two ints, got {ka} and {kb}")
    if "bool" in (ka, kb):
        raise CheckError(span, f"'{op}' does not apply to a bool")
    if op in ("<<", ">>"):
        if ka == kb == "int":
            return "int"
        raise CheckError(span, f"'{op}' needs ints")
    if op == "@":
        raise CheckError(span, "'@' needs tensors, got static numbers")
    if op == "/":
        return "float"
    return "int" if ka == kb == "int" else "float"


def merge(a, b):
    """What is known of a value that is either a or b."""
    if a == b:
        return a
    match a, b:
        case TensorV(), TensorV() if types_agree(a.type, b.type):
            return TensorV(a.type)
        case StaticV(), StaticV() if a.kind == b.kind:
            return StaticV(a.kind, Dim.unknown() if a.kind == "int" else None)
        case TupleV(), TupleV() if len(a.items) == len(b.items):
            return TupleV(tuple(map(merge, a.items, b.items)))
        case RecordV(), RecordV() if a.name == b.name:
            return RecordV(a.name, tuple((n, merge(x, y)) for (n, x), (_, y) in zip(a.fields, b.fields)), a.decl)
        case AdtV(), AdtV() if a.type_name == b.type_name:
            return AdtV(a.type_name, None, (), a.decl)
    return UNKNOWN


def merge_all(values: list):
    """What is known of a value that is any of `values`."""
    out = values[0] if values else UNKNOWN
    for v in values[1:]:
        out = merge(out, v)
    return out


def stack(v, n: Dim):
    """The type of n emitted values stacked along a new leading axis."""
    match v:
        case TensorV():
            return TensorV(v.type.with_shape((n, *v.type.shape)))
        case StaticV() if v.kind in ("int", "float"):
            return TensorV(TensorType("f32" if v.kind == "float" else "i32", (n,)))
        case TupleV():
            return TupleV(tuple(stack(i, n) for i in v.items))
        case RecordV():
            return RecordV(v.name, tuple((k, stack(f, n)) for k, f in v.fields), v.decl)
    return UNKNOWN


def same_structure(a, b) -> bool:
    """Whether a and b are records of one name, or tuples or lists of one length, or neither."""
    if isinstance(a, RecordV):
        return isinstance(b, RecordV) and a.name == b.name
    if isinstance(a, (TupleV, ListV)):
        return type(b) is type(a) and b.items is not None and len(a.items) == len(b.items)
    return not isinstance(b, (RecordV, TupleV, ListV))


def param_names(f) -> list[str] | None:
    """The parameter names of a callable value (None where it is not one)."""
    match f:
        case FuncV():
            return [p.name for p in f.node.params]
        case LambdaV():
            return list(f.node.params)
        case CheckpointV():
            return param_names(f.f)
        case GradV():
            return param_names(f.f)
        case PrimV() | CtorV():
            return []
    return None


def strip_origin(v):
    """v without the declaration its notes would point at."""
    return TensorV(v.type, None, v.ir) if isinstance(v, TensorV) else v
