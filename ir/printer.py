"""Two printers of the tensor IR: `to_text`, the IR as the compiler sees it, and `to_bend`, the
IR written back as .bend source that `dslc check` accepts and that computes the same values,
bit for bit.

`to_text` numbers values %0, %1, … in the order they are defined (a scan's or checkpoint's
body right after its op's outputs), never by their global ids: equal functions print equally.

`to_bend` conventions:

- Names. Flat parameters are a0, a1, …; every other value is named after the primitive that
  makes it and the number `to_text` gives it, so `tanh_7` is %7. A scan's states are carry_N,
  its stacked emits ys_N, a checkpoint's results checkpoint_N; a body's parameters that receive
  captured values go by the outer names. With a signature, a flat parameter whose binding is a
  name goes by it, and one bound to an expression is assigned first (`p_W1 = p.W1`). A name that
  would clash with a keyword, a built-in or a name of the caller's text gets a trailing `_`.
- One statement per op: operators for the primitives of `BINARY_OPERATORS`/`UNARY_OPERATORS`
  (`add_4 = a0 + a1`); other primitives by their surface name, required parameters positional
  and the others as keywords, left out at their default (`sum(x, axis=(0, 2), keepdims=True)`);
  `index` as `x[1, 2:5, ..., ::2]`; several results by destructuring (`a, b = split(x, 2)`).
- Constants: `full(shape, v, dtype=D)` when every element is the same (scalars included),
  `ones(shape, dtype=D) * [..]` otherwise (a literal takes the dtype of the tensor it meets,
  so each number is rounded once, to D, as the IR does; `1 * x` is `x` for every x), and
  `cast([1, 0, ..], bool)` for bools. Floats are printed by `repr` (exact round trip),
  infinities as `1e999` (which parses to inf), NaN as `abs(1e999 - 1e999)` (evaluated
  statically; `abs` makes its sign positive on every platform) and -NaN with a `-` before.
- `scan` is a `fold`: over its sequence (`flip(xs, axis=0)` when reversed) when it has one;
  otherwise over `arange(length)` (counting down when reversed), each sequence indexed by the
  step. States are the `with` variables; the body ends by assigning them (in one parallel
  assignment) and returning the emitted values; reversed emits are flipped back.
- `checkpoint` is a local def and `checkpoint(f)(args…)`.
- `unindex` (IR only: the transpose of `index`, made by gradients) is written with
  `expand_dims`, `take` and `where`, which copy values and so keep every bit (`unindex_steps`).
- `result` (optional) is a `str.format` template applied to the flat results' names:
  `{0}`, `{1}`, … stand for them in order and literal braces are doubled, as in
  "Params {{ W1: {0}, b1: {1} }}". With `result` given, `returns` defaults to no annotation.

A primitive with no surface name, no operator and no spelling here raises
ValueError("'prim' has no .bend spelling"); `UNPRINTABLE` lists those known to be so.
"""
from __future__ import annotations

import json
import math
import re
import struct
from types import EllipsisType
from typing import Any, Callable, Iterable

import numpy as np

from frontend.builtins import BUILTIN_TYPES, SPECIAL_FORMS
from ir import ops
from ir.core import Function, Op, Value, bind_inputs
from ir.dims import Dim
from ir.ops.base import SURFACE, Kind, np_dtype
from ir.ops.shape import SliceSpec

KEYWORDS = frozenset("def type object return if elif else switch case match fold bend when fork "
                     "with in from import as lambda use assert and or not True False".split())

OPERATORS = {prim: symbol for symbol, prim in ops.BINARY_OPERATORS.items()}
PREFIX_OPERATORS = {prim: symbol for symbol, prim in ops.UNARY_OPERATORS.items()}

# Primitives known to have no .bend spelling, with the reason (none at present).
UNPRINTABLE: dict[str, str] = {}

# Primitives whose result is a tuple or a list, even of one element: always destructured.
STRUCTURED_RESULTS = frozenset({"split", "key_split"})


# ---------------------------------------------------------------- numbering, shared by both

def numbering(fn: Function) -> dict[Value, int]:
    """Each value's number: parameters, then each op's outputs followed by its body's values."""
    number: dict[Value, int] = {}

    def walk(f: Function) -> None:
        for v in f.params:
            number.setdefault(v, len(number))
        for op in f.ops:
            for v in op.outputs:
                number.setdefault(v, len(number))
            if op.body is not None:
                walk(op.body)

    walk(fn)
    return number


# ---------------------------------------------------------------- to_text

def to_text(fn: Function) -> str:
    """The IR as text: `%7: f32[4, 3] = tanh(%5)`, bodies indented under their op."""
    lines: list[str] = []
    _text_function(fn, numbering(fn), lines, 0)
    return "\n".join(lines) + "\n"


def _text_function(fn: Function, number: dict[Value, int], lines: list[str], depth: int) -> None:
    ref = lambda v: f"%{number[v]}"
    params = ", ".join(f"{ref(p)}: {p.type}" for p in fn.params)
    lines.append(f"{'  ' * depth}def {fn.name}({params}) -> ({', '.join(map(ref, fn.results))}):")
    for op in fn.ops:
        lines.append("  " * (depth + 1) + _text_op(op, ref))
        if op.body is not None:
            _text_function(op.body, number, lines, depth + 2)


def _text_op(op: Op, ref: Callable[[Value], str]) -> str:
    kinds = {p.name: p.kind for p in op.primitive.params}
    params = ", ".join(f"{k}={_text_static(v, kinds.get(k))}" for k, v in op.params)
    args = "; ".join(part for part in (", ".join(map(ref, op.inputs)), params) if part)
    outputs = ", ".join(f"{ref(v)}: {v.type}" for v in op.outputs)
    return f"{outputs + ' = ' if outputs else ''}{op.primitive.name}({args})"


def _text_static(v: Any, kind: Kind | None) -> str:
    if isinstance(v, tuple):
        return "(" + ", ".join(_text_static(i, None) for i in v) + ("," if len(v) == 1 else "") + ")"
    if v is Ellipsis:
        return "..."
    if isinstance(v, (SliceSpec, Dim)) or kind is Kind.DTYPE:
        return str(v)
    return repr(v)


# ---------------------------------------------------------------- spelling values

def number_text(x: Any) -> str:
    """A number as a .bend expression of exactly its value: ints as they are, floats by repr,
    inf as 1e999, NaN as abs(1e999 - 1e999) (its sign kept; other NaN payloads raise)."""
    if isinstance(x, (bool, np.bool_)):
        return str(int(x))
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    x = float(x)
    sign = "-" if math.copysign(1.0, x) < 0 else ""
    if math.isnan(x):
        bits = struct.unpack("<Q", struct.pack("<d", x))[0] & ~(1 << 63)
        if bits != 0x7FF8000000000000:
            raise ValueError(f"a NaN with payload {bits:#x} has no .bend spelling")
        return f"{sign}abs(1e999 - 1e999)"
    if math.isinf(x):
        return f"{sign}1e999"
    return repr(x)


def _nested(texts: list[str], shape: tuple[int, ...]) -> str:
    """Flat element texts as a nested list literal of the given shape."""
    if not shape:
        return texts[0]
    step = len(texts) // shape[0]
    return "[" + ", ".join(_nested(texts[i * step:(i + 1) * step], shape[1:])
                           for i in range(shape[0])) + "]"


def _stored(value: Any, dtype: str) -> np.ndarray:
    """The numbers a constant holds, as the IR stores them (bf16, which NumPy lacks, as given)."""
    if dtype == "bf16":
        return np.asarray(value, dtype=np.float64)
    return np.asarray(value, dtype=np_dtype(dtype))


def constant_text(value: Any, dtype: str) -> str:
    """An expression that makes exactly this constant (see the module's conventions)."""
    array = _stored(value, dtype)
    shape = list(array.shape)
    if array.size == 0:
        return f"zeros({shape}, dtype={dtype})"
    float_kind = dtype in ("f32", "f16", "bf16", "f64")
    texts = [number_text(float(x) if float_kind else x) for x in array.flat]
    if len(set(texts)) == 1:
        return f"full({shape}, {texts[0]}, dtype={dtype})"
    literal = _nested(texts, array.shape)
    if dtype == "bool":
        return f"cast({literal}, bool)"
    return f"ones({shape}, dtype={dtype}) * {literal}"


def _tuple_text(items: tuple) -> str:
    return "(" + ", ".join(map(str, items)) + ("," if len(items) == 1 else "") + ")"


def _list_text(items: tuple) -> str:
    return "[" + ", ".join(map(str, items)) + "]"


def static_text(kind: Kind, value: Any, prim: str) -> str:
    """A static parameter of a primitive as the checker reads that kind of argument."""
    match kind:
        case Kind.SHAPE | Kind.INTS:
            return _list_text(_plain(value))
        case Kind.AXES if isinstance(value, tuple):
            return _tuple_text(value)
        case Kind.AXES | Kind.DIM | Kind.INT if isinstance(_plain(value), int):
            return str(_plain(value))
        case Kind.BOOL:
            return str(bool(value))
        case Kind.NUMBER:
            return number_text(value)
        case Kind.DTYPE:
            return value
        case Kind.STR:
            return json.dumps(value)
        case Kind.STATIC if isinstance(value, int):
            return str(value)
        case Kind.STATIC if isinstance(value, tuple) and all(isinstance(i, int) for i in value):
            return _list_text(value)
    raise ValueError(f"'{prim}': cannot spell the static parameter {value!r} ({kind.value})")


def _plain(x: Any) -> Any:
    """Dims as ints, in tuples too."""
    if isinstance(x, Dim):
        return x.value
    if isinstance(x, tuple):
        return tuple(map(_plain, x))
    return x


def _is_default(value: Any, default: Any) -> bool:
    """Equal, and of the same type (pad's value -0.0 is not its default 0)."""
    a, b = _plain(value), _plain(default)
    return type(a) is type(b) and repr(a) == repr(b)


def _index_item(item: int | SliceSpec | EllipsisType) -> str:
    return "..." if item is Ellipsis else str(item)


# ---------------------------------------------------------------- to_bend

def to_bend(fn: Function, name: str, signature: str | None = None,
            bindings: list[str] | None = None, result: str | None = None,
            returns: str | None = None, reserved: Iterable[str] = ()) -> str:
    """fn as a .bend def NAME; see the module docstring for the conventions.

    signature: the text between the parentheses (default: flat parameters a0: f32[…], …);
    bindings[i]: the expression parameter i stands for, given with signature;
    result: a str.format template over the results' names; returns: the return annotation;
    reserved: names no value may take (the dimensions of a program printed generic)."""
    if not name.isidentifier() or name in KEYWORDS:
        raise ValueError(f"'{name}' cannot name a .bend function")
    if (signature is None) != (bindings is None):
        raise ValueError("signature and bindings go together")
    if bindings is not None and len(bindings) != len(fn.params):
        raise ValueError(f"{fn.name} has {len(fn.params)} parameters but {len(bindings)} bindings "
                         "were given")
    texts = [t for t in (signature, result, returns, *(bindings or ())) if t]
    w = _Writer(fn, {name, *reserved} | {n for t in texts for n in re.findall(r"[A-Za-z_]\w*", t)})
    env: dict[Value, str] = {}
    if bindings is None:
        signature = ", ".join(f"{w.define(p, 'a', sep='')}: {p.type}" for p in fn.params)
    else:
        for p, expr in zip(fn.params, bindings):
            w.bind_param(p, expr, env)
    for op in fn.ops:
        w.op(op, env, 1)
    names = [w.ref(v, env) for v in fn.results]
    value = result.format(*names) if result is not None else (
        names[0] if len(names) == 1 else _tuple_text(tuple(names)) if names else "()")
    w.line(1, f"return {value}")
    if returns is None and result is None:
        types = [str(v.type) for v in fn.results]
        returns = types[0] if len(types) == 1 else "(" + ", ".join(types) + ")"
    arrow = f" -> {returns}" if returns is not None else ""
    return "\n".join([f"def {name}({signature}){arrow}:", *w.lines]) + "\n"


def reserved_names() -> frozenset[str]:
    """Names a printed value must not take: keywords, built-in names, primitives' surface names."""
    return KEYWORDS | set(SPECIAL_FORMS) | set(BUILTIN_TYPES) | set(SURFACE)


class _Writer:
    """Writes ops as .bend statements. `env` maps values to the names they go by in the current
    scope (parameters, a body's parameters); other values keep the name made when defined."""

    def __init__(self, fn: Function, reserved: set[str]):
        self.number = numbering(fn)
        self.taken = set(reserved) | reserved_names()
        self.names: dict[Value, str] = {}
        self.lines: list[str] = []

    # ------------------------------------------------------------ names

    def claim(self, name: str) -> str:
        while name in self.taken:
            name += "_"
        self.taken.add(name)
        return name

    def define(self, v: Value, base: str, sep: str = "_") -> str:
        """The name of a value defined here, made from base and its number once."""
        if v not in self.names:
            self.names[v] = self.claim(f"{base}{sep}{self.number[v]}")
        return self.names[v]

    def ref(self, v: Value, env: dict[Value, str]) -> str:
        name = env.get(v, self.names.get(v))
        if name is None:
            raise ValueError(f"%{self.number.get(v, '?')} is used before it is defined")
        return name

    def bind_param(self, p: Value, expr: str, env: dict[Value, str]) -> None:
        """A flat parameter standing for an expression of the signature (`p.W1`)."""
        if expr.isidentifier():
            env[p] = expr
        else:
            env[p] = self.claim(re.sub(r"\W+", "_", expr).strip("_") or "arg")
            self.line(1, f"{env[p]} = {expr}")

    def line(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    def assign(self, depth: int, op: Op, targets: list[str], expr: str) -> None:
        structured = len(targets) != 1 or op.primitive.name in STRUCTURED_RESULTS
        lhs = ", ".join(targets) + ("," if structured and len(targets) == 1 else "")
        self.line(depth, f"{lhs} = {expr}")

    # ------------------------------------------------------------ ops

    def op(self, op: Op, env: dict[Value, str], depth: int) -> None:
        statement = STATEMENTS.get(op.primitive.name)
        if statement is not None:
            statement(self, op, env, depth)
            return
        expr = self.expression(op, env)
        self.assign(depth, op, [self.define(v, op.primitive.name) for v in op.outputs], expr)

    def expression(self, op: Op, env: dict[Value, str]) -> str:
        args = [self.ref(v, env) for v in op.inputs]
        if op.primitive.name in OPERATORS:
            return f" {OPERATORS[op.primitive.name]} ".join(args)
        if op.primitive.name in PREFIX_OPERATORS:
            return PREFIX_OPERATORS[op.primitive.name] + args[0]
        if op.primitive.name in EXPRESSIONS:
            return EXPRESSIONS[op.primitive.name](op, args)
        if op.primitive.surface:
            return self.call(op, env)
        raise ValueError(f"'{op.primitive.name}' has no .bend spelling")

    def call(self, op: Op, env: dict[Value, str]) -> str:
        """surface(required…, optional=…): positional while every earlier parameter was."""
        prim = op.primitive
        bound = bind_inputs(prim, op.inputs, op.attrs)
        args, positional = [], True
        for p in prim.params:
            if p.name not in bound:
                positional = False
                continue
            value = bound[p.name]
            if p.variadic:
                args += [self.ref(v, env) for v in value]
                continue
            if p.kind in (Kind.TENSOR, Kind.KEY):
                text = self.ref(value, env)
            elif p.kind is Kind.TENSORS:
                text = _list_text(tuple(self.ref(v, env) for v in value))
            elif not p.required and _is_default(value, p.default):
                positional = False
                continue
            else:
                text = static_text(p.kind, value, op.primitive.name)
            positional = positional and p.required
            args.append(text if positional else f"{p.name}={text}")
        return f"{prim.surface}({', '.join(args)})"

    # ------------------------------------------------------------ structured ops

    def scan(self, op: Op, env: dict[Value, str], depth: int) -> None:
        """A scan as a fold (see the module docstring)."""
        n_state, n_xs = op.attrs["n_state"], op.attrs["n_xs"]
        reverse = op.attrs.get("reverse", False)
        if not op.outputs:
            return
        body = op.body
        carry = [self.define(v, "carry") for v in op.outputs[:n_state]]
        emits = [self.define(v, "ys") for v in op.outputs[n_state:]]
        targets = [self.claim(f"reversed_{self.number[v]}") for v in op.outputs[n_state:]] \
            if reverse else emits
        inner = dict(env)
        inner.update(zip(body.params[:n_state], carry))
        inner.update((p, self.ref(c, env)) for p, c in
                     zip(body.params[n_state + n_xs:], op.inputs[n_state + n_xs:]))
        var, seq, picks = self.walk(op, env, inner)
        init = ", ".join(f"{c} = {self.ref(s, env)}" for c, s in zip(carry, op.inputs))
        head = f"{', '.join(targets)} = " if targets else ""
        self.line(depth, f"{head}fold {var} in {seq}{' with ' + init if init else ''}:")
        for name, expr in picks:
            self.line(depth + 1, f"{name} = {expr}")
        for inner_op in body.ops:
            self.op(inner_op, inner, depth + 1)
        self.end_step(body, n_state, carry, inner, depth + 1)
        for target, emit in zip(targets, emits) if reverse else ():
            self.line(depth, f"{emit} = flip({target}, axis=0)")

    def walk(self, op: Op, env: dict[Value, str],
             inner: dict[Value, str]) -> tuple[str, str, list[tuple[str, str]]]:
        """What a scan's fold walks: (its variable, the sequence, the element of each scanned
        sequence the body reads). One sequence is walked itself, flipped when reversed; any
        other number of them is indexed by a step counting over arange(length)."""
        a = op.attrs
        n_state, n_xs, length = a["n_state"], a["n_xs"], a["length"]
        xs, x_params = op.inputs[n_state:n_state + n_xs], op.body.params[n_state:n_state + n_xs]
        if n_xs == 1:
            inner[x_params[0]] = self.define(x_params[0], "x")
            seq = self.ref(xs[0], env)
            return inner[x_params[0]], f"flip({seq}, axis=0)" if a.get("reverse") else seq, []
        step = self.claim(f"step_{self.number[op.outputs[0]]}")
        seq = f"arange({length - 1}, -1, step=-1)" if a.get("reverse") else f"arange({length})"
        picks = []
        for p, x in zip(x_params, xs):
            inner[p] = self.define(p, "x")
            picks.append((inner[p], f"{self.ref(x, env)}[{step}]"))
        return step, seq, picks

    def end_step(self, body: Function, n_state: int, carry: list[str], inner: dict[Value, str],
                 depth: int) -> None:
        """A fold body's last lines: the new state, then the emitted values. An emitted
        incoming state is copied first, since the state assignment overwrites its name."""
        new_state = [self.ref(v, inner) for v in body.results[:n_state]]
        emitted = [self.ref(v, inner) for v in body.results[n_state:]]
        for i, name in enumerate(emitted):
            if name in carry:
                emitted[i] = self.claim(f"incoming_{name}")
                self.line(depth, f"{emitted[i]} = {name}")
        if carry:
            self.line(depth, f"{', '.join(carry)} = {', '.join(new_state)}")
        if emitted:
            self.line(depth, "return " + (emitted[0] if len(emitted) == 1 else
                                          "(" + ", ".join(emitted) + ")"))

    def checkpoint(self, op: Op, env: dict[Value, str], depth: int) -> None:
        """A checkpoint as a local def called through checkpoint(f)."""
        if not op.outputs:
            return
        body = op.body
        f = self.claim(f"checkpointed_{self.number[op.outputs[0]]}")
        params = [self.define(p, "arg") for p in body.params]
        self.line(depth, f"def {f}({', '.join(params)}):")
        inner = dict(env)
        for inner_op in body.ops:
            self.op(inner_op, inner, depth + 1)
        self.line(depth + 1, "return " + ", ".join(self.ref(v, inner) for v in body.results))
        args = ", ".join(self.ref(v, env) for v in op.inputs)
        self.assign(depth, op, [self.define(v, "checkpoint") for v in op.outputs],
                    f"checkpoint({f})({args})")

    def unindex(self, op: Op, env: dict[Value, str], depth: int) -> None:
        """unindex as the statements of `unindex_steps`, the last one naming the result."""
        (out,) = op.outputs
        name = self.define(out, op.primitive.name)
        steps = unindex_steps(op.attrs["items"], tuple(op.attrs["shape"]), out.dtype)
        current = self.ref(op.inputs[0], env)
        for k, step in enumerate(steps):
            target = name if k == len(steps) - 1 else self.claim(f"{name}_{k + 1}")
            self.line(depth, f"{target} = {step.format(current)}")
            current = target
        if not steps:
            self.line(depth, f"{name} = {current}")


def unindex_steps(items: tuple, shape: tuple[int, ...], dtype: str) -> list[str]:
    """unindex(x, items, shape), zeros of `shape` holding x where x[items] reads, as surface
    expressions each applied to the previous one (`{}`): expand_dims puts back the axes of
    the int items; then along each sliced axis a gather (take) moves every element of x to
    its position and `where` zeroes the positions the slice skips. Both copy: bit-exact."""
    per_axis = _per_axis(items, len(shape))
    picked = [[range(n)[it]] if isinstance(it, int) else
              list(range(n)[slice(_plain(it.lo), _plain(it.hi), it.step)])
              for it, n in zip(per_axis, shape)]
    if any(not positions for positions in picked):
        return [f"zeros({list(shape)}, dtype={dtype})"]
    ints = tuple(i for i, it in enumerate(per_axis) if not isinstance(it, SliceSpec))
    steps = [f"expand_dims({{}}, {_tuple_text(ints)})"] if ints else []
    for axis, (positions, n) in enumerate(zip(picked, shape)):
        if positions == list(range(n)):
            continue
        where = {j: k for k, j in enumerate(positions)}       # (a list's index() is O(n))
        source = tuple(where.get(j, 0) for j in range(n))
        mask = np.array([j in where for j in range(n)]).reshape(
            [n if i == axis else 1 for i in range(len(shape))])
        steps.append(f"take({{}}, {_list_text(source)}, axis={axis})")
        steps.append(f"where({constant_text(mask, 'bool')}, {{}}, zeros([], dtype={dtype}))")
    return steps


def _per_axis(items: tuple, rank: int) -> list:
    """An index's items, one per axis: the Ellipsis expanded, trailing axes taken whole."""
    at = items.index(Ellipsis) if Ellipsis in items else len(items)
    named = len(items) - (at < len(items))
    return list(items[:at]) + [SliceSpec()] * (rank - named) + list(items[at + 1:])


def _index_expression(op: Op, args: list[str]) -> str:
    items = op.attrs["items"]
    return f"{args[0]}[{', '.join(map(_index_item, items)) or '...'}]"


def _constant_expression(op: Op, args: list[str]) -> str:
    return constant_text(op.attrs["value"], op.attrs["dtype"])


def _tanh_grad_expression(op: Op, args: list[str]) -> str:
    y, ct = args
    return f"{ct} * (1.0 - {y} * {y})"          # the same operations, in the same order


def _sigmoid_grad_expression(op: Op, args: list[str]) -> str:
    y, ct = args
    return f"{ct} * {y} * (1.0 - {y})"


# IR primitives without a surface call of their own, spelled as an expression …
EXPRESSIONS: dict[str, Callable[[Op, list[str]], str]] = {
    "index": _index_expression,
    "constant": _constant_expression,
    "tanh_grad": _tanh_grad_expression,
    "sigmoid_grad": _sigmoid_grad_expression,
}
# … or as statements.
STATEMENTS: dict[str, Callable[[_Writer, Op, dict, int], None]] = {
    "scan": _Writer.scan,
    "checkpoint": _Writer.checkpoint,
    "unindex": _Writer.unindex,
}


def printable(prim: str) -> bool:
    """Whether to_bend has a spelling for the primitive."""
    p = ops.REGISTRY.get(prim)
    return (prim in OPERATORS or prim in PREFIX_OPERATORS or prim in EXPRESSIONS
            or prim in STATEMENTS or (p is not None and p.surface is not None))
