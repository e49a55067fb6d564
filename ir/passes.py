"""Optimisation passes, each a function from IR to IR: dead code, common subexpressions,
algebraic simplification and constant folding. Every rewrite keeps results bit-identical
(x + 0.0 is not x when x is -0.0, so it is not rewritten)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ir import interp
from ir.core import Function, Op, Value
from ir.ops.base import Primitive, Role, np_dtype
from ir.ops.construct import Constant
from ir.ops.contract import Einsum
from ir.ops.elementwise import Add, Cast, Div, Mul, Sub
from ir.ops.index import OneHot
from ir.ops.shape import BroadcastTo, Reshape, Transpose

FOLD_LIMIT = 4096            # constant results larger than this many elements stay computed


def substitute(fn: Function, ops: list[Op], env: dict[Value, Value]) -> Function:
    """fn with the given ops, every use of a value in env replaced by its image."""
    get = lambda v: env.get(v, v)
    new_ops = tuple(Op(op.primitive, tuple(map(get, op.inputs)), op.params, op.outputs, op.body)
                    if any(v in env for v in op.inputs) else op for op in ops)
    return Function(fn.name, fn.params, new_ops, tuple(map(get, fn.results)))


def dce(fn: Function) -> Function:
    """Drop ops none of whose outputs are used; scan and checkpoint bodies too."""
    live = set(fn.results)
    kept = []
    for op in reversed(fn.ops):
        if any(v in live for v in op.outputs):
            kept.append(op if op.body is None else _with_body(op, dce(op.body)))
            live.update(op.inputs)
    return Function(fn.name, fn.params, tuple(reversed(kept)), fn.results)


def _with_body(op: Op, body: Function) -> Op:
    return Op(op.primitive, op.inputs, op.params, op.outputs, body)


def _key(op: Op):
    if isinstance(op.primitive, Constant):
        a = op.attrs
        value = np.asarray(a["value"], dtype=np_dtype(a["dtype"]))
        return ("constant", a["dtype"], value.shape, value.tobytes())
    body = id(op.body) if op.body is not None else None
    return (op.primitive, tuple(v.id for v in op.inputs), op.params, body)


def cse(fn: Function) -> Function:
    """Merge ops that compute the same thing from the same values. Parameters are never
    merged, nor random draws (each draw site stays its own)."""
    seen: dict = {}
    env: dict[Value, Value] = {}
    ops = []
    for op in fn.ops:
        op = Op(op.primitive, tuple(env.get(v, v) for v in op.inputs), op.params, op.outputs,
                cse(op.body) if op.body is not None else None)
        key = None if op.primitive.random or op.body is not None else _key(op)
        if key is not None and key in seen:
            env.update(zip(op.outputs, seen[key].outputs))
            continue
        if key is not None:
            seen[key] = op
        ops.append(op)
    return substitute(fn, ops, env)


def _constant(op: Op | None, value: float) -> bool:
    """Whether op is a scalar or splat constant equal to value, bit for bit."""
    if op is None or not isinstance(op.primitive, Constant):
        return False
    a = op.attrs
    arr = np.asarray(a["value"], dtype=np_dtype(a["dtype"]))
    want = np.asarray(value, dtype=arr.dtype)
    if arr.dtype.kind == "f":             # compare bits: -0.0 is not 0.0 here
        return all(x.tobytes() == want.tobytes() for x in arr.reshape(-1))
    return bool(np.all(arr == want))


# Each rule: (primitive, condition on (op, producers of its inputs), the value it becomes)
Rule = tuple[Primitive, Callable[[Op, list], bool], Callable[[Op, list], Value | None]]

SIMPLIFY: list[Rule] = [
    (Mul(), lambda op, p: _constant(p[1], 1.0) and _same(op, 0), lambda op, p: op.inputs[0]),
    (Mul(), lambda op, p: _constant(p[0], 1.0) and _same(op, 1), lambda op, p: op.inputs[1]),
    (Sub(), lambda op, p: _constant(p[1], 0.0) and _same(op, 0), lambda op, p: op.inputs[0]),
    (Add(), lambda op, p: _constant(p[1], -0.0) and _same(op, 0), lambda op, p: op.inputs[0]),
    (Div(), lambda op, p: _constant(p[1], 1.0) and _same(op, 0), lambda op, p: op.inputs[0]),
    (Reshape(), lambda op, p: op.inputs[0].shape == op.outputs[0].shape, lambda op, p: op.inputs[0]),
    (BroadcastTo(), lambda op, p: op.inputs[0].shape == op.outputs[0].shape, lambda op, p: op.inputs[0]),
    (Cast(), lambda op, p: op.inputs[0].dtype == op.outputs[0].dtype, lambda op, p: op.inputs[0]),
    (Transpose(), lambda op, p: p[0] is not None and p[0].primitive == Transpose()
     and _composes_to_identity(p[0], op), lambda op, p: p[0].inputs[0]),
]
COLLAPSE = (Reshape(), BroadcastTo())      # of two in a row of one of these, the second will do


def _implicit_broadcast(op: Op, producers: list) -> Op | None:
    """An elementwise op broadcasts its operands itself: an explicit broadcast_to feeding it is
    redundant when the result's shape does not depend on it."""
    if op.primitive.role is not Role.ELEMENTWISE or len(op.inputs) < 2:
        return None
    inputs = list(op.inputs)
    for i, p in enumerate(producers):
        if p is not None and p.primitive == BroadcastTo():
            trial = inputs[:i] + [p.inputs[0]] + inputs[i + 1:]
            if np.broadcast_shapes(*(v.shape for v in trial)) == op.outputs[0].shape:
                inputs = trial
    if inputs == list(op.inputs):
        return None
    return Op(op.primitive, tuple(inputs), op.params, op.outputs, op.body)


def _same(op: Op, i: int) -> bool:
    """The result has exactly the type of input i (no broadcasting, no dtype change)."""
    return op.inputs[i].type == op.outputs[0].type


def _composes_to_identity(first: Op, second: Op) -> bool:
    n = len(first.inputs[0].shape)
    p = first.attrs.get("perm") or tuple(reversed(range(n)))
    q = second.attrs.get("perm") or tuple(reversed(range(n)))
    return tuple(p[i] for i in q) == tuple(range(n))


def simplify(fn: Function) -> Function:
    """Algebraic identities (x * 1, x - 0, reshape to the same shape, transpose pairs, …),
    and reshape of reshape / broadcast of broadcast collapsed to one op."""
    producer: dict[Value, Op] = {}
    env: dict[Value, Value] = {}
    ops = []
    for op in fn.ops:
        op = Op(op.primitive, tuple(env.get(v, v) for v in op.inputs), op.params, op.outputs,
                simplify(op.body) if op.body is not None else None)
        inputs = [producer.get(v) for v in op.inputs]
        replaced = next((make(op, inputs) for prim, cond, make in SIMPLIFY
                         if prim == op.primitive and cond(op, inputs)), None)
        if replaced is not None:
            env[op.outputs[0]] = replaced
            continue
        if op.primitive in COLLAPSE and inputs[0] is not None and inputs[0].primitive == op.primitive:
            op = Op(op.primitive, inputs[0].inputs, op.params, op.outputs)
        op = _implicit_broadcast(op, inputs) or op
        ops.append(op)
        producer.update((v, op) for v in op.outputs)
    return substitute(fn, ops, env)


def fold_constants(fn: Function) -> Function:
    """Evaluate ops whose inputs are all constants (small results only; never random)."""
    constant: dict[Value, np.ndarray] = {}
    ops = []
    for op in fn.ops:
        if isinstance(op.primitive, Constant):
            constant[op.outputs[0]] = interp.evaluate(op, [])[0]
        elif (op.body is None and not op.primitive.random and len(op.outputs) == 1
              and all(v in constant for v in op.inputs) and not op.outputs[0].is_key
              and 0 < int(np.prod(op.outputs[0].shape)) <= FOLD_LIMIT):   # a literal has no empty shape
            value = interp.evaluate(op, [constant[v] for v in op.inputs])[0]
            constant[op.outputs[0]] = value
            op = Op(Constant(), (), (("dtype", op.outputs[0].dtype), ("value", _literal(value))), op.outputs)
        ops.append(op)
    return Function(fn.name, fn.params, tuple(ops), fn.results)


def _literal(a: np.ndarray):
    return a.item() if a.ndim == 0 else tuple(_literal(x) for x in a)


def optimize(fn: Function) -> Function:
    """The passes to a fixed point (op count stops falling)."""
    while True:
        before = _size(fn)
        fn = dce(cse(simplify(fold_constants(fn))))
        if _size(fn) >= before:
            return fn


def _size(fn: Function) -> int:
    return sum(1 + (_size(op.body) if op.body is not None else 0) for op in fn.ops)


def for_backends(fn: Function) -> Function:
    """fn in the form the backends schedule, to the bit the same: two-operand einsums that are
    batched matrix products (`bhtd,bhsd->bhts`) as transposes, reshapes and one `matmul` (both
    accumulate over the contracted letters in row-major order of their first appearance, with
    fma), which the contraction kernels compile; and one_hot as the comparison it is, which
    fuses into the kernel that uses it."""
    plans = {Einsum(): _matmul_plan, OneHot(): _one_hot_plan}
    return _rewritten(fn, lambda op: plans[op.primitive](op) if op.primitive in plans else None)


def _rewritten(fn: Function, plan_of: Callable) -> Function:
    """fn (and the bodies it holds) with each op for which plan_of gives a plan replaced by the
    ops the plan emits; a plan is a function of a Builder that returns the op's value."""
    from ir.core import Builder
    ops = []
    env: dict[Value, Value] = {}
    for op in fn.ops:
        op = Op(op.primitive, tuple(env.get(v, v) for v in op.inputs), op.params, op.outputs,
                _rewritten(op.body, plan_of) if op.body is not None else None)
        plan = plan_of(op)
        if plan is None:
            ops.append(op)
            continue
        b = Builder()
        b.ops = []
        env[op.outputs[0]] = plan(b)
        ops.extend(b.ops)
    return substitute(fn, ops, env)


def _one_hot_plan(op: Op):
    """one_hot(i, n) as cast(expand_dims(i, -1) == arange(n)): what its definition computes."""
    (indices,), (out,) = op.inputs, op.outputs
    n = out.shape[-1]

    def build(b):
        positions = b.emit("arange", start=n, dtype=indices.dtype)
        hit = b.emit("eq", b.emit("expand_dims", indices, axis=-1), positions)
        return b.emit("cast", hit, dtype=out.dtype)

    return build


def _matmul_plan(op: Op):
    spec = op.attrs["spec"].replace(" ", "")
    if "->" not in spec or len(op.inputs) != 2:
        return None
    lhs, out = spec.split("->")
    ta, tb = lhs.split(",")
    a, b = op.inputs
    if len(set(ta)) != len(ta) or len(set(tb)) != len(tb) or a.dtype not in ("f32", "f64", "f16"):
        return None
    batch = [c for c in out if c in ta and c in tb]
    m = [c for c in out if c in ta and c not in tb]
    n = [c for c in out if c in tb and c not in ta]
    k = list(dict.fromkeys(c for c in lhs if c.isalpha() and c not in out))
    if any(c not in ta or c not in tb for c in k) or len(batch) + len(m) + len(n) != len(out):
        return None
    size = {c: s for t, v in ((ta, a), (tb, b)) for c, s in zip(t, v.shape)}
    prod = lambda cs: int(np.prod([size[c] for c in cs], dtype=np.int64))

    def build(bld):
        def arrange(v, term, order, shape):
            perm = tuple(term.index(c) for c in order)
            if perm != tuple(range(len(perm))):
                v = bld.emit("transpose", v, perm=perm)
            return bld.emit("reshape", v, shape=shape) if v.shape != shape else v
        bs = tuple(size[c] for c in batch)
        x = arrange(a, ta, batch + m + k, bs + (prod(m), prod(k)))
        y = arrange(b, tb, batch + k + n, bs + (prod(k), prod(n)))
        z = bld.emit("matmul", x, y)
        mid = batch + m + n
        z = bld.emit("reshape", z, shape=tuple(size[c] for c in mid)) if z.shape != tuple(size[c] for c in mid) else z
        perm = tuple(mid.index(c) for c in out)
        return bld.emit("transpose", z, perm=perm) if perm != tuple(range(len(perm))) else z

    return build
