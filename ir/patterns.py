"""Rewrite rules over the IR, after tinygrad's UPat and PatternMatcher: a pattern describes an
op and the ops that make its inputs (given as `producer`: values do not know their ops); a rule
table rewrites an op by its first rule that matches. Guards and results take the names they ask
for among the bindings, `op` (the op matched) and, for results, `b`: a Builder for what they emit.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from ir.core import Builder, Op, Value
from ir.ops.base import Primitive, is_float, literal_array, statics
from ir.ops.construct import Constant


@dataclass(frozen=True)
class Var:
    """Matches anything (a value, or a static parameter) and binds it to `name`; a name bound
    twice must see the same thing both times. `_` matches anything and binds nothing."""
    name: str


X, Y, _ = Var("X"), Var("Y"), Var("_")


@dataclass(frozen=True)
class Const:
    """Matches a value made by a scalar or splat constant equal to `value` bit for bit, so that
    Const(0.0) does not match -0.0."""
    value: float


@dataclass(frozen=True)
class Pat:
    """Matches a value made by an op of `prim` whose inputs match `inputs` and static parameters
    `params`, when `guard` holds of the bindings."""
    prim: Primitive | type[Primitive]             # a class: any primitive of that kind
    inputs: tuple | None = None                   # patterns; `...` last: any more; None: any
    params: tuple[tuple[str, Any], ...] = ()      # (name, a Var to bind it or a value to equal)
    guard: Callable[..., bool] | None = None


def pat(prim: Primitive | type[Primitive], *inputs: Any, guard: Callable[..., bool] | None = None,
        **params: Any) -> Pat:
    """Pat(prim, inputs, params, guard), written as the op reads; no inputs given: any inputs."""
    return Pat(prim, inputs or None, tuple(params.items()), guard)


@dataclass(frozen=True)
class Rule:
    """A pattern, and the value an op it matches becomes: `result` of the bindings it names."""
    pattern: Pat
    result: Callable[..., Value]


@dataclass(frozen=True)
class Rules:
    """A rule table, tried in order. An op is tried only against the rules whose pattern's
    root its primitive can match, found once for each class of primitive (primitives are
    stateless: two of one class are equal); trying them all was half of simplify."""
    table: tuple[Rule, ...]
    _for: dict[type, tuple[Rule, ...]] = field(default_factory=dict, compare=False, repr=False)

    def for_op(self, op: Op) -> tuple[Rule, ...]:
        kind = type(op.primitive)
        found = self._for.get(kind)
        if found is None:
            found = self._for[kind] = tuple(r for r in self.table
                                            if _is(op.primitive, r.pattern.prim))
        return found


def rules(*table: tuple[Pat, Callable[..., Value]]) -> Rules:
    """A rule table, tried in order."""
    return Rules(tuple(Rule(p, r) for p, r in table))


def match(pattern: Pat, op: Op, producer: Mapping[Value, Op]) -> dict[str, Any] | None:
    """The bindings under which `pattern` matches op, or None."""
    env: dict[str, Any] = {}
    return env if _op(pattern, op, producer, env, op) else None


def rewrite(table: Rules, op: Op, producer: Mapping[Value, Op], b: Builder) -> Value | None:
    """The value op's result becomes by the first rule of table that matches it (the ops that
    make it emitted into b), or None when none does."""
    for rule in table.for_op(op):
        env = match(rule.pattern, op, producer)
        if env is not None:
            return _call(rule.result, env, op=op, b=b)
    return None


def _is(prim: Primitive, p: Primitive | type[Primitive]) -> bool:
    """Whether prim is p, or of the kind p."""
    return isinstance(prim, p) if isinstance(p, type) else prim == p


def _op(pattern: Pat, op: Op, producer: Mapping[Value, Op], env: dict, top: Op) -> bool:
    if not _is(op.primitive, pattern.prim):
        return False
    if pattern.inputs is not None:
        rest = pattern.inputs[-1:] == (...,)
        fixed = pattern.inputs[:len(pattern.inputs) - rest]
        if len(op.inputs) < len(fixed) or not rest and len(op.inputs) > len(fixed):
            return False
        if not all(_value(q, v, producer, env, top) for q, v in zip(fixed, op.inputs)):
            return False
    given = statics(op) if pattern.params else {}
    if not all(_bind(q, given[name], env) for name, q in pattern.params):
        return False
    return pattern.guard is None or _call(pattern.guard, env, op=top)


def _value(pattern: Any, v: Value, producer: Mapping[Value, Op], env: dict, top: Op) -> bool:
    if isinstance(pattern, Var):
        return _bind(pattern, v, env)
    made = producer.get(v)
    if isinstance(pattern, Const):
        return made is not None and _splat(made, pattern.value)
    return made is not None and _op(pattern, made, producer, env, top)


def _bind(pattern: Any, x: Any, env: dict) -> bool:
    if not isinstance(pattern, Var):
        return pattern == x
    if pattern.name == "_":
        return True
    return env.setdefault(pattern.name, x) == x        # Values compare by identity


def _splat(op: Op, value: float) -> bool:
    """Whether op is a scalar or splat constant equal to value, bit for bit."""
    if not isinstance(op.primitive, Constant):
        return False
    a = op.attrs
    arr = literal_array(a["value"], a["dtype"])
    want = np.asarray(value, dtype=arr.dtype)
    if is_float(arr.dtype):               # compare bits: -0.0 is not 0.0 here
        return all(x.tobytes() == want.tobytes() for x in arr.reshape(-1))
    return bool(np.all(arr == want))


def _call(fn: Callable, env: dict, **extra: Any) -> Any:
    """fn of the names it takes among env's bindings and extra's."""
    return fn(**{k: v for k, v in {**env, **extra}.items() if k in _names(fn)})


@functools.cache
def _names(fn: Callable) -> frozenset[str]:
    return frozenset(inspect.signature(fn).parameters)
