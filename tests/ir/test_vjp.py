"""The VJP rule of every differentiable primitive, checked on small programs
`sum(prim(args…) * w)` against float64 central finite differences and against PyTorch autograd;
grad of grad against PyTorch's double backward."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pytest

from ir.ad import grad_function, inline
from ir.core import Builder, Function, tensor_type
from ir.interp import run
from ir.ops import REGISTRY, SliceSpec
from ir.ops.base import Primitive, Role, np_dtype

torch = pytest.importorskip("torch")
F = torch.nn.functional

DSL_DTYPE = {np.dtype(np.float64): "f64", np.dtype(np.float32): "f32",
             np.dtype(np.int32): "i32", np.dtype(np.bool_): "bool"}

rng = np.random.default_rng(20240611)


def normal(*shape: int) -> np.ndarray:
    return np.asarray(rng.standard_normal(shape))


def positive(*shape: int) -> np.ndarray:
    return np.asarray(rng.uniform(0.5, 2.0, shape))


def nonzero(*shape: int) -> np.ndarray:
    return np.asarray(positive(*shape) * rng.choice([-1.0, 1.0], shape))


def tied(*shape: int) -> np.ndarray:
    """Floats from {-1, 0, 1}: many ties."""
    return np.asarray(rng.integers(-1, 2, shape).astype(np.float64))


def ints(*values: Any) -> np.ndarray:
    return np.array(values, dtype=np.int32)


@dataclass
class Case:
    prim: str
    args: list[np.ndarray]
    torch_fn: Callable[..., Any]          # the same function of torch tensors
    static: dict[str, Any] = field(default_factory=dict)
    wrt: tuple[int, ...] | None = None    # None: every float argument
    smooth: bool = True                   # no kink, tie or jump nearby: finite differences apply
    outputs: tuple[int, ...] | None = None  # the results the loss uses (None: all)

    @property
    def wrt_(self) -> list[int]:
        if self.wrt is not None:
            return list(self.wrt)
        return [i for i, a in enumerate(self.args) if a.dtype.kind == "f"]


def program(case: Case) -> Function:
    """(args…, weights…) -> sum over used results r of sum(r * weight)."""
    b = Builder(case.prim)
    params = [b.param(tensor_type(DSL_DTYPE[a.dtype], a.shape)) for a in case.args]
    out = b.emit(case.prim, *params, **case.static)
    outs = out if isinstance(out, tuple) else (out,)
    used = [outs[i] for i in (case.outputs or range(len(outs)))]
    terms = [b.emit("sum", b.emit("mul", o, b.param(o.type))) for o in used]
    return b.finish([functools.reduce(lambda s, t: b.emit("add", s, t), terms)])


def weights(f: Function, case: Case) -> list[np.ndarray]:
    w_rng = np.random.default_rng(7)
    return [w_rng.standard_normal(p.shape).astype(np_dtype(p.dtype))
            for p in f.params[len(case.args):]]


def ir_grads(case: Case) -> tuple[list[np.ndarray], Function]:
    f = program(case)
    g = grad_function(f, wrt=case.wrt_)
    return run(g, list(case.args) + weights(f, case)), g


def to_torch(a: np.ndarray, grad: bool) -> Any:
    t = torch.from_numpy(a.astype(np.int64) if a.dtype.kind == "i" else a.copy())
    return t.requires_grad_(grad)


def torch_grads(case: Case) -> list[np.ndarray]:
    wrt = case.wrt_
    ts = [to_torch(a, i in wrt) for i, a in enumerate(case.args)]
    out = case.torch_fn(*ts)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    used = [outs[i] for i in (case.outputs or range(len(outs)))]
    loss = sum((o * torch.from_numpy(w)).sum() for o, w in zip(used, weights(program(case), case)))
    grads = torch.autograd.grad(loss, [ts[i] for i in wrt], allow_unused=True)
    return [np.zeros_like(case.args[i]) if g is None else g.numpy()
            for i, g in zip(wrt, grads)]


def finite_differences(case: Case, h: float = 1e-6) -> list[np.ndarray]:
    f = program(case)
    ws = weights(f, case)

    def loss(args: list[np.ndarray]) -> float:
        return float(run(f, args + ws)[0])

    grads = []
    for i in case.wrt_:
        x = case.args[i]
        g = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            plus, minus = x.copy(), x.copy()
            plus[idx] += h
            minus[idx] -= h
            args_p, args_m = list(case.args), list(case.args)
            args_p[i], args_m[i] = plus, minus
            g[idx] = (loss(args_p) - loss(args_m)) / (2 * h)
        grads.append(g)
    return grads


# ---------------------------------------------------------------- the cases

def flat_positions(shape: tuple[int, ...], items: tuple) -> np.ndarray:
    """The flat positions that basic indexing `items` selects in a tensor of `shape`."""
    return np.arange(int(np.prod(shape))).reshape(shape)[tuple(
        slice(it.lo, it.hi, it.step) if isinstance(it, SliceSpec) else it for it in items)]


def torch_index(items: tuple) -> Callable[..., Any]:
    def fn(x: Any) -> Any:
        pos = torch.from_numpy(np.asarray(flat_positions(tuple(x.shape), items)).astype(np.int64))
        return x.reshape(-1)[pos]
    return fn


def torch_unindex(items: tuple, shape: tuple[int, ...]) -> Callable[..., Any]:
    def fn(x: Any) -> Any:
        pos = torch.from_numpy(np.asarray(flat_positions(shape, items)).astype(np.int64))
        flat = torch.zeros(int(np.prod(shape)), dtype=x.dtype)
        return flat.index_put((pos.reshape(-1),), x.reshape(-1)).reshape(shape)
    return fn


def dims(axis: Any, rank: int) -> tuple[int, ...]:
    return tuple(range(rank)) if axis is None else (axis,) if isinstance(axis, int) else axis


CASES: list[Any] = []


def case(id: str, *args: Any, **kw: Any) -> None:
    CASES.append(pytest.param(Case(*args, **kw), id=id))


UNARY = {"neg": (torch.neg, normal), "abs": (torch.abs, nonzero), "exp": (torch.exp, normal),
         "log": (torch.log, positive), "exp2": (torch.exp2, normal),
         "log2": (torch.log2, positive), "sqrt": (torch.sqrt, positive),
         "rsqrt": (torch.rsqrt, positive), "tanh": (torch.tanh, normal),
         "sigmoid": (torch.sigmoid, normal), "sin": (torch.sin, normal),
         "cos": (torch.cos, normal), "tan": (torch.tan, lambda *s: np.asarray(0.7 * normal(*s))),
         "atan": (torch.atan, normal), "asin": (torch.asin, lambda *s: np.asarray(rng.uniform(-0.9, 0.9, s))),
         "acos": (torch.acos, lambda *s: np.asarray(rng.uniform(-0.9, 0.9, s))), "sinh": (torch.sinh, normal),
         "cosh": (torch.cosh, normal), "log1p": (torch.log1p, positive),
         "expm1": (torch.expm1, normal), "erf": (torch.erf, normal), "erfc": (torch.erfc, normal)}
for name, (fn, draw) in UNARY.items():
    for shape in [(), (5,), (2, 3, 4)]:
        case(f"{name}-{shape}", name, [draw(*shape)], fn)
case("abs-at-zero", "abs", [np.array([-1.5, 0.0, 0.0, 2.0])], torch.abs, smooth=False)
for name in ("erf", "erfc", "atan", "sinh", "cosh", "log1p", "expm1", "tanh", "sigmoid", "exp"):
    case(f"{name}-at-zeros-and-infinities", name, [np.array([0.0, -0.0, np.inf, -np.inf, 1e-30])],
         UNARY[name][0], smooth=False)
# the fused activation backwards that tanh's and sigmoid's VJPs emit (differentiated again
# under grad of grad): y is the activation's output, ct a cotangent
case("tanh_grad", "tanh_grad", [np.tanh(normal(2, 3)), normal(2, 3)], lambda y, ct: ct * (1 - y * y))
case("sigmoid_grad", "sigmoid_grad", [1 / (1 + np.exp(-normal(2, 3))), normal(2, 3)],
     lambda y, ct: ct * y * (1 - y))

BROADCASTS = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 4)), ((), (2, 3)),
              ((2, 1, 3), (4, 1))]
BINARY = {"add": (torch.add, normal, normal), "sub": (torch.sub, normal, normal),
          "mul": (torch.mul, normal, normal), "div": (torch.div, normal, nonzero),
          "mod": (torch.remainder, lambda *s: np.asarray(3 * normal(*s)), nonzero),
          "pow": (torch.pow, positive, normal),
          "maximum": (torch.maximum, normal, normal), "minimum": (torch.minimum, normal, normal),
          "atan2": (torch.atan2, normal, nonzero)}
for name, (fn, draw_a, draw_b) in BINARY.items():
    for sa, sb in BROADCASTS:
        case(f"{name}-{sa}-{sb}", name, [draw_a(*sa), draw_b(*sb)], fn)
for name, fn in [("maximum", torch.maximum), ("minimum", torch.minimum)]:
    case(f"{name}-ties", name, [tied(4, 5), tied(5)], fn, smooth=False)
    case(f"{name}-nan", name, [np.array([np.nan, 1.0, 2.0]), np.array([1.0, np.nan, 2.0])],
         fn, smooth=False)
case("pow-negative-base-integer-exponent", "pow",
     [nonzero(3, 4), rng.integers(0, 4, (4,)).astype(np.float64)], torch.pow, wrt=(0,))
case("pow-zero-base", "pow", [np.array([0.0, 0.0, 0.0, 1.5, -2.0]),
                              np.array([2.0, 0.0, 1.0, 2.5, 3.0])], torch.pow, smooth=False)

for sx, slo, shi in [((3, 4), (3, 4), (3, 4)), ((3, 4), (4,), ())]:
    case(f"clip-{sx}-{slo}-{shi}", "clip", [2 * normal(*sx), np.asarray(normal(*slo) - 1),
                                            np.asarray(normal(*shi) + 1)],
         torch.clamp)
case("clip-at-the-bounds", "clip", [np.array([-1.0, 0.0, 1.0, 2.0, np.nan]), np.array(0.0),
                                   np.array(1.0)], torch.clamp, smooth=False)
for sc, sa, sb in [((3, 4), (3, 4), (3, 4)), ((3, 4), (4,), (3, 1)), ((4,), (3, 4), ())]:
    case(f"where-{sc}-{sa}-{sb}", "where", [rng.random(sc) > 0.5, normal(*sa), normal(*sb)],
         torch.where)
cond = rng.random((3, 4)) > 0.5
case("where-untaken-nan-and-inf", "where",
     [cond, np.where(cond, normal(3, 4), np.nan), np.where(cond, np.inf, normal(3, 4))],
     torch.where)

case("cast-f64-f64", "cast", [normal(3, 4)], lambda x: x.to(torch.float64),
     static={"dtype": "f64"})
case("cast-f64-f32", "cast", [normal(3, 4)], lambda x: x.to(torch.float32),
     static={"dtype": "f32"}, smooth=False)
case("cast-f32-f64", "cast", [normal(3, 4).astype(np.float32)], lambda x: x.to(torch.float64),
     static={"dtype": "f64"}, smooth=False)

def torch_prod(x: Any, dim: tuple[int, ...], keepdim: bool = False) -> Any:
    """torch.prod over several dims (it takes one): one at a time, the last first."""
    dim = tuple(d % x.dim() for d in dim)
    for d in sorted(dim, reverse=True):
        x = x.prod(d, keepdim=True)
    return x if keepdim else x.reshape([n for i, n in enumerate(x.shape) if i not in dim])


REDUCE = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax, "min": torch.amin,
          "prod": torch_prod}
for name, fn in REDUCE.items():
    for axis in [None, 0, -1, (0, 2), (-1, -3), (2, 0, 1)]:
        for keepdims in [False, True]:
            def tfn(x: Any, fn: Any = fn, axis: Any = axis, keepdims: bool = keepdims) -> Any:
                return fn(x, dim=dims(axis, 3), keepdim=keepdims)
            static = {"axis": axis, "keepdims": keepdims}
            case(f"{name}-{axis}-{keepdims}", name, [normal(2, 3, 4)], tfn, static=static)
            if name in ("max", "min"):
                case(f"{name}-ties-{axis}-{keepdims}", name, [tied(2, 3, 4)], tfn,
                     static=static, smooth=False)
    case(f"{name}-scalar", name, [normal()], lambda x, fn=fn: fn(x, dim=()))

# prod's cotangent where a slice holds no zero, one zero, several zeros, only zeros
zeros = normal(5, 4)
zeros[1, 2] = zeros[2, 0] = zeros[2, 3] = 0.0
zeros[3] = 0.0
for axis, fn in [(-1, lambda x: x.prod(-1)), (0, lambda x: x.prod(0)), (None, torch.prod)]:
    case(f"prod-zeros-{axis}", "prod", [zeros], fn, static={"axis": axis})
one_zero = normal(3, 4)
one_zero[1, 1] = 0.0
case("prod-one-zero-in-all", "prod", [one_zero], torch.prod)

for name, fn in [("var", torch.var), ("std", torch.std)]:
    for axis, keepdims in [(None, False), (0, True), (-1, False), ((0, 2), True)]:
        for correction in [0, 1]:
            case(f"{name}-{axis}-{keepdims}-{correction}", name, [normal(2, 3, 4)],
                 lambda x, fn=fn, a=axis, k=keepdims, c=correction:
                 fn(x, dim=dims(a, 3), correction=c, keepdim=k),
                 static={"axis": axis, "keepdims": keepdims, "correction": correction})
# a row of equal values: std is 0 and its gradient there 0 (as torch's), not NaN
case("std-of-equal-values", "std", [np.array([[1.5, 1.5, 1.5], [1.0, 2.0, 4.0]])],
     lambda x: torch.std(x, dim=1, correction=0), static={"axis": 1}, smooth=False)

SCANS = {"cumsum": (torch.cumsum, normal), "cumprod": (torch.cumprod, nonzero),
         "logcumsumexp": (torch.logcumsumexp, normal)}
for name, (fn, draw) in SCANS.items():
    for shape, axis in [((5,), 0), ((2, 3, 4), 0), ((2, 3, 4), 1), ((2, 3, 4), -1), ((1, 4), 0)]:
        case(f"{name}-{shape}-{axis}", name, [draw(*shape)], lambda x, fn=fn, a=axis: fn(x, a),
             static={"axis": axis})
# cumprod's cotangent on lines with no zero, one, two, a zero first and a zero last
lines = nonzero(5, 6)
lines[1, 2] = lines[2, 1] = lines[2, 4] = lines[3, 0] = lines[4, 5] = 0.0
case("cumprod-zeros", "cumprod", [lines], lambda x: torch.cumprod(x, 1), static={"axis": 1})
case("cumprod-zeros-columns", "cumprod", [lines.T.copy()], lambda x: torch.cumprod(x, 0),
     static={"axis": 0})
# logcumsumexp where e^x overflows, and of -inf (its gradient there is 0)
case("logcumsumexp-large", "logcumsumexp", [normal(3, 5) * 300 + 1000],
     lambda x: torch.logcumsumexp(x, 1), static={"axis": 1})
case("logcumsumexp-inf", "logcumsumexp",
     [np.array([[-np.inf, 1.0, -np.inf, 2.0], [0.5, -np.inf, -1.0, 3.0]])],
     lambda x: torch.logcumsumexp(x, 1), static={"axis": 1}, smooth=False)

for shape in [(6, 4), (4, -1), (24,), (2, 2, 6)]:
    case(f"reshape-{shape}", "reshape", [normal(2, 3, 4)], lambda x, s=shape: x.reshape(s),
         static={"shape": shape})
case("reshape-scalar", "reshape", [normal()], lambda x: x.reshape(1, 1), static={"shape": (1, 1)})

for perm in [None, (1, 0, 2), (2, 0, 1), (-1, 0, 1)]:
    p = (2, 1, 0) if perm is None else tuple(i % 3 for i in perm)
    case(f"transpose-{perm}", "transpose", [normal(2, 3, 4)], lambda x, p=p: x.permute(p),
         static={"perm": perm})

for src, dst in [((3, 1), (2, 3, 4)), ((4,), (2, 3, 4)), ((), (2, 3)), ((1, 1), (1, 5)),
                 ((2, 3), (2, 3))]:
    case(f"broadcast_to-{src}-{dst}", "broadcast_to", [normal(*src)],
         lambda x, d=dst: torch.broadcast_to(x, d), static={"shape": dst})

for axis in [0, -1, (0, 2), (1, -1)]:
    shape = np.expand_dims(np.zeros((3, 4)), axis).shape
    case(f"expand_dims-{axis}", "expand_dims", [normal(3, 4)],
         lambda x, s=shape: x.reshape(s), static={"axis": axis})

for axis in [None, 0, (0, 2), -2]:
    shape = np.squeeze(np.zeros((1, 3, 1, 4)), axis).shape
    case(f"squeeze-{axis}", "squeeze", [normal(1, 3, 1, 4)],
         lambda x, s=shape: x.reshape(s), static={"axis": axis})

for shapes, axis in [([(2, 3), (2, 1), (2, 4)], 1), ([(2, 3), (2, 1), (2, 4)], -1),
                     ([(2, 3), (1, 3)], 0), ([(2, 3)], 0)]:
    case(f"concat-{shapes}-{axis}", "concat", [normal(*s) for s in shapes],
         lambda *xs, a=axis: torch.cat(xs, a), static={"axis": axis})

for axis in [0, 1, -1, 2]:
    case(f"stack-{axis}", "stack", [normal(2, 3) for _ in range(3)],
         lambda *xs, a=axis: torch.stack(xs, a), static={"axis": axis})

for shape, sections, axis, outputs in [((6, 4), 3, 0, None), ((6, 4), (1, 2, 3), 0, None),
                                       ((2, 6), (2, 4), -1, None), ((6, 4), 2, 0, (0,)),
                                       ((6, 4), (1, 2, 3), 0, (2, 0))]:
    sizes = [shape[axis] // sections] * sections if isinstance(sections, int) else list(sections)
    case(f"split-{shape}-{sections}-{axis}-{outputs}", "split", [normal(*shape)],
         lambda x, s=sizes, a=axis: x.split(s, a),
         static={"sections": sections, "axis": axis}, outputs=outputs)

for shape, start, stop, axis, step in [((7, 3), 1, 6, 0, 2), ((3, 7), -2, None, -1, 1),
                                       ((3, 7), 5, None, 1, -2), ((7, 3), 0, 0, 0, 1),
                                       ((7, 3), 6, 1, 0, -1)]:
    items = (SliceSpec(),) * (axis % 2) + (SliceSpec(start, stop, step),)
    case(f"slice-{shape}-{start}-{stop}-{axis}-{step}", "slice", [normal(*shape)],
         torch_index(items), static={"start": start, "stop": stop, "axis": axis, "step": step})

for items in [(1, SliceSpec(0, 4, 2), Ellipsis), (Ellipsis, -1),
              (SliceSpec(None, None, -1), 0, SliceSpec(1, None)), (2, 3, 4), ()]:
    case(f"index-{items}", "index", [normal(4, 5, 6)], torch_index(items),
         static={"items": items})

for xshape, items, shape in [((2, 3), (SliceSpec(0, 4, 2), SliceSpec(None, None, -1)), (4, 3)),
                             ((4,), (1, Ellipsis), (3, 4)), ((), (2, 1), (3, 2))]:
    case(f"unindex-{items}-{shape}", "unindex", [normal(*xshape)], torch_unindex(items, shape),
         static={"items": items, "shape": shape})

for shape, widths, value in [((2, 3), (1, 2, 0, 3), 0), ((2, 3), (0, 1, 2, 0), 1.5),
                             ((3,), (0, 0), 0)]:
    pairs = [p for i in reversed(range(len(shape))) for p in widths[2 * i:2 * i + 2]]
    case(f"pad-{shape}-{widths}-{value}", "pad", [normal(*shape)],
         lambda x, p=pairs, v=value: F.pad(x, p, value=v),
         static={"widths": widths, "value": value})

for axis in [None, 0, (0, 2), -1]:
    case(f"flip-{axis}", "flip", [normal(2, 3, 4)], lambda x, a=axis: torch.flip(x, dims(a, 3)),
         static={"axis": axis})

for name, fn in [("tril", torch.tril), ("triu", torch.triu)]:
    for shape, k in [((3, 4), 0), ((3, 4), 1), ((4, 3), -1), ((2, 3, 4), 0)]:
        case(f"{name}-{shape}-{k}", name, [normal(*shape)], lambda x, fn=fn, k=k: fn(x, k),
             static={"k": k})

for shape, idx, axis in [((5, 3), ints([0, 2], [2, 4], [0, 0]), 0),   # repeated indices
                         ((2, 5, 3), ints(4, 4, 1, 0), 1), ((5, 3), ints(2, 2, 0), -1),
                         ((5, 3), ints(3), 0)]:
    case(f"take-{shape}-{idx.tolist()}-{axis}", "take", [normal(*shape), idx],
         lambda x, i, a=axis: x[(slice(None),) * (a % x.dim()) + (i,)], static={"axis": axis})


def torch_scatter_add(axis: int) -> Callable[..., Any]:
    def fn(x: Any, i: Any, u: Any) -> Any:
        a = axis % x.dim()
        return x.index_add(a, i.reshape(-1), u.reshape(x.shape[:a] + (-1,) + x.shape[a + 1:]))
    return fn


for shape, idx, axis in [((5, 3), ints(0, 2, 2, 4), 0), ((3, 5), ints([1, 1], [4, 0]), 1),
                         ((3, 5), ints(4, 4, 4), -1)]:
    ushape = shape[:axis % 2] + idx.shape + shape[axis % 2 + 1:]
    case(f"scatter_add-{shape}-{idx.tolist()}-{axis}", "scatter_add",
         [normal(*shape), idx, normal(*ushape)], torch_scatter_add(axis), static={"axis": axis})

def torch_sorted(axis: int, descending: bool, k: int | None = None) -> Callable[..., Any]:
    """torch.sort(stable=True)'s values, the first k of them (k None: all)."""
    def fn(x: Any) -> Any:
        values = torch.sort(x, dim=axis, descending=descending, stable=True).values
        return values if k is None else values.narrow(axis, 0, k)
    return fn


for shape, axis, descending in [((7,), 0, False), ((3, 5), 0, True), ((2, 3, 4), -1, False),
                                ((2, 3, 4), 1, True), ((0, 3), 0, False), ((1,), -1, True)]:
    static = {"axis": axis, "descending": descending}
    case(f"sort-{shape}-{axis}-{descending}", "sort", [normal(*shape)],
         torch_sorted(axis, descending), static=static)
    # ties: each copy of a value gets the cotangent of the place the stable order gives it
    case(f"sort-ties-{shape}-{axis}-{descending}", "sort", [tied(*shape)],
         torch_sorted(axis, descending), static=static, smooth=False)

for shape, k, axis, largest in [((7,), 3, 0, True), ((3, 5), 2, 0, False),
                                ((2, 3, 4), 4, -1, True), ((3, 5), 0, 1, True),
                                ((2, 6), 6, 1, False)]:
    static = {"k": k, "axis": axis, "largest": largest}
    case(f"topk-{shape}-{k}-{axis}-{largest}", "topk", [normal(*shape)],
         lambda x, k=k, a=axis, big=largest: torch.topk(x, k, a, big), static=static,
         outputs=(0,))
    # torch.topk breaks ties in no documented order; dslc's lower index first is the stable sort's
    case(f"topk-ties-{shape}-{k}-{axis}-{largest}", "topk", [tied(*shape)],
         torch_sorted(axis, largest, k), static=static, outputs=(0,), smooth=False)


def torch_take_along_axis(axis: int) -> Callable[..., Any]:
    return lambda x, i: torch.take_along_dim(x, i % x.shape[axis], axis)   # torch: no i < 0


for shape, idx, axis in [((4, 5), ints([0, 4, 4], [-1, 2, 0], [3, 3, 3], [1, -5, 0]), 1),
                         ((1, 5), ints([0, 1], [4, 4], [2, 0]), 1),    # x broadcast: sums
                         ((3, 5), ints([2, 2]), -1),                   # indices broadcast
                         ((4, 2, 3), ints([[1], [0]], [[3], [3]]).reshape(2, 2, 1), 0),
                         ((3, 0), np.zeros((3, 0), np.int32), 1)]:
    case(f"take_along_axis-{shape}-{idx.tolist()}-{axis}", "take_along_axis",
         [normal(*shape), idx], torch_take_along_axis(axis), static={"axis": axis})

for sa, sb in [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)),
               ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 2)),
               ((4,), (2, 4, 5)), ((2, 3, 4), (4,)), ((1, 3, 4), (2, 4, 5))]:
    case(f"matmul-{sa}-{sb}", "matmul", [normal(*sa), normal(*sb)], torch.matmul)

for spec, shapes in [("ij,jk->ik", [(3, 4), (4, 5)]),
                     ("bhtd,bhsd->bhts", [(2, 2, 3, 4), (2, 2, 5, 4)]),
                     ("ii->i", [(4, 4)]), ("ii->", [(4, 4)]), ("ij->", [(3, 4)]),
                     ("ij,j", [(3, 4), (4,)]), ("ij,jk->i", [(3, 4), (4, 5)]),
                     ("iij,j->i", [(3, 3, 4), (4,)]), ("ij,ij->ij", [(3, 4), (3, 4)]),
                     ("i,j->ij", [(3,), (4,)]), ("ijk->kji", [(2, 3, 4)]),
                     ("iji->j", [(3, 4, 3)]), ("ab,bc,cd->ad", [(2, 3), (3, 4), (4, 5)])]:
    case(f"einsum-{spec}", "einsum", [normal(*s) for s in shapes],
         lambda *xs, s=spec: torch.einsum(s, *xs), static={"spec": spec})


# ---------------------------------------------------------------- the checks

@pytest.mark.parametrize("case", CASES)
def test_vjp_matches_torch(case: Case) -> None:
    got, _ = ir_grads(case)
    want = torch_grads(case)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12, equal_nan=True)


@pytest.mark.parametrize("case", [c for c in CASES if c.values[0].smooth])
def test_vjp_matches_finite_differences(case: Case) -> None:
    got, _ = ir_grads(case)
    for g, w in zip(got, finite_differences(case)):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


def test_every_differentiable_primitive_has_a_rule_and_a_case() -> None:
    tested = {c.values[0].prim for c in CASES}
    for name, p in REGISTRY.items():
        if p.differentiable and p.role is not Role.STRUCTURED:    # (ir/ad.py differentiates those)
            assert type(p).vjp is not Primitive.vjp, f"{name} has no VJP rule"
            assert name in tested, f"{name} has no VJP test case"


F32_CASES = [
    Case("tanh", [normal(3, 4).astype(np.float32)], torch.tanh),
    Case("mul", [normal(3, 4).astype(np.float32), normal(4).astype(np.float32)], torch.mul),
    Case("matmul", [normal(2, 3, 4).astype(np.float32), normal(4, 5).astype(np.float32)],
         torch.matmul),
    Case("sum", [normal(3, 4).astype(np.float32)], lambda x: x.sum(0), static={"axis": 0}),
    Case("max", [tied(3, 4).astype(np.float32)], lambda x: x.amax(-1), static={"axis": -1}),
]


@pytest.mark.parametrize("case", F32_CASES, ids=lambda c: c.prim)
def test_f32_vjp_matches_torch(case: Case) -> None:
    got, _ = ir_grads(case)
    for g, w in zip(got, torch_grads(case)):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- NaN, inf and zero cotangents

def _const(b: Builder, v: float) -> Any:
    return b.constant(v, "f64")


GUARDED = {
    "sqrt": (lambda b, x: b.emit("sqrt", x), torch.sqrt),
    "log": (lambda b, x: b.emit("log", x), torch.log),
    "log2": (lambda b, x: b.emit("log2", x), torch.log2),
    "rsqrt": (lambda b, x: b.emit("rsqrt", x), torch.rsqrt),
    "div": (lambda b, x: b.emit("div", _const(b, 1.0), x), lambda x: 1 / x),
    "pow-base": (lambda b, x: b.emit("pow", x, _const(b, 0.5)), lambda x: x ** 0.5),
    "pow-both": (lambda b, x: b.emit("pow", x, x), lambda x: x ** x),
}


@pytest.mark.parametrize("name", GUARDED)
def test_untaken_where_branch_gives_a_finite_gradient(name: str) -> None:
    """where(x > 0, f(x), 0) at x <= 0: f's derivative there is inf or NaN, the gradient 0."""
    ir_fn, torch_fn = GUARDED[name]
    x = np.array([-1.0, 0.0, 0.25, 2.0])
    b = Builder(name)
    p = b.param(tensor_type("f64", x.shape))
    zero = _const(b, 0.0)
    y = b.emit("where", b.emit("gt", p, zero), ir_fn(b, p), zero)
    f = b.finish([b.emit("sum", y)])
    (got,) = run(grad_function(f, wrt=[0]), [x])
    t = torch.from_numpy(x).requires_grad_(True)
    safe = torch.where(t > 0, t, torch.ones_like(t))           # the double-where idiom
    torch.where(t > 0, torch_fn(safe), 0.0).sum().backward()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-10, atol=0)


def test_cast_through_an_integer_has_no_gradient() -> None:
    b = Builder("f")
    x = b.param(tensor_type("f64", (4,)))
    back = b.emit("cast", b.emit("cast", x, dtype="i32"), dtype="f64")
    f = b.finish([b.emit("sum", b.emit("mul", back, x))])
    (got,) = run(grad_function(f, wrt=[0]), [np.array([1.5, -2.5, 3.0, 0.25])])
    np.testing.assert_array_equal(got, [1.0, -2.0, 3.0, 0.0])   # only the direct use of x


def test_stop_gradient_has_no_gradient() -> None:
    b = Builder("f")
    x = b.param(tensor_type("f64", (3,)))
    f = b.finish([b.emit("sum", b.emit("mul", b.emit("stop_gradient", x), x))])
    xs = normal(3)
    (got,) = run(grad_function(f, wrt=[0]), [xs])
    np.testing.assert_array_equal(got, xs)


# ---------------------------------------------------------------- second order

SECOND = {
    "tanh": (lambda b, x: b.emit("tanh", x), torch.tanh, [(3, 4)]),
    "exp": (lambda b, x: b.emit("exp", x), torch.exp, [(3, 4)]),
    "mul": (lambda b, x, y: b.emit("mul", b.emit("mul", x, y), x), lambda x, y: x * y * x,
            [(3, 4), (4,)]),
    "matmul": (lambda b, x, y: b.emit("matmul", x, y), torch.matmul, [(2, 3, 4), (4, 5)]),
    "tanh-matmul": (lambda b, x, y: b.emit("tanh", b.emit("matmul", x, y)),
                    lambda x, y: torch.tanh(x @ y), [(3, 4), (4,)]),
    "sum": (lambda b, x: b.emit("sum", b.emit("mul", x, x), axis=-1, keepdims=True),
            lambda x: (x * x).sum(-1, keepdim=True), [(3, 4)]),
    "max": (lambda b, x: b.emit("max", b.emit("exp", x), axis=0), lambda x: x.exp().amax(0),
            [(3, 4)]),
    "div": (lambda b, x, y: b.emit("div", x, y), torch.div, [(3, 4), (4,)]),
    "sort": (lambda b, x: b.emit("tanh", b.emit("sort", x, axis=0, descending=True)),
             lambda x: torch.tanh(torch_sorted(0, True)(x)), [(5, 3)]),
    "topk": (lambda b, x: b.emit("tanh", b.emit("topk", x, k=2)[0]),
             lambda x: torch.tanh(torch.topk(x, 2).values), [(3, 5)]),
    "take_along_axis": (lambda b, x: b.emit("tanh", b.emit(
                            "take_along_axis", x, b.constant(((1, 1, 0),), "i32"), axis=1)),
                        lambda x: torch.tanh(x[:, [1, 1, 0]]), [(2, 4)]),
    "prod": (lambda b, x: b.emit("prod", x, axis=0), lambda x: x.prod(0), [(3, 4)]),
    "var": (lambda b, x: b.emit("var", x, axis=-1, correction=1), lambda x: x.var(-1), [(3, 4)]),
    "cumsum": (lambda b, x: b.emit("cumsum", b.emit("mul", x, x), axis=0),
               lambda x: torch.cumsum(x * x, 0), [(3, 4)]),
    "cumprod": (lambda b, x: b.emit("cumprod", x, axis=1), lambda x: torch.cumprod(x, 1), [(3, 4)]),
    "logcumsumexp": (lambda b, x: b.emit("logcumsumexp", x, axis=-1),
                     lambda x: torch.logcumsumexp(x, -1), [(3, 4)]),
}


@pytest.mark.parametrize("name", SECOND)
def test_grad_of_grad_matches_torch_double_backward(name: str) -> None:
    ir_fn, torch_fn, shapes = SECOND[name]
    xs = [positive(*s) for s in shapes]
    n = len(xs)
    b = Builder(name)
    ps = [b.param(tensor_type("f64", s)) for s in shapes]
    y = ir_fn(b, *ps)
    f = b.finish([b.emit("sum", b.emit("mul", y, b.param(y.type)))])
    w = np.random.default_rng(1).standard_normal(y.shape)

    g = grad_function(f, wrt=list(range(n)))               # (xs…, w) -> grads
    hb = Builder(f"{name}_h")
    hp = [hb.param(p.type) for p in g.params]
    vs = [hb.param(r.type) for r in g.results]
    grads = inline(hb, g, hp)
    terms = [hb.emit("sum", hb.emit("mul", gr, v)) for gr, v in zip(grads, vs)]
    h = hb.finish([functools.reduce(lambda s, t: hb.emit("add", s, t), terms)])
    v = [np.random.default_rng(2 + i).standard_normal(s) for i, s in enumerate(shapes)]
    got = run(grad_function(h, wrt=list(range(n))), xs + [w] + v)

    ts = [torch.from_numpy(x.copy()).requires_grad_(True) for x in xs]
    loss = (torch_fn(*ts) * torch.from_numpy(w)).sum()
    tg = torch.autograd.grad(loss, ts, create_graph=True)
    second = sum((gr * torch.from_numpy(vi)).sum() for gr, vi in zip(tg, v))
    want = torch.autograd.grad(second, ts, allow_unused=True)
    for gv, wv, x in zip(got, want, xs):
        wv = np.zeros_like(x) if wv is None else wv.detach().numpy()
        np.testing.assert_allclose(gv, wv, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name, fn, d2", [
    ("tanh", "tanh", lambda x: -2 * np.tanh(x) * (1 - np.tanh(x) ** 2)),
    ("exp", "exp", np.exp),
    ("sin", "sin", lambda x: -np.sin(x)),
])
def test_grad_of_grad_of_a_scalar_function(name: str, fn: str, d2: Callable) -> None:
    b = Builder(name)
    x = b.param(tensor_type("f64", ()))
    f = b.finish([b.emit(fn, x)])
    x0 = np.array(0.7)
    (got,) = run(grad_function(grad_function(f, wrt=[0]), wrt=[0]), [x0])
    np.testing.assert_allclose(got, d2(x0), rtol=1e-12)


def test_a_matrix_shared_by_a_batch_gets_one_product_over_all_rows() -> None:
    """x[B, T, K] @ W[K, N]: W's cotangent is xᵀ @ ct with k over all B·T rows (as PyTorch
    computes it), not B products summed — equal to float64 rounding, and made by the product itself."""
    case = Case("matmul", [normal(3, 5, 4), normal(4, 2)], torch.matmul, wrt=[1])
    (got,), g = ir_grads(case)
    assert [op.primitive.name for op in g.ops if op.outputs[0] in g.results] == ["matmul"]
    x, w = case.args
    (ct,) = weights(program(case), case)
    np.testing.assert_allclose(got, x.reshape(15, 4).T @ ct.reshape(15, 2), rtol=1e-13)
