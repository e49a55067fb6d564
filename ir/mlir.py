"""The tensor IR as MLIR in upstream dialects (func, arith, math, tensor, linalg, scf).

Each primitive writes itself (`Primitive.mlir`, in its module in ir/ops); this module holds what
they write with: a `Writer` of one function's ops (SSA names, types, locations, and the linalg
shapes every family uses) and a `Body`, the scalar emitter of a linalg region, which speaks
the vocabulary of backend/llvm.py's Emitter so that an elementwise primitive's `scalar` body
is its MLIR too."""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ir.types import FLOAT_DTYPES

if TYPE_CHECKING:
    from ir.core import Function, Op, Value

ELEMENT = {"f16": "f16", "bf16": "bf16", "f32": "f32", "f64": "f64", "i32": "i32",
           "i64": "i64", "u32": "i32", "bool": "i1", "index": "index"}
_BITS = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64, "i32": 32, "u32": 32, "i64": 64, "bool": 1}
# the exact-mode math library's functions (backend/mathlib.py) as math-dialect operations
_MATH = {"exp": "math.exp", "exp2": "math.exp2", "log": "math.log", "log2": "math.log2",
         "tanh": "math.tanh", "sin": "math.sin", "cos": "math.cos", "tan": "math.tan",
         "atan": "math.atan", "asin": "math.asin", "acos": "math.acos", "sinh": "math.sinh",
         "cosh": "math.cosh", "log1p": "math.log1p", "expm1": "math.expm1", "erf": "math.erf",
         "erfc": "math.erfc", "atan2": "math.atan2", "pow": "math.powf"}
_INTRINSICS = {"llvm.floor": "math.floor", "llvm.ceil": "math.ceil", "llvm.trunc": "math.trunc",
               "llvm.roundeven": "math.roundeven", "llvm.copysign": "math.copysign"}
_PREDICATES = {"==": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}


class NotExpressible(Exception):
    """An op this exporter cannot write in MLIR yet; the API reports it at the op's origin."""

    def __init__(self, what: str, origin: Any = None):
        super().__init__(f"not expressible in MLIR yet: {what}")
        self.origin = origin


def tensor_type(shape: Sequence[int], dtype: str) -> str:
    dims = "".join(f"{n}x" for n in shape)
    return f"tensor<{dims}{ELEMENT[dtype]}>"


def type_of(v: Value) -> str:
    return tensor_type(v.shape, v.dtype)


def literal(value: Any, dtype: str) -> str:
    """A scalar as an MLIR attribute of dtype: exact decimals, bit patterns for inf and NaN."""
    if dtype == "bool":
        return "true" if value else "false"
    if dtype == "u32":                         # MLIR's i32 is signless: its signed reading
        return str(int(np.uint32(int(value) & 0xFFFFFFFF).view(np.int32)))
    if dtype not in FLOAT_DTYPES:
        return str(int(value))
    # (NumPy has no bf16: its literal is the f32 decimal, which MLIR rounds to bf16)
    x = np.array(value, dtype={"f16": np.float16, "bf16": np.float32, "f32": np.float32,
                               "f64": np.float64}[dtype])
    if not np.isfinite(x):
        return "0x" + x.tobytes()[::-1].hex().upper()
    mantissa, e, exponent = repr(float(x)).partition("e")   # MLIR's floats need a point: 1.0e-12
    return mantissa + ("" if "." in mantissa else ".0") + e + exponent


@dataclass(frozen=True)
class S:
    """A scalar SSA value inside a region, and its element dtype."""
    name: str
    dtype: str

    @property
    def type(self) -> str:
        return ELEMENT[self.dtype]

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES


class Body:
    """The scalar operations of a linalg region, in the vocabulary of backend/llvm.py's
    Emitter: what an elementwise primitive's `scalar` builds (ir/ops: `Primitive.scalar`)."""

    def __init__(self, w: Writer):
        self.w = w

    def _op(self, text: str, dtype: str, hint: str = "") -> S:
        name = self.w.fresh(hint)
        self.w.line(f"{name} = {text}", located=False)
        return S(name, dtype)

    def const(self, value: Any, dtype: str, like: S | None = None) -> S:
        return self.w.scalar_constant(value, dtype)

    def _arith(self, f: str, i: str, x: S, y: S) -> S:
        return self._op(f"arith.{f if x.is_float else i} {x.name}, {y.name} : {x.type}", x.dtype)

    def add(self, x: S, y: S) -> S:
        return self._arith("addf", "addi", x, y)

    def sub(self, x: S, y: S) -> S:
        return self._arith("subf", "subi", x, y)

    def mul(self, x: S, y: S) -> S:
        """x * y rounded once. A float product is math.fma(x, y, -0.0), the same bits: IREE's
        llvm-cpu marks every arith.mulf and addf contractable, and LLVM would fuse a product
        and the sum that uses it into one fma where dslc rounds twice."""
        if not x.is_float:
            return self._arith("mulf", "muli", x, y)
        zero = self.const(-0.0, x.dtype)
        return self._op(f"math.fma {x.name}, {y.name}, {zero.name} : {x.type}", x.dtype)

    def div(self, x: S, y: S) -> S:
        return self._arith("divf", "divsi", x, y)

    def quotient(self, x: S, y: S, dtype: str) -> S:
        return self._op(f"arith.{'divui' if dtype == 'u32' else 'divsi'} {x.name}, {y.name} : {x.type}", x.dtype)

    def remainder(self, x: S, y: S, dtype: str) -> S:
        """x - y * quotient(x, y), the sign of x; of floats, C's fmod (exact)."""
        if dtype == "f64":
            return self._fmod64(x, y)
        op = "remf" if x.is_float else "remui" if dtype == "u32" else "remsi"
        return self._op(f"arith.{op} {x.name}, {y.name} : {x.type}", x.dtype)

    def _fmod64(self, x: S, y: S) -> S:
        """fmod of f64, exactly, without arith.remf (IREE's llvm-cpu leaves it a call to the C
        library's fmod, which its executables do not link): an scf.while that takes from |x|,
        while |x| ≥ |y|, n copies of |y|·2^k (k makes n < 2^53; n from the rounded quotient,
        at most one too many, put back) by one fma, exact, so 52 bits of quotient a step; then
        x's sign. A NaN, x infinite or y 0 give glibc's NaN: x's, else y's, else the default."""
        f64, i64, w = "f64", "i64", self.w

        def bits(v: S) -> S:
            return self._op(f"arith.bitcast {v.name} : f64 to i64", i64)
        ax, ay, zero = self.abs(x, f64), self.abs(y, f64), self.const(0.0, f64)
        finite = self.compare("<", ax, self.const(math.inf, f64), f64)
        valid = self.and_(self.and_(finite, self.compare("==", y, y, f64)),
                          self.compare("!=", ay, zero, f64))
        y_bits = bits(ay)
        left, start, r = w.fresh("fmod"), w.fresh("x"), S(w.fresh("x"), f64)
        w.line(f"{left} = scf.while ({start} = {self.select(valid, ax, zero).name}) : (f64) -> f64 "
               "{", located=False)
        w.region(lambda: w.line(f"scf.condition({self.compare('>=', S(start, f64), ay, f64).name})"
                                f" {start} : f64", located=False))
        w.line("} do {", located=False)
        w.lines.append("  " * w.depth + f"^bb0({r.name}: f64):")

        def step() -> None:
            gap = self.sub(self.sub(self.shift_right(bits(r), 52), self.shift_right(y_bits, 52)),
                           self.const(52, i64))
            k = self._op(f"arith.maxsi {gap.name}, {self.const(0, i64).name} : i64", i64)
            y_k = self._op(f"arith.bitcast {self.add(y_bits, self.shift_left(k, 52)).name} : i64 "
                           "to f64", f64)
            n = self.intrinsic("llvm.trunc", self.div(r, y_k))
            less = self._op(f"math.fma {self.neg(n).name}, {y_k.name}, {r.name} : f64", f64)
            kept = self.select(self.compare("<", less, zero, f64), self.add(less, y_k), less)
            w.line(f"scf.yield {kept.name} : f64", located=False)
        w.region(step)
        w.line("}", located=False)
        nan = self.select(self.isnan(x), x, self.select(self.isnan(y), y, self.const(-math.nan, f64)))
        return self.select(valid, self.intrinsic("llvm.copysign", S(left, f64), x), nan)

    def neg(self, x: S) -> S:
        if x.is_float:
            return self._op(f"arith.negf {x.name} : {x.type}", x.dtype)
        return self.sub(self.const(0, x.dtype), x)

    def abs(self, x: S, dtype: str) -> S:
        op = "math.absf" if x.is_float else "math.absi"
        return self._op(f"{op} {x.name} : {x.type}", x.dtype)

    def compare(self, symbol: str, x: S, y: S, dtype: str) -> S:
        """As the Emitter's: ordered for floats but for != (NaN != NaN); unsigned for u32, bool."""
        if x.is_float:
            pred = ("u" if symbol == "!=" else "o") + _PREDICATES[symbol]
            return self._op(f"arith.cmpf {pred}, {x.name}, {y.name} : {x.type}", "bool")
        pred = _PREDICATES[symbol]
        if pred not in ("eq", "ne"):
            pred = ("u" if dtype in ("u32", "bool") else "s") + pred
        return self._op(f"arith.cmpi {pred}, {x.name}, {y.name} : {x.type}", "bool")

    def isnan(self, x: S) -> S:
        return self._op(f"arith.cmpf uno, {x.name}, {x.name} : {x.type}", "bool")

    def and_(self, x: S, y: S) -> S:
        return self._op(f"arith.andi {x.name}, {y.name} : {x.type}", x.dtype)

    def or_(self, x: S, y: S) -> S:
        return self._op(f"arith.ori {x.name}, {y.name} : {x.type}", x.dtype)

    def xor(self, x: S, y: S) -> S:
        return self._op(f"arith.xori {x.name}, {y.name} : {x.type}", x.dtype)

    def shift_right(self, x: S, n: int) -> S:
        """x >> n, unsigned (a word of Philox)."""
        return self._op(f"arith.shrui {x.name}, {self.const(n, x.dtype).name} : {x.type}", x.dtype)

    def shift_left(self, x: S, n: int) -> S:
        return self._op(f"arith.shli {x.name}, {self.const(n, x.dtype).name} : {x.type}", x.dtype)

    def shl(self, x: S, n: S) -> S:
        """As the Emitter's: n is less than x's bits."""
        return self._op(f"arith.shli {x.name}, {n.name} : {x.type}", x.dtype)

    def shr(self, x: S, n: S, dtype: str) -> S:
        op = "shrui" if dtype == "u32" else "shrsi"
        return self._op(f"arith.{op} {x.name}, {n.name} : {x.type}", x.dtype)

    def mul_wide(self, x: S, y: S) -> tuple[S, S]:
        """The high and low words of the unsigned product x * y (Philox's mulhilo), through
        i64: IREE's llvm-cpu cannot lower arith.mului_extended once it vectorises it."""
        wide = [self._op(f"arith.extui {v.name} : {v.type} to i64", "i64") for v in (x, y)]
        product = self._op(f"arith.muli {wide[0].name}, {wide[1].name} : i64", "i64")
        high = self._op(f"arith.shrui {product.name}, {self.const(32, 'i64').name} : i64", "i64")
        return tuple(self._op(f"arith.trunci {v.name} : i64 to {x.type}", x.dtype) for v in (high, product))

    def minimum(self, x: S, y: S) -> S:
        """The smaller, NaN if either is (NumPy's minimum)."""
        return self._op(f"arith.minimumf {x.name}, {y.name} : {x.type}", x.dtype)

    def select(self, cond: S, x: S, y: S) -> S:
        return self._op(f"arith.select {cond.name}, {x.name}, {y.name} : {x.type}", x.dtype)

    def sqrt(self, x: S) -> S:
        return self._op(f"math.sqrt {x.name} : {x.type}", x.dtype)

    def intrinsic(self, name: str, x: S, *more: S) -> S:
        if name not in _INTRINSICS:
            raise NotExpressible(f"the operation {name}")
        return self._op(f"{_INTRINSICS[name]} {', '.join(v.name for v in (x, *more))} : {x.type}",
                        x.dtype)

    def math(self, function: str, *args: S) -> S:
        """A function of the math library: the math dialect's (IREE's approximation of it)."""
        x = args[0]
        if function == "sigmoid":                      # 1 / (1 + exp(-x)), as the reference
            one = self.const(1.0, x.dtype)
            return self.div(one, self.add(one, self.math("exp", self.neg(x))))
        if function == "pow" and not x.is_float:
            return self._op(f"math.ipowi {x.name}, {args[1].name} : {x.type}", x.dtype)
        if function not in _MATH:
            raise NotExpressible(f"the math function {function}")
        names = ", ".join(a.name for a in args)
        return self._op(f"{_MATH[function]} {names} : {x.type}", x.dtype, function)

    def repeat(self, start: S, stop: S, initial: S, step: Callable[[S, S], S]) -> S:
        """An scf.for over the indices start..stop inside a region, carrying one scalar from
        initial: step(index, carried) writes one step and returns the scalar carried on."""
        w = self.w
        result, k, carried = w.fresh("repeat"), S(w.fresh("k"), "index"), S(w.fresh("acc"), initial.dtype)
        w.line(f"{result} = scf.for {k.name} = {start.name} to {stop.name} step {w.index(1)} "
               f"iter_args({carried.name} = {initial.name}) -> ({initial.type}) {{", located=False)
        w.region(lambda: w.line(f"scf.yield {step(k, carried).name} : {initial.type}", located=False))
        w.line("}", located=False)
        return S(result, initial.dtype)

    # positions, for the regions of gathers and scatters

    def position(self, axis: int) -> S:
        """The iteration's index along axis (linalg.index)."""
        return self._op(f"linalg.index {axis} : index", "index", f"i{axis}")

    def from_index(self, x: S, dtype: str) -> S:
        """An index value (never negative) as an integer of dtype."""
        return self._op(f"arith.index_castui {x.name} : index to {ELEMENT[dtype]}", dtype)

    def index_of(self, x: S) -> S:
        return self._op(f"arith.index_cast {x.name} : {x.type} to index", "index", "i")

    def from_end(self, x: S, n: int) -> S:
        """An integer index as an index value, a negative one counted from the end (NumPy's)."""
        i = self.index_of(x)
        return self.select(self.compare("<", i, self.w.index_here(0), "index"),
                           self.add(i, self.w.index_here(n)), i)

    def extract(self, tensor: str, type: str, dtype: str, at: Sequence[S]) -> S:
        return self._op(f"tensor.extract {tensor}[{', '.join(a.name for a in at)}] : {type}", dtype)

    def cast(self, x: S, src: str, dst: str) -> S:
        to = ELEMENT[dst]
        if src == dst or ELEMENT[src] == to:
            return x if src == dst else S(x.name, dst)
        if dst == "bool":
            return self.compare("!=", x, self.const(0, src), src)
        if src in FLOAT_DTYPES and dst in FLOAT_DTYPES:
            op = "arith.extf" if _BITS[dst] > _BITS[src] else "arith.truncf"
        elif dst in FLOAT_DTYPES:
            op = "arith.uitofp" if src in ("u32", "bool") else "arith.sitofp"
        elif src in FLOAT_DTYPES:
            op = "arith.fptoui" if dst == "u32" else "arith.fptosi"
        else:
            op = ("arith.extui" if src in ("u32", "bool") else "arith.extsi") \
                if _BITS[dst] > _BITS[src] else "arith.trunci"
        return self._op(f"{op} {x.name} : {x.type} to {to}", dst)


@dataclass(frozen=True)
class Window:
    """The offsets, sizes and strides of tensor.extract_slice and insert_slice (an offset may
    be an index SSA value)."""
    offsets: tuple[int | str, ...]
    sizes: tuple[int, ...]
    strides: tuple[int, ...]

    @staticmethod
    def along(shape: Sequence[int], axis: int, offset: int | str, size: int) -> Window:
        """The whole of every axis but `axis`, where it is [offset, offset + size)."""
        return Window(tuple(offset if i == axis else 0 for i in range(len(shape))),
                      tuple(size if i == axis else n for i, n in enumerate(shape)),
                      (1,) * len(shape))

    def __str__(self) -> str:
        return "".join("[" + ", ".join(map(str, part)) + "]"
                       for part in (self.offsets, self.sizes, self.strides))


class Writer:
    """One MLIR function under construction: lines, SSA names, and the shapes of linalg."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 1
        self.names: dict[Value, str] = {}
        self.used: Counter[str] = Counter()
        self.loc = ""
        self.scalars: dict[Value, tuple[Any, str]] = {}  # scalar literals, written where used
        self.body: Body = Body(self)
        self._region_constants: list[dict] = [{}]

    # ------------------------------------------------------------ names, lines, values

    def fresh(self, hint: str = "") -> str:
        base = re.sub(r"[^A-Za-z0-9_$.]", "_", hint).strip("_") or ""
        if base and base[0].isdigit():
            base = "v" + base
        if not base:
            return f"%{self._next_number()}"
        self.used[base] += 1
        n = self.used[base]
        return f"%{base}" if n == 1 else f"%{base}_{n - 1}"

    def _next_number(self) -> int:
        self.used[""] += 1
        return self.used[""] - 1

    def line(self, text: str, located: bool = True) -> None:
        self.lines.append("  " * self.depth + text + (f" {self.loc}" if located and self.loc else ""))

    def __getitem__(self, v: Value) -> str:
        """v's SSA name; a scalar literal becomes a tensor constant here, when first needed so."""
        if v not in self.names and v in self.scalars:
            value, dtype = self.scalars[v]
            self.names[v] = self.fresh("cst")
            self.line(f"{self.names[v]} = arith.constant dense<{literal(value, dtype)}> : "
                      f"{type_of(v)}")
        return self.names[v]

    def bind(self, v: Value, name: str) -> None:
        self.names[v] = name

    def scalar_constant(self, value: Any, dtype: str) -> S:
        """An arith constant in the current region, written once per region."""
        key = (literal(value, dtype), dtype)
        here = self._region_constants[-1]
        if key not in here:
            name = self.fresh("cst" if dtype in FLOAT_DTYPES else key[0] if dtype == "bool"
                              else f"c{key[0].replace('-', 'm')}_{ELEMENT[dtype]}")
            typed = "" if dtype == "bool" else f" : {ELEMENT[dtype]}"     # true and false are i1
            self.line(f"{name} = arith.constant {key[0]}{typed}", located=False)
            here[key] = S(name, dtype)
        return here[key]

    def index_here(self, n: int) -> S:
        """An index constant of the current region."""
        return S(self.index(n), "index")

    def index(self, n: int) -> str:
        """An index constant."""
        key = (str(n), "index")
        here = self._region_constants[0]
        if key not in here:
            name = self.fresh(f"c{n}")
            self.lines.insert(self._index_at, "    " + f"{name} = arith.constant {n} : index")
            self._index_at += 1
            here[key] = name
        return here[key]

    # ------------------------------------------------------------ tensors

    def empty(self, shape: Sequence[int], dtype: str) -> str:
        name = self.fresh("init")
        self.line(f"{name} = tensor.empty() : {tensor_type(shape, dtype)}")
        return name

    def filled(self, value: Any, shape: Sequence[int], dtype: str, hint: str = "fill") -> str:
        """A tensor of one value: linalg.fill of an empty tensor."""
        init = self.empty(shape, dtype)
        c = self.scalar_constant(value, dtype)
        name = self.fresh(hint)
        t = tensor_type(shape, dtype)
        self.line(f"{name} = linalg.fill ins({c.name} : {c.type}) outs({init} : {t}) -> {t}")
        return name

    def reshape(self, x: str, shape: Sequence[int], to: Sequence[int], dtype: str,
                hint: str = "reshape") -> str:
        """x (of shape) with shape `to` and the same elements in row-major order: one
        tensor.collapse_shape or expand_shape where they can say it, through 1-D otherwise."""
        shape, to = tuple(shape), tuple(to)
        if shape == to:
            return x
        if math.prod(shape) == 0:                   # no elements (and no grouping of a 0 axis)
            return self.empty(to, dtype)
        if len(to) < len(shape) and (groups := _groups(shape, to)) is not None:
            name = self.fresh(hint)
            self.line(f"{name} = tensor.collapse_shape {x} {_reassociation(groups)} : "
                      f"{tensor_type(shape, dtype)} into {tensor_type(to, dtype)}")
            return name
        if len(to) > len(shape) and (groups := _groups(to, shape)) is not None:
            name = self.fresh(hint)
            self.line(f"{name} = tensor.expand_shape {x} {_reassociation(groups)} output_shape "
                      f"[{', '.join(map(str, to))}] : {tensor_type(shape, dtype)} into "
                      f"{tensor_type(to, dtype)}")
            return name
        flat = (math.prod(shape),)
        return self.reshape(self.reshape(x, shape, flat, dtype, hint), flat, to, dtype, hint)

    def reduce(self, x: str, shape: Sequence[int], dtype: str, axes: Sequence[int], identity: Any,
               combine: Callable[[S, S], S], hint: str) -> str:
        """linalg.reduce of x over axes, from identity, combining by the scalar body combine."""
        kept = [n for i, n in enumerate(shape) if i not in axes]
        init = self.filled(identity, kept, dtype, "init")
        name, t = self.fresh(hint), tensor_type(kept, dtype)
        self.line(f"{name} = linalg.reduce ins({x} : {tensor_type(shape, dtype)}) outs({init} : {t}) "
                  f"dimensions = [{', '.join(map(str, axes))}]", located=False)
        a, acc = S(self.fresh("in"), dtype), S(self.fresh("acc"), dtype)
        self.line(f"  ({a.name}: {a.type}, {acc.name}: {acc.type}) {{", located=False)
        y = self.region(lambda: self.region(lambda: combine(a, acc)))
        self.line(f"    linalg.yield {y.name} : {y.type}", located=False)
        self.line("  }")
        return name

    def transpose(self, x: str, shape: Sequence[int], perm: Sequence[int], dtype: str,
                  hint: str = "transpose") -> str:
        """x (of shape) with its axes permuted (axis i of the result is axis perm[i] of x)."""
        if list(perm) == sorted(perm):
            return x
        to = [shape[i] for i in perm]
        init, name = self.empty(to, dtype), self.fresh(hint)
        self.line(f"{name} = linalg.transpose ins({x} : {tensor_type(shape, dtype)}) outs({init} : "
                  f"{tensor_type(to, dtype)}) permutation = [{', '.join(map(str, perm))}]")
        return name

    def contract(self, operands: Sequence[tuple[Value, str]], result: str, out: Value,
                 hint: str) -> str:
        """A sum of products over letter-labelled axes (einsum's letters for each operand, and
        for the result `out`'s): linalg.matmul or batch_matmul where the letters say one once
        the operands' axes are permuted and grouped, else a linalg.generic; each output element
        accumulates from -0.0, as dslc's do."""
        sizes: dict[str, int] = {}
        for v, letters in operands:
            for c, n in zip(letters, v.shape):
                if sizes.get(c, 1) == 1:             # a length of 1 broadcasts, one of 0 does not
                    sizes[c] = n
        product = _matrix_product([l for _, l in operands], result, [v.shape for v, _ in operands],
                                  sizes)
        if product is not None:
            return self.matrix_product(operands[0][0], operands[1][0], out, product, hint)
        init = self.filled(_sum_zero(out.dtype), out.shape, out.dtype, "zero")
        order = result + "".join(dict.fromkeys(c for _, l in operands for c in l if c not in result))
        space = [sizes[c] for c in order]
        ins = [(self[v], type_of(v), ", ".join("0" if n == 1 and sizes[c] != 1 else f"d{order.index(c)}"
                                               for c, n in zip(letters, v.shape)))
               for v, letters in operands]

        def body(args: list[S]) -> list[S]:
            *factors, acc = args
            product = factors[0]
            for f in factors[1:-1]:
                product = self.body.mul(product, f)
            if len(factors) > 1 and acc.is_float:
                return [self.body._op(f"math.fma {product.name}, {factors[-1].name}, {acc.name} : "
                                      f"{acc.type}", acc.dtype)]
            if len(factors) > 1:
                product = self.body.mul(product, factors[-1])
            return [self.body.add(acc, product)]
        return self.generic(space, [out.dtype], ins, body, reduced=range(len(result), len(order)),
                            inits=[init], hint=hint)[0]

    def matrix_product(self, a: Value, b: Value, out: Value, product: MatrixProduct,
                       hint: str) -> str:
        """a @ b as linalg.matmul, or batch_matmul with a batch: the operands permuted and
        collapsed to [batch,] m, k and [batch,] k, n, the product expanded to out's shape."""
        batch = (product.batch,) if product.batch is not None else ()
        dtype, m, k, n = out.dtype, product.m, product.k, product.n
        lhs, rhs = (self.reshape(self.transpose(self[v], v.shape, perm, dtype, name),
                                 [v.shape[i] for i in perm], to, dtype, name)
                    for v, perm, to, name in ((a, product.lhs, batch + (m, k), "lhs"),
                                              (b, product.rhs, batch + (k, n), "rhs")))
        init = self.filled(_sum_zero(dtype), batch + (m, n), dtype, "zero")
        t = tensor_type(batch + (m, n), dtype)
        name = self.fresh(hint)
        self.line(f"{name} = linalg.{'batch_matmul' if batch else 'matmul'} ins({lhs}, {rhs} : "
                  f"{tensor_type(batch + (m, k), dtype)}, {tensor_type(batch + (k, n), dtype)}) "
                  f"outs({init} : {t}) -> {t}")
        return self.reshape(name, batch + (m, n), out.shape, dtype, hint)

    def loop(self, n: int, carried: Sequence[tuple[str, str]],
             step: Callable[[str, list[str]], list[str]], hint: str, start: int = 0) -> list[str]:
        """scf.for over start..n carrying tensors (initial SSA name, type); step(t, carried
        names) writes one step and returns the tensors carried on."""
        t, result = self.fresh("t"), self.fresh(hint)
        iters = [self.fresh("acc") for _ in carried]
        types = ", ".join(ty for _, ty in carried)
        pairs = ", ".join(f"{i} = {c}" for i, (c, _) in zip(iters, carried))
        self.line(f"{result}:{len(carried)} = scf.for {t} = {self.index(start)} to {self.index(n)} "
                  f"step {self.index(1)} iter_args({pairs}) -> ({types}) {{", located=False)

        def body() -> None:
            out = step(t, iters)
            self.line(f"scf.yield {', '.join(out)} : {types}", located=False)
        self.region(body)
        self.line("}")
        return [f"{result}#{i}" for i in range(len(carried))]

    def extract(self, x: str, shape: Sequence[int], dtype: str, window: Window,
                to: Sequence[int], hint: str = "") -> str:
        """The window of x (of shape) as a tensor of shape `to` (its unit axes may be dropped);
        an empty window is an empty tensor (MLIR refuses a slice at offset 0 of an axis of 0)."""
        if 0 in window.sizes:
            return self.empty(to, dtype)
        name = self.fresh(hint)
        self.line(f"{name} = tensor.extract_slice {x}{window} : {tensor_type(shape, dtype)} to "
                  f"{tensor_type(to, dtype)}")
        return name

    def insert(self, y: str, y_shape: Sequence[int], into: str, shape: Sequence[int], dtype: str,
               window: Window, hint: str = "inserted") -> str:
        """into (of shape) with y written over the window (into itself for an empty one)."""
        if 0 in window.sizes:
            return into
        name = self.fresh(hint)
        self.line(f"{name} = tensor.insert_slice {y} into {into}{window} : "
                  f"{tensor_type(y_shape, dtype)} into {tensor_type(shape, dtype)}")
        return name

    def reverse(self, x: str, shape: Sequence[int], dtype: str, axes: Sequence[int],
                hint: str = "flip") -> str:
        """x with its elements in reverse order along axes (x itself for none): a linalg.generic
        whose region extracts element n - 1 - i of such an axis (IREE's tiling takes an indexing
        map of n - 1 - d for a map of increasing indices, and reads the wrong elements)."""
        if not axes:
            return x

        def element(args: list[S]) -> list[S]:
            at = [self.body.position(i) for i in range(len(shape))]
            at = [self.body.sub(self.index_here(n - 1), p) if i in axes else p
                  for i, (n, p) in enumerate(zip(shape, at))]
            return [self.body.extract(x, tensor_type(shape, dtype), dtype, at)]
        return self.generic(shape, [dtype], [], element, hint=hint)[0]

    def slice_at(self, x: str, shape: Sequence[int], dtype: str, t: str, hint: str = "") -> str:
        """Slice t (an index SSA value) of x along its first axis, without that axis."""
        return self.extract(x, shape, dtype, Window.along(shape, 0, t, 1), shape[1:], hint)

    def insert_at(self, y: str, into: str, shape: Sequence[int], dtype: str, t: str) -> str:
        """into (of shape) with y as its slice t along the first axis."""
        return self.insert(y, shape[1:], into, shape, dtype, Window.along(shape, 0, t, 1))

    def generic(self, shape: Sequence[int], dtypes: Sequence[str], ins: Sequence[tuple[str, str, str]],
                body: Callable[[list[S]], list[S]], reduced: Sequence[int] = (),
                inits: Sequence[str] | None = None, hint: str = "") -> list[str]:
        """linalg.generic over an iteration space `shape` (the axes `reduced` reductions):
        ins are (SSA name, tensor type, affine results of the map); the outputs (of dtypes) are
        indexed by the parallel axes and start from `inits` (empty tensors by default)."""
        rank = len(shape)
        dims = ", ".join(f"d{i}" for i in range(rank))
        out_shape = [n for i, n in enumerate(shape) if i not in reduced]
        out_map = ", ".join(f"d{i}" for i in range(rank) if i not in reduced)
        out_types = [tensor_type(out_shape, dt) for dt in dtypes]
        inits = list(inits) if inits is not None else [self.empty(out_shape, dt) for dt in dtypes]
        maps = [f"affine_map<({dims}) -> ({m})>" for _, _, m in ins] + \
               [f"affine_map<({dims}) -> ({out_map})>"] * len(dtypes)
        iterators = ", ".join('"reduction"' if i in reduced else '"parallel"' for i in range(rank))
        names = [self.fresh(hint) for _ in dtypes] if len(dtypes) == 1 else [self.fresh(hint)]
        result = names[0] + (f":{len(dtypes)}" if len(dtypes) > 1 else "")
        ins_text = f"ins({', '.join(n for n, _, _ in ins)} : {', '.join(t for _, t, _ in ins)}) " \
            if ins else ""
        self.line(f"{result} = linalg.generic {{indexing_maps = [{', '.join(maps)}], "
                  f"iterator_types = [{iterators}]}} {ins_text}outs({', '.join(inits)} : "
                  f"{', '.join(out_types)}) {{", located=False)
        args = [S(self.fresh("in" if i < len(ins) else "out"), dt)
                for i, dt in enumerate([_element_dtype(t) for _, t, _ in ins] + list(dtypes))]
        self.lines.append("  " * self.depth + "^bb0(" + ", ".join(f"{a.name}: {a.type}" for a in args) + "):")
        yielded = self.region(lambda: body(args))
        self.line(f"  linalg.yield {', '.join(y.name for y in yielded)} : "
                  f"{', '.join(y.type for y in yielded)}", located=False)
        self.line(f"}} -> {', '.join(out_types) if len(out_types) == 1 else '(' + ', '.join(out_types) + ')'}")
        return names if len(dtypes) == 1 else [f"{names[0]}#{i}" for i in range(len(dtypes))]

    def region(self, write: Callable[[], Any]) -> Any:
        """write() one level deeper, with its own scalar constants."""
        self.depth += 1
        self._region_constants.append({})
        try:
            return write()
        finally:
            self._region_constants.pop()
            self.depth -= 1

    def map(self, op: Op, body: Callable[[list[S]], S], hint: str | None = None) -> str:
        """op's one result, elementwise from its inputs broadcast as NumPy does (a linalg.generic
        whose maps say the broadcasting); scalar literals are constants of the region."""
        out = op.outputs[0]
        tensors = [v for v in op.inputs if v not in self.scalars]
        ins = [(self[v], type_of(v), broadcast_map(v.shape, out.shape)) for v in tensors]

        def scalars(args: list[S]) -> list[S]:
            given = iter(args)
            values = [self.body.const(*self.scalars[v]) if v in self.scalars else next(given)
                      for v in op.inputs]
            return [body(values)]
        return self.generic(out.shape, [out.dtype], ins, scalars,
                            hint=op.primitive.name if hint is None else hint)[0]

    # ------------------------------------------------------------ the function

    def function(self, fn: Function, name: str, params: Sequence[str]) -> str:
        args = []
        for v, p in zip(fn.params, params, strict=True):
            self.bind(v, self.fresh(p))
            args.append(f"{self.names[v]}: {type_of(v)}")
        results = ", ".join(type_of(v) for v in fn.results)
        self.line(f"func.func @{_symbol(name)}({', '.join(args)}) -> ({results}) {{", located=False)
        self.depth += 1
        self._index_at = len(self.lines)
        self.ops(fn)
        returned = [self[v] for v in fn.results]
        self.loc = ""
        self.line(f"return {', '.join(returned)} : {results}")
        self.depth -= 1
        self.line("}")
        return "\n".join(self.lines) + "\n"

    def ops(self, fn: Function) -> None:
        """fn's ops written in order (inline: the body of a scan or checkpoint too)."""
        for op in fn.ops:
            self.loc = location(op.origin)
            try:
                names = op.primitive.mlir(self, op)
            except NotExpressible as e:
                raise NotExpressible(str(e).removeprefix("not expressible in MLIR yet: "),
                                     e.origin or op.origin) from None
            if names is None:            # a scalar literal, written where it is used
                continue
            for v, n in zip(op.outputs, names, strict=True):
                self.bind(v, n)


@dataclass(frozen=True)
class MatrixProduct:
    """A contraction that is a (batched) matrix product once its operands' axes are permuted
    to batch, rows, contracted and batch, contracted, columns and each group is one axis:
    those permutations, and the groups' sizes (batch None: no batch)."""
    lhs: tuple[int, ...]
    rhs: tuple[int, ...]
    batch: int | None
    m: int
    k: int
    n: int


def _matrix_product(terms: list[str], result: str, shapes: list[tuple[int, ...]],
                    sizes: dict[str, int]) -> MatrixProduct | None:
    """The matrix product this contraction is, if it is one: two operands without a broadcast
    axis or a diagonal, the result lettered batch + rows + columns (a batch that only the left
    operand has counts as rows), and something to sum."""
    if len(terms) != 2 or any(n != sizes[c] for t, s in zip(terms, shapes) for c, n in zip(t, s)):
        return None
    (a, b), r = terms, result
    if any(len(set(t)) != len(t) for t in (a, b, r)):
        return None
    batch = "".join(c for c in r if c in a and c in b)
    rows = "".join(c for c in r if c in a and c not in b)
    cols = "".join(c for c in r if c in b and c not in a)
    inner = "".join(c for c in a if c not in r)
    size = lambda letters: math.prod(sizes[c] for c in letters)
    if not (rows and inner and cols) or r != batch + rows + cols or \
            sorted(a) != sorted(batch + rows + inner) or sorted(b) != sorted(batch + inner + cols):
        return None
    if size(inner) == 0:                 # (iree-compile 3.13 crashes on such a named product)
        return None
    return MatrixProduct(tuple(a.index(c) for c in batch + rows + inner),
                         tuple(b.index(c) for c in batch + inner + cols),
                         size(batch) if batch else None, size(rows), size(inner), size(cols))


def _sum_zero(dtype: str) -> Any:
    """What a contraction accumulates from: -0.0, which adds nothing, not even a sign."""
    return -0.0 if dtype in FLOAT_DTYPES else 0


def _element_dtype(t: str) -> str:
    element = t.rsplit("x", 1)[-1].removeprefix("tensor<").rstrip(">")
    return {"i1": "bool"}.get(element, element)


def broadcast_map(shape: Sequence[int], out: Sequence[int]) -> str:
    """The affine results that read an operand of `shape` broadcast to `out` (NumPy's rule):
    its axes align with out's last ones, and an axis of length 1 that out stretches reads 0."""
    lead = len(out) - len(shape)
    return ", ".join("0" if n == 1 and out[lead + i] != 1 else f"d{lead + i}"
                     for i, n in enumerate(shape))


def _groups(long: tuple[int, ...], short: tuple[int, ...]) -> list[list[int]] | None:
    """How consecutive axes of `long` group into each axis of `short` (a reassociation), or
    None when no grouping multiplies out."""
    if not short:
        return [] if math.prod(long) == 1 else None
    groups: list[list[int]] = []
    i = 0
    for k, n in enumerate(short):
        group, size = [], 1
        while i < len(long) and (size < n or not group or (long[i] == 1 and k == len(short) - 1)):
            group.append(i)
            size *= long[i]
            i += 1
            if size == n and (k == len(short) - 1 or i < len(long) and long[i] != 1):
                break
        if size != n or not group:
            return None
        groups.append(group)
    while i < len(long) and long[i] == 1:               # trailing ones join the last group
        groups[-1].append(i)
        i += 1
    return groups if i == len(long) else None


def _reassociation(groups: list[list[int]]) -> str:
    return "[" + ", ".join("[" + ", ".join(map(str, g)) + "]" for g in groups) + "]"


def _symbol(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$.]*", name) else f'"{name}"'


def location(origin: Any) -> str:
    """`loc("model.bend":12:9)` for an op's origin (a frontend.diagnostics.Site); '' for none."""
    span = getattr(origin, "span", None)
    if span is None:
        return ""
    return f'loc({string(span.source.path)}:{span.line}:{span.col})'


def string(text: str) -> str:
    """text as an MLIR string literal: a quote, a backslash and any byte that is not printable
    ASCII written as its two hex digits (\\22)."""
    return '"' + "".join(chr(c) if 32 <= c < 127 and c not in b'"\\' else f"\\{c:02X}"
                         for c in text.encode()) + '"'


def to_mlir(fn: Function, name: str | None = None, params: Sequence[str] | None = None) -> str:
    """fn as an MLIR module of one function `name`, its arguments named after `params` (the
    entry's inputs, p.W1, x); raises NotExpressible for an op it cannot write yet."""
    return module([function(fn, name, params)])


def function(fn: Function, name: str | None = None, params: Sequence[str] | None = None) -> str:
    """fn as a func.func (see to_mlir)."""
    names = list(params) if params is not None else [f"arg{i}" for i in range(len(fn.params))]
    return Writer().function(fn, name or fn.name, names)


def module(functions: Sequence[str]) -> str:
    return "module {\n" + "\n".join(functions) + "}\n"

