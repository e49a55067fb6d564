"""Lowering: a checked program, specialised for concrete inputs, becomes an IR function.

The checker is the lowering: run on concrete types with a Builder attached, every primitive
it applies to runtime values is also emitted as an IR op (JAX-style tracing), while static
values (ints, `if`, `switch`, lists, ADTs) are evaluated away. This module holds what
lowering adds to checking: turning values into IR operands, emitting ops, tracing a
function into its own IR function (for `grad`, `checkpoint` and `fold`), and flattening
structured inputs and outputs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


from frontend.values import (AdtV, KeyV, ListV, RecordV, StaticV, TensorV, TupleV, UnknownV,
                             describe, literal_shape)
from ir.core import Builder, Function, Value
from ir.dims import Dim
from ir.ops.base import Kind, Primitive, common_dtype
from ir.ops.shape import SliceSpec
from ir.types import KeyType, ListType, TensorType, TupleType, Type


class LoweringError(Exception):
    """Something the checker accepts but lowering cannot express (reported as a diagnostic)."""


# ---------------------------------------------------------------- values as IR operands

def literal(v) -> Any:
    """A static number or nested list of numbers as a plain Python value."""
    if isinstance(v, StaticV):
        return v.python
    return tuple(literal(i) for i in v.items)


def materialize(b: Builder, v, dtype: str | None) -> Value:
    """The IR value of an operand; static numbers and number lists become constants."""
    if isinstance(v, (TensorV, KeyV)) and v.ir is not None:
        return v.ir
    if isinstance(v, StaticV) and v.kind == "bool":
        return b.constant(bool(v.value), "bool")
    lit = literal_shape(v)
    if lit is None or isinstance(v, StaticV) and not v.known:
        raise LoweringError(f"cannot lower a value of type {describe(v)}")
    return b.constant(literal(v), dtype or ("f32" if lit[1] == "float" else "i32"))


def literal_dtype(prim: Primitive, param: str, weak: TensorType, result: Type,
                  prepared: dict[str, Any]) -> str:
    """The dtype a weak literal operand becomes: that of the tensors it meets (`x * 2`), or
    its own (f32/i32) where it meets none (an index list, a probability)."""
    shared = prim.shares_dtype
    if param not in shared:
        return weak.dtype
    if isinstance(result, TensorType) and result.dtype != "bool":
        return result.dtype
    operands = [(n, t) for n in shared for t in _as_tuple(prepared.get(n)) if isinstance(t, TensorType)]
    return common_dtype(prim.name, operands)[0]


def _as_tuple(x) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def _plain(x: Any) -> Any:
    """A static parameter for the IR: Dims as ints."""
    if isinstance(x, Dim):
        return x.value
    if isinstance(x, tuple):
        return tuple(_plain(i) for i in x)
    if isinstance(x, SliceSpec):
        return SliceSpec(_plain(x.lo), _plain(x.hi), x.step)
    return x


def emit_primitive(b: Builder, prim: Primitive, raw: dict[str, Any], prepared: dict[str, Any],
                   result: Type):
    """Emit prim applied to raw argument values; returns the result as a value with IR."""
    inputs: list[Value] = []
    statics: dict[str, Any] = {}
    for p in prim.params:
        if p.kind in (Kind.TENSOR, Kind.KEY) and not p.variadic:
            weak = prepared[p.name]
            dtype = literal_dtype(prim, p.name, weak, result, prepared) if p.kind is Kind.TENSOR else None
            inputs.append(materialize(b, raw[p.name], dtype))
        elif p.kind is Kind.TENSORS or p.variadic:
            items = raw[p.name].items if isinstance(raw[p.name], (ListV, TupleV)) else raw[p.name]
            for item, t in zip(items, prepared[p.name]):
                inputs.append(materialize(b, item, literal_dtype(prim, p.name, t, result, prepared)))
        else:
            statics[p.name] = _plain(prepared[p.name])
    out = b.emit(prim, *inputs, **statics)
    return attach(result, list(out) if isinstance(out, tuple) else [out])


def attach(t: Type, values: list[Value]):
    """The abstract value of a result type whose leaves are the given IR values, in order."""
    match t:
        case TensorType():
            v = values.pop(0)
            return TensorV(v.type, ir=v)
        case KeyType():
            return KeyV(ir=values.pop(0))
        case TupleType():
            return TupleV(tuple(attach(i, values) for i in t.items))
        case ListType():
            return ListV.of([attach(t.elem, values) for _ in range(t.length.value)])
    raise LoweringError(f"cannot lower a result of type {t}")


# ---------------------------------------------------------------- structure

@dataclass(frozen=True)
class Layout:
    """How a structured value maps to a flat list of leaves: 'tensor', 'key', 'static'
    (with its value), 'tuple', 'list', 'record' (with name and field names)."""
    kind: str
    items: tuple[Layout, ...] = ()
    name: str = ""
    fields: tuple[str, ...] = ()
    value: Any = None


def flatten(v) -> tuple[list, Layout]:
    """The runtime leaves (TensorV / KeyV) of a value, and its layout."""
    leaves: list = []

    def walk(x) -> Layout:
        match x:
            case TensorV():
                leaves.append(x)
                return Layout("tensor")
            case KeyV():
                leaves.append(x)
                return Layout("key")
            case StaticV() if x.known:
                return Layout("static", value=x.python)
            case TupleV():
                return Layout("tuple", tuple(walk(i) for i in x.items))
            case ListV() if x.items is not None:
                return Layout("list", tuple(walk(i) for i in x.items))
            case RecordV():
                return Layout("record", tuple(walk(f) for _, f in x.fields), x.name,
                              tuple(n for n, _ in x.fields))
        raise LoweringError(f"a value of type {describe(x)} cannot cross into or out of compiled code")

    layout = walk(v)
    return leaves, layout


def rebuild(v, values: list[Value]):
    """A value of the same structure as v whose runtime leaves are the given IR values."""
    match v:
        case TensorV():
            return TensorV(v.type, v.origin, values.pop(0))
        case KeyV():
            return KeyV(values.pop(0))
        case TupleV():
            return TupleV(tuple(rebuild(i, values) for i in v.items))
        case ListV() if v.items is not None:
            return ListV.of(rebuild(i, values) for i in v.items)
        case RecordV():
            return RecordV(v.name, tuple((n, rebuild(f, values)) for n, f in v.fields), v.decl)
    return v


def fresh_params(b: Builder, v):
    """v with every runtime leaf replaced by a new parameter of b."""
    leaves = runtime_leaves(v)
    return rebuild(v, [b.param(x.ir.type if x.ir is not None else _leaf_type(x)) for x in leaves])


def runtime_leaves(v) -> list:
    """The runtime leaves of v (tensors and keys), static parts skipped."""
    return [x for x, _ in _leaves(v, True)]


def trained_leaves(v) -> list[bool]:
    """For each runtime leaf of v, in runtime_leaves' order, whether it is trained: not held
    by a record field declared `buffer`, at any depth."""
    return [trained for _, trained in _leaves(v, True)]


def _leaves(x, trained: bool):
    match x:
        case TensorV() | KeyV():
            yield x, trained
        case TupleV() | ListV() if x.items is not None:
            for i in x.items:
                yield from _leaves(i, trained)
        case RecordV():
            for n, f in x.fields:
                yield from _leaves(f, trained and n not in x.buffers)
        case AdtV():
            for _, f in x.fields:
                yield from _leaves(f, trained)
        case UnknownV():
            raise LoweringError("a value the checker could not determine reached lowering")


def _leaf_type(x) -> TensorType | KeyType:
    return x.type if isinstance(x, TensorV) else KeyType()


def leaf_values(v) -> list[Value]:
    """The IR values of v's runtime leaves."""
    return [x.ir for x in runtime_leaves(v)]


def close_over(b: Builder, results: list[Value]) -> tuple[Function, list[Value]]:
    """The function b has built, with the values it uses from enclosing functions (a
    closure's captures) appended to its parameters; returns it and those values."""
    defined = set(b.params) | {v for op in b.ops for v in op.outputs}
    captured: list[Value] = []
    for v in [v for op in b.ops for v in op.inputs] + list(results):
        if v not in defined and v not in captured:
            captured.append(v)
    fn = b.finish(results)
    return Function(fn.name, fn.params + tuple(captured), fn.ops, fn.results), captured
