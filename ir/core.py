"""The tensor IR: typed SSA functions of primitive ops on tensors of concrete shapes.

A `Function` is a list of `Op`s over `Value`s. Every value has a dtype and a concrete shape
(a TensorType whose dims are constants) or is a random key. Records, tuples and lists of the
source are flattened away by lowering; a `fold` over a tensor stays one structured `scan` op
whose body is a Function. Static parameters of an op (axes, shapes, dtypes) are plain Python
values, hashable, so that equal ops can be recognised.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import Any

from ir import ops
from ir.dims import Dim
from ir.ops.base import Kind, Primitive, Role
from ir.types import KeyType, ListType, TensorType, TupleType, Type

_ids = itertools.count()


@dataclass(frozen=True, eq=False)
class Value:
    """One SSA value; identity is the value (two values are never merged by equality)."""
    type: TensorType | KeyType
    id: int = field(default_factory=lambda: next(_ids))
    # the shape's sizes, made once: `shape` is the compiler's most read property, and made at
    # each read it took 28% of scheduling (the cache decodes it with the value)
    concrete_shape: tuple[int | None, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "concrete_shape", tuple([d.value for d in self.type.shape])
                           if isinstance(self.type, TensorType) else (2,))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.concrete_shape

    @property
    def dtype(self) -> str:
        return self.type.dtype if isinstance(self.type, TensorType) else "u32"

    @property
    def is_key(self) -> bool:
        return isinstance(self.type, KeyType)

    def __repr__(self) -> str:
        return f"%{self.id}"

    def __setstate__(self, state: dict) -> None:
        # ids are unique within one process only (passes key on them): an unpickled value,
        # made by another process, takes a fresh one
        self.__dict__.update(state, id=next(_ids))


@dataclass(frozen=True, eq=False)
class Op:
    """outputs = primitive(inputs; params), with a body Function for structured ops (scan,
    checkpoint). `origin` is where the source wrote it (a frontend.diagnostics.Site), which
    run-time errors and `debug` report; passes that rebuild an op keep it (dataclasses.replace)."""
    primitive: Primitive
    inputs: tuple[Value, ...]
    params: tuple[tuple[str, Any], ...]
    outputs: tuple[Value, ...]
    body: Function | None = None
    origin: Any = None

    @property
    def attrs(self) -> dict[str, Any]:
        return dict(self.params)


@dataclass(frozen=True, eq=False)
class Function:
    name: str
    params: tuple[Value, ...]
    ops: tuple[Op, ...]
    results: tuple[Value, ...]

    def __len__(self) -> int:
        return len(self.ops)


def concrete(shape: tuple[int, ...]) -> tuple[Dim, ...]:
    return tuple(Dim.const(int(n)) for n in shape)


def tensor_type(dtype: str, shape: tuple[int, ...]) -> TensorType:
    return _tensor_type(dtype, tuple(shape))


@functools.lru_cache(maxsize=4096)
def _tensor_type(dtype: str, shape: tuple[int, ...]) -> TensorType:
    # one object per type: a call's input signature then compares by identity, not field by field
    return TensorType(dtype, concrete(shape))


def bind_inputs(prim: Primitive, inputs: tuple, static: dict[str, Any]) -> dict[str, Any]:
    """An op's inputs and static parameters as the keyword arguments of its primitive's
    `infer`/`evaluate`: tensor parameters take inputs in order; a list-of-tensors or
    variadic parameter takes all the rest."""
    args: dict[str, Any] = {}
    rest = list(inputs)
    for p in prim.params:
        if p.kind is Kind.TENSORS or p.variadic:
            args[p.name], rest = tuple(rest), []
        elif p.kind in (Kind.TENSOR, Kind.KEY):
            if rest:
                args[p.name] = rest.pop(0)
        elif p.name in static:
            args[p.name] = static[p.name]
    return args


def _dims(kind: Kind, value: Any) -> Any:
    """A static parameter in the form shape rules take: ints of shapes and sizes as Dims."""
    if kind is Kind.SHAPE and value is not None:
        return concrete(value)
    if kind is Kind.DIM and isinstance(value, int):
        return Dim.const(value)
    return value


class Builder:
    """Appends ops to a function under construction; `emit` infers each result's type."""

    def __init__(self, name: str = "f"):
        self.name = name
        self.params: list[Value] = []
        self.ops: list[Op] = []
        self.origin: Any = None         # the origin of the ops emitted next (the front end sets it)

    def param(self, type: TensorType | KeyType) -> Value:
        v = Value(type)
        self.params.append(v)
        return v

    def emit(self, prim: str | Primitive, *inputs: Value, **static: Any) -> Value | tuple[Value, ...]:
        """Append prim(inputs; static) and return its result (a tuple when it has several);
        prim is a primitive or its IR name. A composite primitive appends the ops of its
        definition instead."""
        p = prim if isinstance(prim, Primitive) else ops.REGISTRY[prim]
        args = bind_inputs(p, tuple(v.type for v in inputs), static)
        kinds = {q.name: q.kind for q in p.params}
        result = p.infer(**{k: _dims(kinds[k], v) for k, v in args.items()})
        if p.role is Role.COMPOSITE:
            return p.expand(self, **bind_inputs(p, tuple(inputs), static))
        outputs = tuple(Value(t) for t in _flat_types(result))
        self.ops.append(Op(p, tuple(inputs), tuple(sorted(static.items())), outputs, origin=self.origin))
        return outputs[0] if not isinstance(result, (TupleType, ListType)) else outputs

    def add(self, op: Op) -> None:
        self.ops.append(op)

    def constant(self, value: Any, dtype: str) -> Value:
        """A literal tensor (a number or a nested tuple of numbers) of the given dtype."""
        return self.emit("constant", value=value, dtype=dtype)

    def finish(self, results: list[Value] | tuple[Value, ...]) -> Function:
        return Function(self.name, tuple(self.params), tuple(self.ops), tuple(results))


def _flat_types(t: Type) -> list[TensorType | KeyType]:
    if isinstance(t, TupleType):
        return [x for i in t.items for x in _flat_types(i)]
    if isinstance(t, ListType):
        return _flat_types(t.elem) * t.length.value
    return [t]
