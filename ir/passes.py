"""Optimisation passes, each a function from IR to IR: dead code, common subexpressions,
algebraic simplification, constant folding, and for the backends hoisting out of folds and
making cheap values again where the backward pass reads them. Every
rewrite keeps results bit-identical (x + 0.0 is not x when x is -0.0, so it is not rewritten).

Simplification is tables of rules (ir/patterns.py). Folding and CSE are not: a fold needs the
arrays of every constant evaluated so far, and CSE compares an op with all the ops before it,
neither a pattern of the ops that make its inputs."""
from __future__ import annotations

import math
from dataclasses import replace
from itertools import accumulate
from typing import Callable

import numpy as np

from ir import interp
from ir.core import Builder, Function, Op, Value
from ir.ops.base import Role, literal_array, normalize_axes, statics
from ir.ops.construct import Constant, Filled
from ir.ops.contract import Einsum, MatMul
from ir.ops.control import Scan
from ir.ops.elementwise import Add, Cast, Div, Elementwise, Mul, Neg, Sub
from ir.ops.index import OneHot
from ir.ops.reduce import AllTrue, AnyTrue, Max, Mean, Min, Prod, Sum
from ir.ops.shape import BroadcastTo, Reshape, Transpose
from ir.patterns import Const, Var, X, _, pat, rewrite, rules
from ir.types import INT_DTYPES

FOLD_LIMIT = 4096            # constant results larger than this many elements stay computed


def substitute(fn: Function, ops: list[Op], env: dict[Value, Value]) -> Function:
    """fn with the given ops, every use of a value in env replaced by its image."""
    get = lambda v: env.get(v, v)
    new_ops = tuple(replace(op, inputs=tuple(map(get, op.inputs)))
                    if any(v in env for v in op.inputs) else op for op in ops)
    return Function(fn.name, fn.params, new_ops, tuple(map(get, fn.results)))


def dce(fn: Function) -> Function:
    """Drop ops none of whose outputs are used (but for effects: debug, assert_finite); scan
    and checkpoint bodies too, and a scan's emits that nothing uses."""
    live = set(fn.results)
    kept = []
    for op in reversed(fn.ops):
        if op.primitive.effect or any(v in live for v in op.outputs):
            if isinstance(op.primitive, Scan):
                op = _live_scan(op, live)
            elif op.body is not None:
                op = _with_body(op, dce(op.body))
            kept.append(op)
            live.update(op.inputs)
    return Function(fn.name, fn.params, tuple(reversed(kept)), fn.results)


def _live_scan(op: Op, live: set[Value]) -> Op:
    """The scan without the emits outside `live`, and without the sequences and constants its
    body then does not read (a gradient's scan emits the cotangent of every sequence, whether
    or not it is asked for: an LSTM's wrt its parameters alone computed its input's too)."""
    a, body = op.attrs, op.body
    n_state, n_xs = a["n_state"], a["n_xs"]
    emits = [k for k, v in enumerate(op.outputs[n_state:]) if v in live]
    body = dce(Function(body.name, body.params, body.ops,
                        body.results[:n_state] + tuple(body.results[n_state + k] for k in emits)))
    read = {v for o in body.ops for v in o.inputs} | set(body.results)
    kept = [i for i, v in enumerate(body.params) if i < n_state or v in read]
    params = tuple((k, sum(n_state <= i < n_state + n_xs for i in kept) if k == "n_xs" else v)
                   for k, v in op.params)
    return replace(op, inputs=tuple(op.inputs[i] for i in kept), params=params,
                   outputs=op.outputs[:n_state] + tuple(op.outputs[n_state + k] for k in emits),
                   body=Function(body.name, tuple(body.params[i] for i in kept), body.ops,
                                 body.results))


def _with_body(op: Op, body: Function) -> Op:
    return replace(op, body=body)


# What moves out of a fold's body. An op that reads only the fold's constants, where it is one
# of HOISTED: a transposed constant is read strided by the body's product at every step (an
# LSTM's backward reads its Wh as Whᵀ), and once before the loop it is a copy read in place.
# And a product of a step's slice of a sequence (rows) with a constant matrix: row t·B + i of
# the product of the whole sequence is the same sum in the same order, so one product of T·B
# rows (an LSTM's xₜ @ Wx) replaces T products of B rows.
HOISTED = (Transpose,)


def hoist(fn: Function) -> Function:
    """Ops of a scan's body that read only the scan's constants, or a sequence's slice times a
    constant matrix, moved before the scan: computed once instead of at every step, with the
    same bits."""
    ops = []
    for op in fn.ops:
        if op.body is not None:
            op = _with_body(op, hoist(op.body))
        if isinstance(op.primitive, Scan):
            moved, op = _hoisted(op)
            ops.extend(moved)
        ops.append(op)
    return Function(fn.name, fn.params, tuple(ops), fn.results)


def _hoisted(op: Op) -> tuple[list[Op], Op]:
    """The ops moved out of the scan's body (on its outer values), and the scan reading their
    results as sequences and constants of its own."""
    body, a = op.body, op.attrs
    n_state, n_xs = a["n_state"], a["n_xs"]
    outer = dict(zip(body.params[n_state:], op.inputs[n_state:]))   # inside -> outside
    sequences = set(body.params[n_state:n_state + n_xs])
    constants = set(body.params[n_state + n_xs:])
    b, kept, env = Builder(), [], {}
    made: dict[str, list[Value]] = {"sequence": [], "constant": []}
    for o in body.ops:
        kind = _invariant(o, sequences, constants)
        if kind is None:
            kept.append(o)
            continue
        b.origin = o.origin
        result = b.emit(o.primitive, *(outer[v] for v in o.inputs), **o.attrs)
        env[o.outputs[0]] = inside = Value(o.outputs[0].type)
        outer[inside] = result
        made[kind].append(inside)
        (sequences if kind == "sequence" else constants).add(inside)
    if not b.ops:
        return [], op
    params = (body.params[:n_state + n_xs] + tuple(made["sequence"])
              + body.params[n_state + n_xs:] + tuple(made["constant"]))
    body = substitute(Function(body.name, params, body.ops, body.results), kept, env)
    inputs = op.inputs[:n_state] + tuple(outer[v] for v in params[n_state:])
    return b.ops, replace(op, inputs=inputs, body=body, params=tuple(
        (k, n_xs + len(made["sequence"]) if k == "n_xs" else v) for k, v in op.params))


def _invariant(op: Op, sequences: set[Value], constants: set[Value]) -> str | None:
    """"constant" where op reads only constants (and is one of HOISTED), "sequence" where it
    is a slice's rows times a constant matrix, else None."""
    if len(op.outputs) != 1 or op.body is not None:
        return None
    if isinstance(op.primitive, HOISTED) and set(op.inputs) <= constants:
        return "constant"
    if isinstance(op.primitive, MatMul):
        x, w = op.inputs
        if x in sequences and w in constants and x.type.rank in (1, 2) and w.type.rank == 2:
            return "sequence"
    return None


# What a kernel computes in one instruction an element. Such a value that the backward pass
# reads long after the forward made it (a GELU's x/2, x³ and 1 + tanh) is made again beside that
# use, from what it is made of, where those are kept for then anyway: the forward stores one
# pre-activation instead of each step of an activation, and the backward loads it once.
REMADE = (Add, Sub, Mul, Neg)
REMADE_DEPTH = 6            # the longest chain of such ops made again for one use


def rematerialize(fn: Function) -> Function:
    """fn with each use of a value of REMADE ops that lies past a contraction from where the
    value is made reading a copy made just before it, from parameters, literals and values
    kept past the last contraction before it anyway: no value lives longer, and one the copies
    replace dies sooner (the same operations on the same operands: the same bits)."""
    ops = [_with_body(op, rematerialize(op.body)) if op.body is not None else op for op in fn.ops]
    producer = {v: (i, op) for i, op in enumerate(ops) for v in op.outputs}
    last_use = {v: i for i, op in enumerate(ops) for v in op.inputs}
    last_use.update((v, len(ops)) for v in fn.results)
    contractions = list(accumulate((op.primitive.role is Role.CONTRACTION for op in ops),
                                   initial=0))       # among ops[:i]
    made: dict[Value, tuple[Value, int]] = {}        # a value -> its copy, made before op j
    out: list[Op] = []

    def far(i: int, j: int) -> bool:
        """Whether a contraction lies between ops i and j (none where i is not before j: a
        result's last use is len(ops), past every op)."""
        return i < j and contractions[j] > contractions[i + 1]

    def kept(v: Value, j: int) -> bool:
        """Whether v is at hand for op j: a parameter, a literal, or a value kept until past
        the last contraction before j anyway."""
        return (v not in producer or producer[v][1].primitive.role is Role.CONSTANT
                or v in last_use and not far(last_use[v], j))

    def remakeable(v: Value, j: int, depth: int) -> bool:
        """Whether v can be made again for op j, its operands made again or at hand. (One at
        hand only because a later use reads it is made again all the same: that use may be
        given a copy too, and the value would be kept for this one alone.)"""
        if v not in producer:
            return False
        i, op = producer[v]
        return (depth < REMADE_DEPTH and isinstance(op.primitive, REMADE) and _compiled(op)
                and far(i, j) and all(remakeable(x, j, depth + 1) or kept(x, j) for x in op.inputs))

    def copy(v: Value, j: int, depth: int) -> Value:
        if v in made and not far(made[v][1], j):
            return made[v][0]
        if not remakeable(v, j, depth):
            return v
        op = producer[v][1]
        inputs = tuple(copy(x, j, depth + 1) for x in op.inputs)
        again = replace(op, inputs=inputs, outputs=(Value(v.type),))
        out.append(again)
        made[v] = (again.outputs[0], j)
        return again.outputs[0]

    for j, op in enumerate(ops):
        # (only for an elementwise op that a kernel computes, and the copies with it: a
        # product or a host step would have a copy stored, beside the value itself)
        if op.primitive.role is Role.ELEMENTWISE and _compiled(op):
            inputs = tuple(copy(v, j, 0) for v in op.inputs)
            op = replace(op, inputs=inputs) if inputs != op.inputs else op
        out.append(op)
    return Function(fn.name, fn.params, tuple(out), fn.results)


def _compiled(op: Op) -> bool:
    """Whether a kernel computes elementwise op (bf16 runs on the host, the interpreter's)."""
    return op.primitive.compiles([v.dtype for v in op.inputs], op.outputs[0].dtype)


def _key(op: Op):
    if isinstance(op.primitive, Constant):
        a = op.attrs
        value = literal_array(a["value"], a["dtype"])
        return ("constant", a["dtype"], value.shape, value.tobytes())
    body = id(op.body) if op.body is not None else None
    return (op.primitive, tuple(v.id for v in op.inputs), op.params, body)


def cse(fn: Function) -> Function:
    """Merge ops that compute the same thing from the same values. Parameters are never
    merged, nor random draws (each draw site stays its own), nor effects."""
    seen: dict = {}
    env: dict[Value, Value] = {}
    ops = []
    for op in fn.ops:
        op = _rebuilt(op, tuple(env.get(v, v) for v in op.inputs),
                      cse(op.body) if op.body is not None else None)
        prim = op.primitive
        key = None if prim.random or prim.effect or op.body is not None else _key(op)
        if key is not None and key in seen:
            env.update(zip(op.outputs, seen[key].outputs))
            continue
        if key is not None:
            seen[key] = op
        ops.append(op)
    return substitute(fn, ops, env)


def _same(X: Value, op: Op) -> bool:
    """The result has exactly X's type (no broadcasting, no dtype change)."""
    return X.type == op.outputs[0].type


def _same_shape(X: Value, op: Op) -> bool:
    return X.shape == op.outputs[0].shape


def _same_dtype(X: Value, op: Op) -> bool:
    return X.dtype == op.outputs[0].dtype


def _inverse(X: Value, p, q) -> bool:
    """Whether transposing X by p and then by q (None: reversing the axes) gives X back."""
    n = len(X.shape)
    p, q = (perm or tuple(reversed(range(n))) for perm in (p, q))
    return tuple(p[i] for i in q) == tuple(range(n))


p, q, s = Var("p"), Var("q"), Var("s")          # static parameters: perms and shapes

SIMPLIFY = rules(
    (pat(Mul, X, Const(1.0), guard=_same), lambda X: X),
    (pat(Mul, Const(1.0), X, guard=_same), lambda X: X),
    (pat(Sub, X, Const(0.0), guard=_same), lambda X: X),
    (pat(Add, X, Const(-0.0), guard=_same), lambda X: X),       # x + 0.0 is 0.0 at x = -0.0
    (pat(Div, X, Const(1.0), guard=_same), lambda X: X),
    (pat(Reshape, X, guard=_same_shape), lambda X: X),
    (pat(BroadcastTo, X, guard=_same_shape), lambda X: X),
    (pat(Cast, X, guard=_same_dtype), lambda X: X),
    (pat(Transpose, pat(Transpose, X, perm=p), perm=q, guard=_inverse), lambda X: X),
    (pat(Reshape, pat(Reshape, X), shape=s), lambda b, X, s: b.emit(Reshape(), X, shape=s)),
    (pat(BroadcastTo, pat(BroadcastTo, X), shape=s),
     lambda b, X, s: b.emit(BroadcastTo(), X, shape=s)),
)


def _drops(i: int):
    """Whether an elementwise op of two operands or more keeps its result's shape with X, not
    its broadcast, as operand i: it broadcasts its operands itself."""
    def guard(X: Value, op: Op) -> bool:
        shapes = [v.shape for v in op.inputs]
        shapes[i] = X.shape
        return len(shapes) >= 2 and np.broadcast_shapes(*shapes) == op.outputs[0].shape
    return guard


def _operand(i: int):
    """The op again, with X as operand i."""
    return lambda b, X, op: b.emit(op.primitive, *op.inputs[:i], X, *op.inputs[i + 1:], **op.attrs)


# elementwise ops take three operands at most (where, clip)
IMPLICIT_BROADCAST = rules(
    (pat(Elementwise, pat(BroadcastTo, X), ..., guard=_drops(0)), _operand(0)),
    (pat(Elementwise, _, pat(BroadcastTo, X), ..., guard=_drops(1)), _operand(1)),
    (pat(Elementwise, _, _, pat(BroadcastTo, X), guard=_drops(2)), _operand(2)),
)


def simplify(fn: Function) -> Function:
    """Algebraic identities (x * 1, x - 0, reshape to the same shape, transpose pairs, …),
    reshape of reshape / broadcast of broadcast collapsed to one op, and the broadcast_to
    operands an elementwise op broadcasts itself dropped."""
    return _rewritten(fn, _simplified)


def _simplified(op: Op, producer: dict[Value, Op], b: Builder) -> Value | None:
    """The value op becomes by the first SIMPLIFY rule that matches, or else without every
    broadcast_to operand it can do without, left to right (an IMPLICIT_BROADCAST rule drops one)."""
    value = rewrite(SIMPLIFY, op, producer, b)
    if value is not None:
        return value
    while (step := rewrite(IMPLICIT_BROADCAST, op, producer, trial := Builder())) is not None:
        (op,), value = trial.ops, step
    if value is not None:
        b.add(op)
    return value


def fold_constants(fn: Function) -> Function:
    """Evaluate ops whose inputs are all constants (small results only; never random draws
    nor effects, which happen when the program runs). zeros, ones and full stay as they are:
    as literals they were their every element (2,048 zeros in `dslc ir` for zeros([32, 64])),
    and a literal at one batch size but not at a larger one made the code differ by size."""
    constant: dict[Value, np.ndarray] = {}
    ops = []
    for op in fn.ops:
        if isinstance(op.primitive, Constant) or (isinstance(op.primitive, Filled) and _small(op)):
            constant[op.outputs[0]] = interp.evaluate(op, [])[0]
        elif (op.body is None and not op.primitive.random and not op.primitive.effect and len(op.outputs) == 1
              and all(v in constant for v in op.inputs) and not op.outputs[0].is_key
              and _small(op)):   # (a literal has no empty shape)
            value = interp.evaluate(op, [constant[v] for v in op.inputs])[0]
            constant[op.outputs[0]] = value
            op = Op(Constant(), (), (("dtype", op.outputs[0].dtype), ("value", _literal(value))), op.outputs)
        ops.append(op)
    return Function(fn.name, fn.params, tuple(ops), fn.results)


def _small(op: Op) -> bool:
    """Whether op's first result has at least one element and at most FOLD_LIMIT."""
    return 0 < math.prod(op.outputs[0].shape) <= FOLD_LIMIT


def _literal(a: np.ndarray):
    """a as nested tuples of Python scalars (tolist converts in C what item() per element did)."""
    x = a.tolist()
    return _tuples(x) if type(x) is list else x


def _tuples(x: list) -> tuple:
    """(A row of scalars made a tuple at once: a call for each element was 4 ms of the GPT
    loss's optimisation, its causal mask.)"""
    return tuple(map(_tuples, x)) if x and type(x[0]) is list else tuple(x)


def optimize(fn: Function) -> Function:
    """The passes to a fixed point (op count stops falling)."""
    return _fixed_point(fn, lambda f: dce(cse(simplify(fold_constants(f)))))


def tidy(fn: Function) -> Function:
    """optimize without constant folding: a folded constant holds the sizes it was folded at
    (arange(B) * C as [0, 3, 6]), which a program printed generic in its sizes must not."""
    return _fixed_point(fn, lambda f: dce(cse(simplify(f))))


def _fixed_point(fn: Function, step: Callable[[Function], Function]) -> Function:
    while True:
        before = _size(fn)
        fn = step(fn)
        if _size(fn) >= before:
            return fn


def _size(fn: Function) -> int:
    return sum(1 + (_size(op.body) if op.body is not None else 0) for op in fn.ops)


def for_backends(fn: Function) -> Function:
    """fn in the form the backends schedule, to the bit the same: two-operand einsums that are
    batched matrix products (`bhtd,bhsd->bhts`) as transposes, reshapes and one `matmul` (both
    accumulate over the contracted letters in row-major order of their first appearance, with
    fma; integers are exact in any order), which the contraction kernels compile; one_hot as
    the comparison it is, which fuses into the kernel that uses it; reductions as the kernels
    reduce them (any and all of a tensor that is not bool as those of its cast to bool; over
    axes that are not adjacent, over one axis of a transposed copy); what a fold computes
    alike at every step before it (hoist: after differentiation, which would differentiate the
    hoisted product otherwise); and cheap values that the backward pass reads made again there
    (rematerialize)."""
    plans = {Einsum(): _matmul_plan, OneHot(): _one_hot_plan,
             **{prim(): _reduction_plan for prim in (Sum, Prod, Mean, Max, Min, AnyTrue, AllTrue)}}

    def planned(op: Op, producer: dict[Value, Op], b: Builder) -> Value | None:
        plan = plans[op.primitive](op) if op.primitive in plans else None
        return plan(b) if plan is not None else None

    return dce(rematerialize(hoist(_rewritten(fn, planned))))


def products_as_sums(fn: Function, dtypes: tuple[str, ...]) -> Function:
    """fn (and its bodies) with each `@` of these dtypes (integers: exact, and wrapping as
    NumPy's, in any order) written as what it computes, sum(a[…, m, 1, k] · bᵀ[…, 1, n, k],
    axis=-1): where a backend reduces them in kernels, the product fuses into the sum's loads
    and nothing of size m·n·k is stored."""

    def planned(op: Op, producer: dict[Value, Op], b: Builder) -> Value | None:
        if not isinstance(op.primitive, MatMul) or op.outputs[0].dtype not in dtypes:
            return None
        (a, w), (out,) = op.inputs, op.outputs
        # (each operand reshaped first, then transposed: views of the operands, where a
        # reshape of a transpose would be a copy)
        rows = b.emit("reshape", a, shape=(a.shape[:-1] or (1,)) + (1, a.shape[-1]))   # …m 1 k
        k_n = w.shape[-2:] if len(w.shape) > 1 else w.shape + (1,)
        w = b.emit("reshape", w, shape=w.shape[:-2] + (1,) + k_n)                        # …1 k n
        rank = len(w.shape)
        columns = b.emit("transpose", w, perm=tuple(range(rank - 2)) + (rank - 1, rank - 2))
        total = b.emit("sum", b.emit("mul", rows, columns), axis=-1)
        return total if total.shape == out.shape else b.emit("reshape", total, shape=out.shape)

    return _rewritten(fn, planned)


def _rewritten(fn: Function,
               rewrite_op: Callable[[Op, dict[Value, Op], Builder], Value | None]) -> Function:
    """fn (and its bodies) with each op for which rewrite_op(op, producer of each value so far,
    b) gives a value replaced by it and the ops it emitted into b."""
    producer: dict[Value, Op] = {}
    env: dict[Value, Value] = {}
    ops = []
    for op in fn.ops:
        op = _rebuilt(op, tuple(env.get(v, v) for v in op.inputs),
                      _rewritten(op.body, rewrite_op) if op.body is not None else None)
        b = Builder()
        value = rewrite_op(op, producer, b)
        if value is not None:
            env[op.outputs[0]] = value
        made = [op] if value is None else b.ops
        ops.extend(made)
        producer.update((v, o) for o in made for v in o.outputs)
    if not env and all(a is b for a, b in zip(ops, fn.ops)) and len(ops) == len(fn.ops):
        return fn
    return substitute(fn, ops, env)


def _rebuilt(op: Op, inputs: tuple[Value, ...], body: Function | None) -> Op:
    """op with these inputs and body; op itself where they are its own (a pass that leaves
    an op alone keeps the object, which a cache entry then holds once)."""
    if inputs == op.inputs and body is op.body:
        return op
    return replace(op, inputs=inputs, body=body)


def _one_hot_plan(op: Op):
    """one_hot(i, n) as cast(expand_dims(i, -1) == arange(n)): what its definition computes."""
    (indices,), (out,) = op.inputs, op.outputs
    n = out.shape[-1]

    def build(b):
        positions = b.emit("arange", start=n, dtype=indices.dtype)
        hit = b.emit("eq", b.emit("expand_dims", indices, axis=-1), positions)
        return b.emit("cast", hit, dtype=out.dtype)

    return build


def _reduction_plan(op: Op):
    """A reduction as the kernels reduce it: any or all of a tensor that is not bool as the
    same of cast(x, bool) (x != 0, NaN included), a max or min; over axes that are not
    adjacent, over the last axis of x transposed to put them last, in order, and flattened
    into one, which is how the canonical order is defined (ir/numerics.py): the same bits."""
    (x,), (out,) = op.inputs, op.outputs
    attrs = statics(op)
    axes = normalize_axes(attrs["axis"], len(x.shape), "x")
    cast = isinstance(op.primitive, (AnyTrue, AllTrue)) and x.dtype != "bool"
    spread = len(axes) > 1 and axes != tuple(range(axes[0], axes[-1] + 1))
    if not cast and not spread:
        return None

    def build(b: Builder) -> Value:
        v = b.emit("cast", x, dtype="bool") if cast else x
        if not spread:
            return b.emit(op.primitive.name, v, **attrs)
        kept = [i for i in range(len(x.shape)) if i not in axes]
        v = b.emit("transpose", v, perm=tuple(kept + list(axes)))
        v = b.emit("reshape", v, shape=tuple(x.shape[i] for i in kept) +
                   (math.prod(x.shape[i] for i in axes),))
        v = b.emit(op.primitive.name, v, axis=-1)
        return b.emit("reshape", v, shape=out.shape) if v.shape != out.shape else v

    return build


def _matmul_plan(op: Op):
    spec = op.attrs["spec"].replace(" ", "")
    if "->" not in spec or len(op.inputs) != 2:
        return None
    lhs, out = spec.split("->")
    ta, tb = lhs.split(",")
    a, b = op.inputs
    if len(set(ta)) != len(ta) or len(set(tb)) != len(tb) or a.dtype not in ("f32", "f64", "f16",
                                                                              *INT_DTYPES):
        return None
    batch = [c for c in out if c in ta and c in tb]
    m = [c for c in out if c in ta and c not in tb]
    n = [c for c in out if c in tb and c not in ta]
    k = list(dict.fromkeys(c for c in lhs if c.isalpha() and c not in out))
    if any(c not in ta or c not in tb for c in k) or len(batch) + len(m) + len(n) != len(out):
        return None
    if [c for c in out if c not in batch] == n + m:
        # b's letters lead the result's rows (`bhtd,bhts->bhsd`, attention's dV): the product
        # of b and a writes them in place, where a's and b's would be transposed after (and
        # read so by whatever reads it). Each element's sum is the same: fma(x, y) = fma(y, x)
        a, b, ta, tb, m, n = b, a, tb, ta, n, m
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
