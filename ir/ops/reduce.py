"""Reductions over axes: `sum prod mean max min any all var std argmax argmin`.

`axis` is None (all axes), an int or a tuple of ints, negative counting from the end;
`keepdims=True` keeps each reduced axis with length 1. The VJPs of `max` and `min` divide the
cotangent equally among the elements that tie for the extreme, as `torch.amax` does; `prod`'s
handles zeros as `torch.prod` does.

`var` and `std` are compositions (Role.COMPOSITE): the Builder emits their definition,
`sum((x - mean(x))**2) / (N - correction)`, as the ops mean, sub, mul, sum (mean where the
correction is 0) and div. Their meaning, their VJP and their kernels are then those of the
parts: the interpreter and every backend compute the same ops in the same canonical order, so
the bits agree by construction, and the scheduler fuses the parts (a variance over a row is
one row kernel) as it fuses any such ops. A primitive of their own would need a second
definition of the same arithmetic in each backend, and a VJP that autodiff of the parts gives
for free (correct to every order, which a hand-written rule through a stopped mean is not)."""
from __future__ import annotations

from math import prod
from typing import Any, Callable, ClassVar

import numpy as np

from ir import numerics
from ir.dims import Dim
from ir.ops.base import (NUMERIC, REGISTRY, Kind, OpError, Param, Primitive, Role, is_float, need,
                         normalize_axes, np_dtype, primitive, statics, type_of)
from ir.types import DTYPES, FLOAT_DTYPES, TensorType

Axes = None | int | tuple[int, ...]


class Reduction(Primitive):
    """Combines the elements along axes; the result keeps the dtype unless `result_dtype`."""
    params = (Param("x", Kind.TENSOR), Param("axis", Kind.AXES, None),
              Param("keepdims", Kind.BOOL, False))
    numpy: ClassVar[Callable[..., Any]]
    accepts: ClassVar[tuple[str, ...]] = DTYPES
    needs: ClassVar[str] = "any"             # said when accepts is narrower
    result_dtype: ClassVar[str | None] = None
    integer_identity: ClassVar[bool] = False   # 0 for a sum; max and min of no integers have none
    role = Role.REDUCTION
    combine: ClassVar[str]                     # the kernels' combining operation: add, max, min
    averages: ClassVar[bool] = False           # the combination is divided by the count (mean)
    pairwise: ClassVar[str | None] = None      # the elementwise primitive that a call with two
                                               # values, max(x, 0.0), means: maximum
    host = "of integers and bools on the GPU (its warp shuffles move floats): evaluated by NumPy"

    def infer(self, x: TensorType, axis: Axes = None, keepdims: bool = False) -> TensorType:
        x = need(x, self.accepts, lambda: f"'{self.name}' needs {self.needs} tensor, got {x}; "
                 "use cast()", "x")
        axes = normalize_axes(self.check_axis(axis), x.rank, x)
        if not self.has_identity(x.dtype) and any(x.shape[a].value == 0 for a in axes):
            raise OpError(f"'{self.name}' of an empty axis has no value: {x} has length 0 "
                          f"on axis {next(a for a in axes if x.shape[a].value == 0)}", "x")
        shape = tuple(Dim.const(1) if i in axes else d for i, d in enumerate(x.shape)
                      if keepdims or i not in axes)
        if self.result_dtype:
            return TensorType(self.result_dtype, shape)
        return x.with_shape(shape)

    def check_axis(self, axis: Axes) -> Axes:
        return axis

    def has_identity(self, dtype: str) -> bool:
        """Whether a reduction of nothing has a value (docs/numerics.md: the identity)."""
        return self.canonical is not None and (dtype in FLOAT_DTYPES or self.integer_identity)

    # a float reduction in the canonical order of ir/numerics.py: (combine, identity)
    canonical: ClassVar[tuple[Callable, float] | None] = None

    def evaluate(self, x: Any, axis: Axes = None, keepdims: bool = False) -> np.ndarray:
        out = self.infer(type_of(x), axis, keepdims)
        dtype = np_dtype(out.dtype)
        if self.canonical is None or not is_float(x.dtype):        # exact: any order will do
            return np.asarray(self.numpy(x, axis=axis, keepdims=keepdims), dtype=dtype)
        axes = normalize_axes(axis, x.ndim, "x")
        result = self.finish(numerics.reduce(x, axes, *self.canonical), x, axes)
        shape = tuple(1 if i in axes else n for i, n in enumerate(x.shape)) if keepdims else None
        return np.asarray(result if shape is None else np.reshape(result, shape), dtype=dtype)

    def finish(self, reduced: np.ndarray, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        return reduced

    def mlir(self, w: Any, op: Any) -> list[str]:
        """linalg.reduce from the identity, its region the combining primitive's scalar body
        (in IREE's order, not the canonical one); a mean divides the sum by the count."""
        from ir.mlir import tensor_type
        (x,), out = op.inputs, op.outputs[0]
        if self.canonical is None or (self.averages and x.dtype not in FLOAT_DTYPES):
            return super().mlir(w, op)
        axes = normalize_axes(statics(op)["axis"], len(x.shape), "x")
        kept = [n for i, n in enumerate(x.shape) if i not in axes]
        combine = REGISTRY[self.pairwise or self.combine]
        name = w.reduce(w[x], x.shape, x.dtype, axes, identity(self.combine, x.dtype),
                        lambda a, b: combine.scalar(w.body, [a, b], [x.dtype] * 2, x.dtype, {}),
                        self.name)
        t = tensor_type(kept, x.dtype)
        if self.averages:
            count = float(np.prod([x.shape[i] for i in axes]))
            name = w.generic(kept, [x.dtype], [(name, t, ", ".join(f"d{i}" for i in range(len(kept))))],
                             lambda a: [w.body.div(a[0], w.body.const(count, x.dtype))], hint=self.name)[0]
        return [w.reshape(name, kept, out.shape, out.dtype)]

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        (x,), (ct,) = op.inputs, cts
        axes = normalize_axes(statics(op)["axis"], len(x.shape), "x")
        return (self.backward(b, _kept(b, ct, x, axes), x, _kept(b, op.outputs[0], x, axes),
                              axes),)

    def backward(self, b: Any, ct: Any, x: Any, y: Any, axes: tuple[int, ...]) -> Any:
        """x's cotangent, given the result y and its cotangent ct with the reduced axes kept."""
        raise NotImplementedError(f"no VJP rule for '{self.name}'")


def identity(combine: str, dtype: str) -> int | float | bool:
    """Where a reduction by `combine` (add, mul, max, min) of dtype starts: -0.0 for a float
    sum (a sum of -0.0s is -0.0), 0 for an integer one, 1 for a product; a max or min starts
    from the dtype's extreme (±inf, the least or greatest integer, False or True)."""
    if combine in ("add", "mul"):
        return 1 if combine == "mul" else -0.0 if dtype in FLOAT_DTYPES else 0
    if dtype in FLOAT_DTYPES:
        return -np.inf if combine == "max" else np.inf
    if dtype == "bool":
        return combine == "min"
    info = np.iinfo(np_dtype(dtype))
    return int(info.min if combine == "max" else info.max)


def _kept(b: Any, v: Any, x: Any, axes: tuple[int, ...]) -> Any:
    """v, a reduction of x over axes, with the reduced axes kept as length 1."""
    shape = tuple(1 if i in axes else n for i, n in enumerate(x.shape))
    return v if v.shape == shape else b.emit("reshape", v, shape=shape)


def _spread(b: Any, ct: Any, x: Any) -> Any:
    return ct if ct.shape == x.shape else b.emit("broadcast_to", ct, shape=x.shape)


@primitive
class Sum(Reduction):
    """The sum; integers keep their dtype (and wrap around)."""
    name = surface = "sum"
    numpy = staticmethod(np.sum)
    canonical = (np.add, -0.0)
    accepts = NUMERIC
    needs = "a numeric"
    integer_identity = True
    combine = "add"

    def backward(self, b: Any, ct: Any, x: Any, y: Any, axes: tuple[int, ...]) -> Any:
        return _spread(b, ct, x)


@primitive
class Prod(Reduction):
    """The product; integers keep their dtype (and wrap around)."""
    name = surface = "prod"
    numpy = staticmethod(np.prod)
    canonical = (np.multiply, 1.0)
    accepts = NUMERIC
    needs = "a numeric"
    integer_identity = True
    combine = "mul"

    def backward(self, b: Any, ct: Any, x: Any, y: Any, axes: tuple[int, ...]) -> Any:
        """ct times the product of the other elements: y / x where the slice has no zero, the
        product of the rest at a slice's only zero, and 0 elsewhere (y / x would be 0 / 0)."""
        zero, one = b.constant(0.0, x.dtype), b.constant(1.0, x.dtype)
        is_zero = b.emit("eq", x, zero)
        zeros = b.emit("sum", b.emit("cast", is_zero, dtype=x.dtype), axis=axes, keepdims=True)
        rest = b.emit("prod", b.emit("where", is_zero, one, x), axis=axes, keepdims=True)
        only = b.emit("and", is_zero, b.emit("eq", zeros, one))
        with_zero = b.emit("where", only, b.emit("mul", ct, rest), zero)
        return b.emit("where", b.emit("eq", zeros, zero), b.emit("mul", ct, b.emit("div", y, x)),
                      with_zero)


@primitive
class Mean(Reduction):
    """The arithmetic mean, of floats."""
    name = surface = "mean"
    numpy = staticmethod(np.mean)
    canonical = (np.add, -0.0)
    combine, averages = "add", True

    def finish(self, reduced: np.ndarray, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        """The canonical sum divided by the count (in the tensor's dtype)."""
        return reduced / np.asarray(np.prod([x.shape[a] for a in axes]), dtype=x.dtype)
    accepts = FLOAT_DTYPES
    needs = "a float"

    def backward(self, b: Any, ct: Any, x: Any, y: Any, axes: tuple[int, ...]) -> Any:
        count = b.constant(float(np.prod([x.shape[a] for a in axes])), ct.dtype)
        return _spread(b, b.emit("div", ct, count), x)     # divide before spreading: fewer ops


def _ties_share(b: Any, ct: Any, x: Any, y: Any, axes: tuple[int, ...]) -> Any:
    """max's and min's VJP: ct divided equally among the elements of x equal to the result."""
    hit = b.emit("cast", b.emit("eq", x, y), dtype=ct.dtype)
    count = b.emit("sum", hit, axis=axes, keepdims=True)
    return b.emit("mul", b.emit("div", ct, count), hit)


@primitive
class Max(Reduction):
    """The largest element (NaN if any is NaN); on bool tensors, any."""
    name = surface = "max"
    numpy = staticmethod(np.max)
    canonical = (numerics.maximum, -np.inf)
    combine = "max"
    pairwise = "maximum"
    backward = staticmethod(_ties_share)


@primitive
class Min(Reduction):
    """The smallest element (NaN if any is NaN); on bool tensors, all."""
    name = surface = "min"
    numpy = staticmethod(np.min)
    canonical = (numerics.minimum, np.inf)
    combine = "min"
    pairwise = "minimum"
    backward = staticmethod(_ties_share)


class Logical(Reduction):
    """Whether elements are nonzero (NaN is), a bool tensor from one of any dtype; of bools,
    a max (any) or a min (all), which the kernels compute (of other dtypes, the backends
    reduce the input cast to bool: ir/passes.py)."""
    result_dtype = "bool"
    differentiable = False

    def has_identity(self, dtype: str) -> bool:
        return True


@primitive
class AnyTrue(Logical):
    """Whether any element is nonzero; of none, False."""
    name = surface = "any"
    numpy = staticmethod(np.any)
    combine = "max"


@primitive
class AllTrue(Logical):
    """Whether every element is nonzero; of none, True."""
    name = surface = "all"
    numpy = staticmethod(np.all)
    combine = "min"


class Moment(Reduction):
    """A reduction by the sum of squared deviations from the mean, of floats, emitted as its
    parts (see the module docstring); `correction` is subtracted from the count N (1: the
    sample estimate, as torch's `correction`), which stays at least 0."""
    params = Reduction.params + (Param("correction", Kind.NUMBER, 0),)
    accepts = FLOAT_DTYPES
    needs = "a float"
    role = Role.COMPOSITE
    host = None

    def infer(self, x: TensorType, axis: Axes = None, keepdims: bool = False,
              correction: int | float = 0) -> TensorType:
        return super().infer(x, axis, keepdims)

    def has_identity(self, dtype: str) -> bool:
        return True                                  # of nothing, NaN: a mean's 0 / 0

    def expand(self, b: Any, x: Any, axis: Axes = None, keepdims: bool = False,
               correction: int | float = 0) -> Any:
        d = b.emit("sub", x, b.emit("mean", x, axis=axis, keepdims=True))
        squares = b.emit("mul", d, d)
        if correction == 0:                          # the sum over N: one op, mean
            return self.of_variance(b, b.emit("mean", squares, axis=axis, keepdims=keepdims))
        n = prod(x.shape[a] for a in normalize_axes(axis, len(x.shape), "x"))
        count = b.constant(float(max(n - correction, 0)), x.dtype)
        return self.of_variance(b, b.emit("div", b.emit("sum", squares, axis=axis,
                                                        keepdims=keepdims), count))

    def of_variance(self, b: Any, v: Any) -> Any:
        """The result from the variance v."""
        return v


@primitive
class Var(Moment):
    """The variance: mean((x - mean(x))**2), or with a correction the sum over N - correction."""
    name = surface = "var"


@primitive
class Std(Moment):
    """The standard deviation, sqrt(var); its gradient is 0 where it is 0, as torch's."""
    name = surface = "std"

    def of_variance(self, b: Any, v: Any) -> Any:
        # where v is 0, sqrt's derivative is inf and the deviations' are 0: the inner where
        # keeps both finite there (the outer one's value is sqrt(0) = 0 anyway)
        zero = b.constant(0.0, v.dtype)
        at_zero = b.emit("eq", v, zero)
        safe = b.emit("where", at_zero, b.constant(1.0, v.dtype), v)
        return b.emit("where", at_zero, zero, b.emit("sqrt", safe))


class ArgReduction(Reduction):
    """The i32 index of an extreme along one axis, or in the flattened tensor (axis=None);
    ties pick the first."""
    result_dtype = "i32"
    differentiable = False
    role = Role.HOST
    host = "an index of an extreme: a routine of the native step (backend/extreme.py), NumPy's in the walk"

    better: ClassVar[str]                    # the comparison an element must win: > or <

    def check_axis(self, axis: Axes) -> Axes:
        if isinstance(axis, tuple):
            raise OpError(f"'{self.name}' takes one axis or None, got {axis}", "axis")
        return axis

    def wins(self, e: Any, v: Any, best: Any, dtype: str) -> Any:
        """Whether v, met after best in the walk along the axis, takes its place (the CPU's and
        the GPU's extreme kernels, by the backend's emitter e): a NaN where best is a number,
        else a strictly better number, so that the first extreme is kept."""
        better = e.compare(self.better, v, best, dtype)
        if dtype not in FLOAT_DTYPES:
            return better
        return e.and_(e.compare("==", best, best, dtype), e.or_(e.isnan(v), better))

    def mlir(self, w: Any, op: Any) -> list[str]:
        """A linalg.generic reducing the axis (of the flattened tensor for None) to the pair
        (extreme, index), NumPy's: the first NaN, else the first extreme. The combination is
        a total order on pairs, so IREE may reduce in any order and still find NumPy's."""
        from ir.mlir import tensor_type
        (x,), out = op.inputs, op.outputs[0]
        axis, name, shape = statics(op)["axis"], w[x], x.shape
        if axis is None:
            name, shape, axis = w.reshape(name, shape, (prod(shape),), x.dtype), (prod(shape),), 0
        axis %= len(shape)
        kept = [n for i, n in enumerate(shape) if i != axis]
        worst = np.inf if self.better == "<" else -np.inf
        if x.dtype not in FLOAT_DTYPES:
            worst = identity("max" if self.better == ">" else "min", x.dtype)
        inits = [w.filled(worst, kept, x.dtype, "init"), w.filled(0, kept, "i32", "init")]
        b = w.body

        def combine(args: list) -> list:
            v, best, at = args
            i = b.from_index(b.position(axis), "i32")
            wins, tie = b.compare(self.better, v, best, x.dtype), b.compare("==", v, best, x.dtype)
            if x.dtype in FLOAT_DTYPES:               # NaN wins over every number
                nan, best_nan = b.isnan(v), b.isnan(best)
                wins = b.or_(wins, b.and_(nan, b.xor(best_nan, b.const(True, "bool"))))
                tie = b.or_(tie, b.and_(nan, best_nan))
            take = b.or_(wins, b.and_(tie, b.compare("<", i, at, "i32")))
            return [b.select(take, v, best), b.select(take, i, at)]
        ins = [(name, tensor_type(shape, x.dtype), ", ".join(f"d{i}" for i in range(len(shape))))]
        index = w.generic(shape, [x.dtype, "i32"], ins, combine, reduced=(axis,), inits=inits,
                          hint=self.name)[1]
        return [w.reshape(index, kept, out.shape, "i32")]


@primitive
class ArgMax(ArgReduction):
    """The index of the first largest element."""
    name = surface = "argmax"
    numpy = staticmethod(np.argmax)
    better = ">"


@primitive
class ArgMin(ArgReduction):
    """The index of the first smallest element."""
    name = surface = "argmin"
    numpy = staticmethod(np.argmin)
    better = "<"
