"""Elementwise primitives: unary math, binary arithmetic with NumPy broadcasting, comparisons,
bitwise logic, shifts, `where` and `cast`.

Operands share one dtype; a weak operand (a literal) takes the other's (`x * 2` keeps x's
dtype). Each class's `reference` is the NumPy function of its meaning; the checker also applies
it to plain Python numbers for static arithmetic.

VJP rules follow PyTorch: `maximum`/`minimum` split the cotangent equally between tied
operands (so relu(0)' = 0 needs `where(x > 0, x, 0)`, not `maximum(x, 0)`); abs'(0) = 0; `where`
sends zeros, never NaN, to the branch it did not take; and where a local derivative can be inf
or NaN (`div log log2 sqrt rsqrt pow`), a zero cotangent still gives a zero input cotangent.

Each class's `scalar` is its body in a kernel, for the result dtypes of `compiled`; the
functions of the math library (`exp`, `tanh`, `**`…) are compiled for f32 and f64."""
from __future__ import annotations

from typing import Any, Callable, ClassVar

import numpy as np

from ir import numerics

from ir.ops.base import (NUMERIC, Kind, OpError, Param, Primitive, Role, broadcast_shapes,
                         common_dtype, dtype_name, need, np_dtype, primitive, type_of, unbroadcast,
                         zero_where_ct_is_zero)
from ir.types import DTYPES, FLOAT_DTYPES, INT_DTYPES, TensorType

_FLOAT_HINT = "; use cast(x, f32)"
_LN2 = 0.6931471805599453


def _scalar(b: Any, value: float, like: Any) -> Any:
    return b.constant(value, like.dtype)


_COMPILED = tuple(d for d in DTYPES if d != "bf16")       # the reference has no bf16 either


class Elementwise(Primitive):
    """Evaluates `reference` on the arguments, in the dtype the shape rule gives."""
    reference: ClassVar[Callable[..., Any]]
    role = Role.ELEMENTWISE
    compiled: ClassVar[tuple[str, ...]] = _COMPILED    # the result dtypes `scalar` computes

    def compiles(self, dtypes: list[str], dtype: str) -> bool:
        has_body = type(self).scalar is not Primitive.scalar
        return has_body and dtype in self.compiled and "bf16" not in (*dtypes, dtype)

    @property
    def shares_dtype(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params if p.kind is Kind.TENSOR and p.name != "cond")

    def mlir(self, w: Any, op: Any) -> list[str]:
        """A linalg.generic whose region is the scalar body (the math library's functions are
        the math dialect's there)."""
        if type(self).scalar is Primitive.scalar:
            return super().mlir(w, op)
        dtypes, dtype = [v.dtype for v in op.inputs], op.outputs[0].dtype
        return [w.map(op, lambda args: self.scalar(w.body, args, dtypes, dtype, op.attrs))]

    def evaluate(self, **args: Any) -> np.ndarray:
        out = self.infer(**{name: type_of(v) for name, v in args.items()})
        result = self.reference(*(args[p.name] for p in self.params))
        return np.asarray(result, dtype=np_dtype(out.dtype))


class MathFunction(Elementwise):
    """A function of the exact-mode math library (backend/mathlib.py) of the same name."""
    compiled = ("f32", "f64")
    costly = True
    host = "the math library is for f32 and f64; f16 is evaluated by NumPy"

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        return e.math(self.name, *args)


# ---------------------------------------------------------------- unary

class Unary(Elementwise):
    """f(x) for each element; by default float tensors only."""
    compiled = FLOAT_DTYPES
    params = (Param("x", Kind.TENSOR),)
    accepts: ClassVar[tuple[str, ...]] = FLOAT_DTYPES
    needs: ClassVar[str] = "a float"
    hint: ClassVar[str] = _FLOAT_HINT

    @property
    def symbol(self) -> str:
        return self.surface or self.name

    guarded: ClassVar[bool] = False      # the local derivative can be inf or NaN

    def infer(self, x: TensorType) -> TensorType:
        return need(x, self.accepts, lambda: f"'{self.symbol}' needs {self.needs} tensor, got {x}"
                    f"{self.hint}", "x")

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        (x,), (y,), (ct,) = op.inputs, op.outputs, cts
        dx = self.backward(b, ct, x, y)
        return (zero_where_ct_is_zero(b, ct, dx) if self.guarded else dx,)

    def backward(self, b: Any, ct: Any, x: Any, y: Any) -> Any:
        """x's cotangent given y = f(x)'s, ct."""
        raise NotImplementedError(f"no VJP rule for '{self.name}'")


class SignedUnary(Unary):
    """A unary primitive that also works on integers."""
    compiled = _COMPILED
    accepts = NUMERIC
    needs = "a numeric"
    hint = ""


def _sigmoid(x: Any) -> Any:
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


def _rsqrt(x: Any) -> Any:
    with np.errstate(divide="ignore"):
        return 1 / np.sqrt(x)


@primitive
class Neg(SignedUnary):
    """-x."""
    name = surface = "neg"
    symbol = "-"
    reference = staticmethod(np.negative)

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        return e.neg(args[0])

    def backward(self, b: Any, ct: Any, x: Any, y: Any) -> Any:
        return b.emit("neg", ct)


@primitive
class Abs(SignedUnary):
    """|x|."""
    name = surface = "abs"
    reference = staticmethod(np.abs)

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        return e.abs(args[0], dtype)

    def backward(self, b: Any, ct: Any, x: Any, y: Any) -> Any:
        return b.emit("mul", ct, b.emit("sign", x))                  # abs'(0) = 0


@primitive
class Sign(SignedUnary):
    """-1, 0 or 1 by the sign of x (NaN stays NaN, and -0.0 gives 0.0, as NumPy)."""
    name = surface = "sign"
    reference = staticmethod(np.sign)
    differentiable = False

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        x, = args
        zero, one = e.const(0, dtype, x), e.const(1, dtype, x)
        rest = e.select(e.compare("==", x, zero, dtype), zero, x)       # NaN stays x
        rest = e.select(e.compare("<", x, zero, dtype), e.neg(one), rest)
        return e.select(e.compare(">", x, zero, dtype), one, rest)


@primitive
class Exp(MathFunction, Unary):
    """e ** x."""
    name = surface = "exp"
    reference = staticmethod(np.exp)

    def backward(self, b: Any, ct: Any, x: Any, y: Any) -> Any:
        return b.emit("mul", ct, y)


@primitive
class Log(MathFunction, Unary):
    """The natural logarithm."""
    name = surface = "log"
    reference = staticmethod(np.log)
    guarded = True

    def backward(self, b: Any, ct: Any, x: Any, y: Any) -> Any:
        return b.emit("div", ct, x)


@primitive
class Exp2(MathFunction, Unary):
    """2 ** x."""
    name = surface = "exp2"
    reference = staticmethod(np.exp2)

    def backward(self, b: Any, ct: Any, x: Any, y: Any) -> Any:
        return b.emit("mul", b.emit("mul", ct, y), _scalar(b, _LN2, y))


@primitive
class Log2(MathFunction, Unary):
    """The base-2 logarithm."""
    name = surface = "log2"
    reference = staticmethod(np.log2)
    guarded = True

    def backward(self, b: Any, ct: Any, x: Any, y: Any) -> Any:
        return b.emit("div", ct, b.emit("mul", x, _scalar(b, _LN2, x)))


@primitive
class Sqrt(Unary):
    """The square root."""
    name = surface = "sqrt"
    reference = staticmethod(np.sqrt)
    guarded = True

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        return e.sqrt(args[0])

    def backward(self, b: Any, ct: Any, x: Any, y: Any) -> Any:
        return b.emit("div", ct, b.emit("mul", y, _scalar(b, 2.0, y)))


@primitive
class Rsqrt(Unary):
    """1 / sqrt(x)."""
    name = surface = "rsqrt"
    reference = staticmethod(_rsqrt)
    guarded = True

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        x, = args
        return e.div(e.const(1.0, dtype, x), e.sqrt(x))

    def backward(self, b: Any, ct: Any, x: Any, y: Any) -> Any:
        cube = b.emit("mul", y, b.emit("mul", y, y))                 # d x^-1/2 = -x^-3/2 / 2
        return b.emit("mul", b.emit("mul", ct, _scalar(b, -0.5, ct)), cube)


@primitive
class Tanh(MathFunction, Unary):
    """The hyperbolic tangent."""
    name = surface = "tanh"
    reference = staticmethod(np.tanh)

    def backward(self, b: Any, ct: Any, x: Any, y: Any) -> Any:
        return b.emit("tanh_grad", y, ct)


@primitive
class Sigmoid(MathFunction, Unary):
    """1 / (1 + exp(-x))."""
    name = surface = "sigmoid"
    reference = staticmethod(_sigmoid)

    def backward(self, b: Any, ct: Any, x: Any, y: Any) -> Any:
        return b.emit("sigmoid_grad", y, ct)


@primitive
class Sin(MathFunction, Unary):
    """The sine (radians)."""
    name = surface = "sin"
    reference = staticmethod(np.sin)

    def backward(self, b: Any, ct: Any, x: Any, y: Any) -> Any:
        return b.emit("mul", ct, b.emit("cos", x))


@primitive
class Cos(MathFunction, Unary):
    """The cosine (radians)."""
    name = surface = "cos"
    reference = staticmethod(np.cos)

    def backward(self, b: Any, ct: Any, x: Any, y: Any) -> Any:
        return b.emit("neg", b.emit("mul", ct, b.emit("sin", x)))


@primitive
class Tan(MathFunction, Unary):
    """The tangent (radians)."""
    name = surface = "tan"
    reference = staticmethod(np.tan)

    def backward(self, b: Any, ct: Any, x: Any, y: Any) -> Any:
        return b.emit("mul", ct, b.emit("add", _scalar(b, 1.0, y), b.emit("mul", y, y)))


@primitive
class Atan(MathFunction, Unary):
    """The arctangent, in (-pi/2, pi/2)."""
    name = surface = "atan"
    reference = staticmethod(np.arctan)

    def backward(self, b: Any, ct: Any, x: Any, y: Any) -> Any:
        return b.emit("div", ct, b.emit("add", _scalar(b, 1.0, x), b.emit("mul", x, x)))


class Arcsine(MathFunction, Unary):
    """asin and acos, whose derivatives are ±1 / sqrt(1 - x²) (infinite at ±1)."""
    guarded = True
    sign: ClassVar[float]

    def backward(self, b: Any, ct: Any, x: Any, y: Any) -> Any:
        root = b.emit("sqrt", b.emit("sub", _scalar(b, 1.0, x), b.emit("mul", x, x)))
        return b.emit("div", b.emit("mul", ct, _scalar(b, self.sign, ct)), root)


@primitive
class Asin(Arcsine):
    """The arcsine, in [-pi/2, pi/2]; NaN outside [-1, 1]."""
    name = surface = "asin"
    reference = staticmethod(np.arcsin)
    sign = 1.0


@primitive
class Acos(Arcsine):
    """The arccosine, in [0, pi]; NaN outside [-1, 1]."""
    name = surface = "acos"
    reference = staticmethod(np.arccos)
    sign = -1.0


@primitive
class Sinh(MathFunction, Unary):
    """The hyperbolic sine."""
    name = surface = "sinh"
    reference = staticmethod(np.sinh)

    def backward(self, b: Any, ct: Any, x: Any, y: Any) -> Any:
        return b.emit("mul", ct, b.emit("cosh", x))


@primitive
class Cosh(MathFunction, Unary):
    """The hyperbolic cosine."""
    name = surface = "cosh"
    reference = staticmethod(np.cosh)

    def backward(self, b: Any, ct: Any, x: Any, y: Any) -> Any:
        return b.emit("mul", ct, b.emit("sinh", x))


@primitive
class Log1p(MathFunction, Unary):
    """log(1 + x), accurate for x near 0."""
    name = surface = "log1p"
    reference = staticmethod(np.log1p)
    guarded = True

    def backward(self, b: Any, ct: Any, x: Any, y: Any) -> Any:
        return b.emit("div", ct, b.emit("add", x, _scalar(b, 1.0, x)))


@primitive
class Expm1(MathFunction, Unary):
    """exp(x) - 1, accurate for x near 0."""
    name = surface = "expm1"
    reference = staticmethod(np.expm1)

    def backward(self, b: Any, ct: Any, x: Any, y: Any) -> Any:
        return b.emit("mul", ct, b.emit("add", y, _scalar(b, 1.0, y)))


def _erf(x: Any) -> Any:
    from scipy import special                    # (imported once a program uses it)
    return special.erf(x)


def _erfc(x: Any) -> Any:
    from scipy import special
    return special.erfc(x)


_TWO_OVER_ROOT_PI = 1.1283791670955126


class ErrorFunction(MathFunction, Unary):
    """erf and erfc, whose derivatives are ±2/sqrt(pi) exp(-x²)."""
    sign: ClassVar[float]

    def backward(self, b: Any, ct: Any, x: Any, y: Any) -> Any:
        density = b.emit("exp", b.emit("neg", b.emit("mul", x, x)))
        return b.emit("mul", b.emit("mul", ct, density), _scalar(b, self.sign * _TWO_OVER_ROOT_PI, x))


@primitive
class Erf(ErrorFunction):
    """The error function, 2/sqrt(pi) times the integral of exp(-t²) from 0 to x."""
    name = surface = "erf"
    reference = staticmethod(_erf)
    sign = 1.0


@primitive
class Erfc(ErrorFunction):
    """1 - erf(x), accurate where erf(x) is near 1."""
    name = surface = "erfc"
    reference = staticmethod(_erfc)
    sign = -1.0


class Rounding(Unary):
    """An integer near x, as a float, by the LLVM intrinsic `intrinsic` (exact on every target:
    IEEE's roundToIntegral operations); its derivative is 0 almost everywhere."""
    intrinsic: ClassVar[str]
    differentiable = False

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        return e.intrinsic(self.intrinsic, args[0])


@primitive
class Floor(Rounding):
    """The largest integer not above x, as a float."""
    name = surface = "floor"
    reference = staticmethod(np.floor)
    intrinsic = "llvm.floor"


@primitive
class Ceil(Rounding):
    """The smallest integer not below x, as a float."""
    name = surface = "ceil"
    reference = staticmethod(np.ceil)
    intrinsic = "llvm.ceil"


@primitive
class Trunc(Rounding):
    """x rounded toward zero, as a float."""
    name = surface = "trunc"
    reference = staticmethod(np.trunc)
    intrinsic = "llvm.trunc"


@primitive
class Round(Rounding):
    """x rounded to the nearest integer, halves to even (as NumPy and PyTorch), as a float."""
    name = surface = "round"
    reference = staticmethod(np.round)
    intrinsic = "llvm.roundeven"


class Classify(Unary):
    """A bool tensor: whether each element of x is of a class of floats (integers never are
    NaN or infinite)."""
    accepts = NUMERIC
    needs = "a numeric"
    hint = ""
    compiled = ("bool",)
    differentiable = False
    of_integers: ClassVar[bool]            # the answer for every integer

    def infer(self, x: TensorType) -> TensorType:
        return super().infer(x).with_dtype("bool")

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        x, = args
        if dtypes[0] not in FLOAT_DTYPES:
            return e.const(self.of_integers, "bool", x)
        return self.classify(e, x, e.const(float("inf"), dtypes[0], x), dtypes[0])

    def classify(self, e: Any, x: Any, inf: Any, dtype: str) -> Any:
        """The answer for a float x, given +inf of its dtype."""
        raise NotImplementedError


@primitive
class IsNan(Classify):
    """Whether x is NaN."""
    name = surface = "isnan"
    reference = staticmethod(np.isnan)
    of_integers = False

    def classify(self, e: Any, x: Any, inf: Any, dtype: str) -> Any:
        return e.isnan(x)


@primitive
class IsInf(Classify):
    """Whether x is +inf or -inf."""
    name = surface = "isinf"
    reference = staticmethod(np.isinf)
    of_integers = False

    def classify(self, e: Any, x: Any, inf: Any, dtype: str) -> Any:
        return e.compare("==", e.abs(x, dtype), inf, dtype)


@primitive
class IsFinite(Classify):
    """Whether x is neither NaN nor infinite."""
    name = surface = "isfinite"
    reference = staticmethod(np.isfinite)
    of_integers = True

    def classify(self, e: Any, x: Any, inf: Any, dtype: str) -> Any:
        return e.compare("<", e.abs(x, dtype), inf, dtype)             # false for NaN


# ---------------------------------------------------------------- binary

class Binary(Elementwise):
    """a op b with NumPy broadcasting; by default numeric operands, result in their dtype."""
    params = (Param("a", Kind.TENSOR), Param("b", Kind.TENSOR))
    symbol: ClassVar[str]                          # the operator or function name, for messages
    accepts: ClassVar[tuple[str, ...]] = NUMERIC
    needs: ClassVar[str] = "numeric"
    hint: ClassVar[str] = "; use cast()"
    result_dtype: ClassVar[str | None] = None      # None: the operands' dtype
    guarded: ClassVar[bool] = False                # a local derivative can be inf or NaN

    def infer(self, a: TensorType, b: TensorType) -> TensorType:
        dtype, weak = common_dtype(self.symbol, [("a", a), ("b", b)])
        if dtype not in self.accepts:          # (the message is built only when it is needed)
            message = f"'{self.symbol}' needs {self.needs} operands, got {a} and {b}{self.hint}"
            dtype = need(TensorType(dtype, (), weak), self.accepts, message, None).dtype
        return TensorType(self.result_dtype or dtype, broadcast_shapes(a, b), weak)

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        (lhs, rhs), (y,), (ct,) = op.inputs, op.outputs, cts
        grads = self.backward(b, ct, lhs, rhs, y)
        if self.guarded:
            grads = tuple(zero_where_ct_is_zero(b, ct, g) for g in grads)
        return tuple(unbroadcast(b, g, v.shape) for g, v in zip(grads, (lhs, rhs)))

    def backward(self, b: Any, ct: Any, lhs: Any, rhs: Any, y: Any) -> tuple[Any, Any]:
        """The operands' cotangents at the result's shape, given y = lhs op rhs's, ct."""
        raise NotImplementedError(f"no VJP rule for '{self.name}'")


class FusedGrad(Binary):
    """The backward of an activation from its output y and the cotangent ct, as one op (one
    pass over memory, like PyTorch's tanh_backward); IR only."""
    params = (Param("y", Kind.TENSOR), Param("ct", Kind.TENSOR))
    accepts = FLOAT_DTYPES
    needs = "float"
    compiled = FLOAT_DTYPES

    def infer(self, y: TensorType, ct: TensorType) -> TensorType:
        return super().infer(y, ct)

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        (y, ct), (g,) = op.inputs, cts
        return self.backward(b, g, y, ct, op.outputs[0])


@primitive
class TanhGrad(FusedGrad):
    """ct * (1 - y * y): tanh's derivative at the x where tanh(x) = y, times ct."""
    name, symbol = "tanh_grad", "tanh_grad"
    reference = staticmethod(lambda y, ct: ct * (1 - y * y))

    def backward(self, b: Any, g: Any, y: Any, ct: Any, out: Any) -> tuple[Any, Any]:
        dy = b.emit("mul", b.emit("mul", g, ct), b.emit("mul", y, _scalar(b, -2.0, y)))
        return dy, b.emit("tanh_grad", y, g)

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        y, ct = args
        return e.mul(ct, e.sub(e.const(1.0, dtype, y), e.mul(y, y)))


@primitive
class SigmoidGrad(FusedGrad):
    """ct * y * (1 - y): sigmoid's derivative at the x where sigmoid(x) = y, times ct."""
    name, symbol = "sigmoid_grad", "sigmoid_grad"
    reference = staticmethod(lambda y, ct: ct * y * (1 - y))

    def backward(self, b: Any, g: Any, y: Any, ct: Any, out: Any) -> tuple[Any, Any]:
        slope = b.emit("sub", _scalar(b, 1.0, y), b.emit("mul", y, _scalar(b, 2.0, y)))
        return b.emit("mul", b.emit("mul", g, ct), slope), b.emit("sigmoid_grad", y, g)

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        y, ct = args
        return e.mul(e.mul(ct, y), e.sub(e.const(1.0, dtype, y), y))


@primitive
class Add(Binary):
    """a + b."""
    name, symbol = "add", "+"
    reference = staticmethod(np.add)

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        return e.add(*args)

    def backward(self, b: Any, ct: Any, lhs: Any, rhs: Any, y: Any) -> tuple[Any, Any]:
        return ct, ct


@primitive
class Sub(Binary):
    """a - b."""
    name, symbol = "sub", "-"
    reference = staticmethod(np.subtract)

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        return e.sub(*args)

    def backward(self, b: Any, ct: Any, lhs: Any, rhs: Any, y: Any) -> tuple[Any, Any]:
        return ct, b.emit("neg", ct)


@primitive
class Mul(Binary):
    """a * b."""
    name, symbol = "mul", "*"
    reference = staticmethod(np.multiply)

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        return e.mul(*args)

    def backward(self, b: Any, ct: Any, lhs: Any, rhs: Any, y: Any) -> tuple[Any, Any]:
        return b.emit("mul", ct, rhs), b.emit("mul", ct, lhs)


@primitive
class Div(Binary):
    """a / b, true division of floats."""
    name, symbol = "div", "/"
    reference = staticmethod(np.true_divide)
    accepts = FLOAT_DTYPES
    needs = "float"
    hint = "; use '//' for integer division, or cast() to a float dtype"
    guarded = True
    compiled = FLOAT_DTYPES

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        return e.div(*args)

    def backward(self, b: Any, ct: Any, lhs: Any, rhs: Any, y: Any) -> tuple[Any, Any]:
        return (b.emit("div", ct, rhs),
                b.emit("div", b.emit("mul", b.emit("neg", ct), lhs), b.emit("mul", rhs, rhs)))


class IntegerDivision(Binary):
    """// or %: NumPy's rules, for integers and for floats (from an exact fmod: the math
    library's in kernels, arith.remf in MLIR)."""
    part: ClassVar[int]                            # of the floor division: 0 quotient, 1 remainder

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        divmod_ = _floor_divmod if dtype in INT_DTYPES else _float_floor_divmod
        return divmod_(e, *args, dtype)[self.part]


@primitive
class Mod(IntegerDivision):
    """a % b with Python's sign rule (the result takes b's sign)."""
    name, symbol = "mod", "%"
    reference = staticmethod(np.mod)
    part = 1

    def backward(self, b: Any, ct: Any, lhs: Any, rhs: Any, y: Any) -> tuple[Any, Any]:
        return ct, b.emit("neg", b.emit("mul", ct, b.emit("floordiv", lhs, rhs)))


@primitive
class FloorDiv(IntegerDivision):
    """a // b, rounding toward minus infinity as in Python."""
    name, symbol = "floordiv", "//"
    reference = staticmethod(np.floor_divide)
    differentiable = False
    part = 0


def _floor_divmod(e: Any, a: Any, b: Any, dtype: str) -> tuple[Any, Any]:
    """a // b and a % b of integers as NumPy computes them: the quotient rounded toward minus
    infinity (the remainder takes b's sign), both 0 for a divisor of 0, and the least value
    // -1 wrapping round to itself."""
    zero, one = e.const(0, dtype, a), e.const(1, dtype, a)
    by_zero = e.compare("==", b, zero, dtype)
    undefined = by_zero                    # what LLVM's division leaves undefined
    if dtype != "u32":
        least = e.const(-2 ** (np.iinfo(np_dtype(dtype)).bits - 1), dtype, a)
        wraps = e.and_(e.compare("==", a, least, dtype), e.compare("==", b, e.const(-1, dtype, a), dtype))
        undefined = e.or_(by_zero, wraps)
    d = e.select(undefined, one, b)        # a / 1 is a, remainder 0: right for the least // -1
    q, r = e.quotient(a, d, dtype), e.remainder(a, d, dtype)
    if dtype != "u32":                     # toward zero → toward minus infinity
        other_sign = e.xor(e.compare("<", r, zero, dtype), e.compare("<", d, zero, dtype))
        over = e.and_(e.compare("!=", r, zero, dtype), other_sign)
        q, r = e.select(over, e.sub(q, one), q), e.select(over, e.add(r, d), r)
    return e.select(by_zero, zero, q), r


def _float_floor_divmod(e: Any, a: Any, b: Any, dtype: str) -> tuple[Any, Any]:
    """a // b and a % b of floats as NumPy computes them (its npy_divmod; in f32 for f16 and
    bf16): from r = fmod(a, b), exact, the quotient (a - r) / b, both moved down by one b where
    r is not 0 and its sign is not b's, the quotient snapped to an integer (floor, + 1 past a
    half); a zero remainder takes b's sign, a zero quotient that of a / b. A divisor of 0
    gives a / b and NaN."""
    wide = "f32" if dtype in ("f16", "bf16") else dtype
    a, b = e.cast(a, dtype, wide), e.cast(b, dtype, wide)
    zero, one, half = (e.const(v, wide, a) for v in (0.0, 1.0, 0.5))
    ratio, r = e.div(a, b), e.remainder(a, b, wide)
    q = e.div(e.sub(a, r), b)
    nonzero = e.compare("!=", r, zero, wide)                      # (NaN too, as C's `if (r)`)
    moves = e.and_(nonzero, e.xor(e.compare("<", b, zero, wide), e.compare("<", r, zero, wide)))
    r = e.select(moves, e.add(r, b), e.select(nonzero, r, e.intrinsic("llvm.copysign", zero, b)))
    q = e.select(moves, e.sub(q, one), q)
    floor = e.intrinsic("llvm.floor", q)
    snapped = e.select(e.compare(">", e.sub(q, floor), half, wide), e.add(floor, one), floor)
    q = e.select(e.compare("!=", q, zero, wide), snapped, e.intrinsic("llvm.copysign", zero, ratio))
    q = e.select(e.compare("==", b, zero, wide), ratio, q)
    return e.cast(q, wide, dtype), e.cast(r, wide, dtype)


def _power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C99's pow (NumPy's power), whose error for an integer to a negative power is the
    program's. The exponent is never a scalar: for one (or a broadcast one), NumPy computes
    x ** 0.5 as sqrt(x), which gives -0.0 and NaN where pow gives +0.0 and +inf."""
    if np.asarray(b).dtype.kind in "iu" and np.any(np.asarray(b) < 0):
        raise ArithmeticError("an integer to a negative integer power has no integer value; "
                              "cast to a float first")
    shape = np.broadcast_shapes(np.shape(a), np.shape(b))
    exponent = np.array(np.broadcast_to(b, shape), ndmin=1)     # not a view of strides 0 either
    return np.power(a, exponent).reshape(shape)


@primitive
class Pow(MathFunction, Binary):
    """a ** b (NumPy's power: integers to negative integer powers are an error)."""
    name, symbol = "pow", "**"
    reference = staticmethod(_power)
    guarded = True
    host = "integer powers, and f16, are evaluated by NumPy"

    def backward(self, b: Any, ct: Any, lhs: Any, rhs: Any, y: Any) -> tuple[Any, Any]:
        zero = _scalar(b, 0.0, y)
        slope = b.emit("mul", rhs, b.emit("pow", lhs, b.emit("sub", rhs, _scalar(b, 1.0, y))))
        dx = b.emit("where", b.emit("eq", rhs, zero), zero, b.emit("mul", ct, slope))
        # d(x ** y)/dy = x ** y * log(x), taken as 0 where x = 0 and y >= 0 (as PyTorch)
        flat = b.emit("and", b.emit("eq", lhs, zero), b.emit("ge", rhs, zero))
        dy = b.emit("mul", ct, b.emit("where", flat, zero, b.emit("mul", y, b.emit("log", lhs))))
        return dx, dy


@primitive
class Atan2(MathFunction, Binary):
    """The angle of the point (b, a) from the positive x axis, in [-pi, pi]: atan2(y, x) with
    the signs of both (C99's, with its special cases)."""
    name = surface = symbol = "atan2"
    reference = staticmethod(np.arctan2)
    accepts = FLOAT_DTYPES
    needs = "float"
    hint = _FLOAT_HINT
    guarded = True

    def backward(self, b: Any, ct: Any, lhs: Any, rhs: Any, y: Any) -> tuple[Any, Any]:
        r2 = b.emit("add", b.emit("mul", lhs, lhs), b.emit("mul", rhs, rhs))
        return (b.emit("div", b.emit("mul", ct, rhs), r2),
                b.emit("div", b.emit("neg", b.emit("mul", ct, lhs)), r2))


def _extreme_cts(b: Any, ct: Any, mine: Any, other: Any, loses: str) -> Any:
    """An operand's cotangent in maximum or minimum: ct where it wins, half of ct where it
    ties (as PyTorch), 0 where it loses by the comparison `loses`; a NaN operand gets all."""
    lost = b.emit("where", b.emit(loses, mine, other), _scalar(b, 0.0, ct), ct)
    half = b.emit("mul", ct, _scalar(b, 0.5, ct))
    return b.emit("where", b.emit("eq", mine, other), half, lost)


@primitive
class Maximum(Binary):
    """The larger of a and b; NaN if either is NaN; of equal values (-0.0 and 0.0), a."""
    name = surface = symbol = "maximum"
    reference = staticmethod(numerics.maximum)

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        return e.select(_keeps(e, ">=", *args, dtype), *args)

    def backward(self, b: Any, ct: Any, lhs: Any, rhs: Any, y: Any) -> tuple[Any, Any]:
        return _extreme_cts(b, ct, lhs, rhs, "lt"), _extreme_cts(b, ct, rhs, lhs, "lt")


@primitive
class Minimum(Binary):
    """The smaller of a and b; NaN if either is NaN; of equal values (-0.0 and 0.0), a."""
    name = surface = symbol = "minimum"
    reference = staticmethod(numerics.minimum)

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        return e.select(_keeps(e, "<=", *args, dtype), *args)

    def backward(self, b: Any, ct: Any, lhs: Any, rhs: Any, y: Any) -> tuple[Any, Any]:
        return _extreme_cts(b, ct, lhs, rhs, "gt"), _extreme_cts(b, ct, rhs, lhs, "gt")


def _keeps(e: Any, order: str, a: Any, b: Any, dtype: str) -> Any:
    """Whether maximum (order '>=') or minimum ('<=') of a and b is a: where a wins or ties,
    or is NaN."""
    wins = e.compare(order, a, b, dtype)
    return e.or_(wins, e.isnan(a)) if dtype in FLOAT_DTYPES else wins


class Comparison(Binary):
    """a compared with b, a bool tensor."""
    accepts = DTYPES
    result_dtype = "bool"
    differentiable = False

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        return e.compare(self.symbol, *args, dtypes[0])


@primitive
class Eq(Comparison):
    """a == b."""
    name, symbol = "eq", "=="
    reference = staticmethod(np.equal)


@primitive
class Ne(Comparison):
    """a != b."""
    name, symbol = "ne", "!="
    reference = staticmethod(np.not_equal)


@primitive
class Lt(Comparison):
    """a < b."""
    name, symbol = "lt", "<"
    reference = staticmethod(np.less)


@primitive
class Le(Comparison):
    """a <= b."""
    name, symbol = "le", "<="
    reference = staticmethod(np.less_equal)


@primitive
class Gt(Comparison):
    """a > b."""
    name, symbol = "gt", ">"
    reference = staticmethod(np.greater)


@primitive
class Ge(Comparison):
    """a >= b."""
    name, symbol = "ge", ">="
    reference = staticmethod(np.greater_equal)


class Bitwise(Binary):
    """Logic on bool tensors, bit by bit on integers."""
    accepts = INT_DTYPES + ("bool",)
    needs = "bool or integer"
    hint = ""
    differentiable = False


@primitive
class And(Bitwise):
    """a & b."""
    name, symbol = "and", "&"
    reference = staticmethod(np.bitwise_and)

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        return e.and_(*args)


@primitive
class Or(Bitwise):
    """a | b."""
    name, symbol = "or", "|"
    reference = staticmethod(np.bitwise_or)

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        return e.or_(*args)


@primitive
class Xor(Bitwise):
    """a ^ b."""
    name, symbol = "xor", "^"
    reference = staticmethod(np.bitwise_xor)

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        return e.xor(*args)


class Shift(Bitwise):
    """A bit shift of integers, as NumPy's (npy_lshift, npy_rshift): a count that is negative
    or not less than the dtype's bits shifts every bit out."""
    accepts = INT_DTYPES
    needs = "integer"

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        a, n = args
        last = e.const(np.iinfo(np_dtype(dtype)).bits - 1, dtype, a)
        inside = e.compare("<=", n, last, "u32")     # unsigned, so a negative count is outside
        shifted = self.shift(e, a, e.select(inside, n, last), dtype)    # a count LLVM defines
        if self.fills_with_sign(dtype):              # a >> last is every bit a's sign already
            return shifted
        return e.select(inside, shifted, e.const(0, dtype, a))

    def shift(self, e: Any, a: Any, n: Any, dtype: str) -> Any:
        """a shifted by a count n less than its bits."""
        raise NotImplementedError

    def fills_with_sign(self, dtype: str) -> bool:
        """Whether shifting all bits out leaves copies of the sign bit rather than zeros."""
        return False


@primitive
class Shl(Shift):
    """a << b."""
    name, symbol = "shl", "<<"
    reference = staticmethod(np.left_shift)

    def shift(self, e: Any, a: Any, n: Any, dtype: str) -> Any:
        return e.shl(a, n)


@primitive
class Shr(Shift):
    """a >> b (arithmetic for signed dtypes)."""
    name, symbol = "shr", ">>"
    reference = staticmethod(np.right_shift)

    def shift(self, e: Any, a: Any, n: Any, dtype: str) -> Any:
        return e.shr(a, n, dtype)

    def fills_with_sign(self, dtype: str) -> bool:
        return dtype != "u32"


# ---------------------------------------------------------------- where, cast

@primitive
class Where(Elementwise):
    """a where cond holds, else b; all three broadcast together."""
    name = surface = "where"
    params = (Param("cond", Kind.TENSOR), Param("a", Kind.TENSOR), Param("b", Kind.TENSOR))
    reference = staticmethod(np.where)

    def infer(self, cond: TensorType, a: TensorType, b: TensorType) -> TensorType:
        if cond.dtype != "bool":
            raise OpError(f"where needs a bool condition, got {cond}; compare to make one, "
                          "as in where(x > 0, x, 0.0)", "cond")
        dtype, weak = common_dtype("where", [("a", a), ("b", b)])
        return TensorType(dtype, broadcast_shapes(cond, a, b), weak)

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        return e.select(*args)

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        (cond, lhs, rhs), (ct,) = op.inputs, cts
        zero = _scalar(b, 0.0, ct)                  # zeros, never NaN, in the untaken branch
        return (None, unbroadcast(b, b.emit("where", cond, ct, zero), lhs.shape),
                unbroadcast(b, b.emit("where", cond, zero, ct), rhs.shape))


@primitive
class Clip(Elementwise):
    """x limited to [lo, hi]: minimum(maximum(x, lo), hi), as NumPy's clip (NaN in any gives
    NaN); its gradient, as PyTorch's clamp: x's where lo <= x <= hi (not at a NaN), lo's where
    it wins, hi's where it does."""
    name = surface = "clip"
    params = (Param("x", Kind.TENSOR), Param("lo", Kind.TENSOR), Param("hi", Kind.TENSOR))
    reference = staticmethod(lambda x, lo, hi: numerics.minimum(numerics.maximum(x, lo), hi))

    def infer(self, x: TensorType, lo: TensorType, hi: TensorType) -> TensorType:
        dtype, weak = common_dtype("clip", [("x", x), ("lo", lo), ("hi", hi)])
        if dtype == "bool":
            raise OpError(f"'clip' needs numeric tensors, got {x}; use cast()", "x")
        return TensorType(dtype, broadcast_shapes(x, lo, hi), weak)

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        x, lo, hi = args
        pair = [dtype, dtype]
        return Minimum().scalar(e, [Maximum().scalar(e, [x, lo], pair, dtype, {}), hi], pair, dtype, {})

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        (x, lo, hi), (ct,) = op.inputs, cts
        zero = _scalar(b, 0.0, ct)
        takes = lambda cond: b.emit("where", cond, ct, zero)                  # noqa: E731
        inside = b.emit("and", b.emit("ge", x, lo), b.emit("le", x, hi))
        below = b.emit("and", b.emit("lt", x, lo), b.emit("le", lo, hi))
        above = b.emit("or", b.emit("gt", x, hi), b.emit("gt", lo, hi))   # (lo > hi: always hi)
        return tuple(unbroadcast(b, takes(c), v.shape) for c, v in zip((inside, below, above), op.inputs))


def _cast(x: Any, dtype: str) -> np.ndarray:
    x = np.asarray(x)
    if dtype_name(x.dtype) == "bf16" and dtype not in FLOAT_DTYPES:
        # through its exact f32: ml_dtypes' own conversion gives 0 for NaN, ±inf and values out
        # of the integer's range, where f32's (NumPy's) gives what the f32 of the same value gives
        x = x.astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):   # NaN, ±inf, out of range: docs/numerics.md
        return x.astype(np_dtype(dtype))


@primitive
class Cast(Primitive):
    """x converted to dtype (floats to integers truncate toward zero; nonzero is True). The
    kernels give NaN and floats out of an i32's or i64's range its least value."""
    name = surface = "cast"
    params = (Param("x", Kind.TENSOR), Param("dtype", Kind.DTYPE))
    reference = staticmethod(_cast)
    evaluate = staticmethod(_cast)
    role = Role.ELEMENTWISE
    host = "float to u32 casts are evaluated by NumPy"
    mlir = Elementwise.mlir          # arith's casts (fptosi truncates toward zero, as NumPy)

    def compiles(self, dtypes: list[str], dtype: str) -> bool:
        src, = dtypes
        return "bf16" not in (src, dtype) and not (src in FLOAT_DTYPES and dtype == "u32")

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        return e.cast(args[0], dtypes[0], dtype)

    def infer(self, x: TensorType, dtype: str) -> TensorType:
        return x.with_dtype(dtype)

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        """Float to float casts the cotangent back; to or from an integer, no gradient."""
        (x,), (y,) = op.inputs, op.outputs
        if x.dtype in FLOAT_DTYPES and y.dtype in FLOAT_DTYPES:
            return (b.emit("cast", cts[0], dtype=x.dtype),)
        return (None,)
