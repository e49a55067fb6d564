"""The draws and keys of docs/random.md as LLVM IR, an element at a time: what each thread of
the GPU's draw and key kernels computes (backend/nvptx.py) and what the CPU's routines here
compute in a loop for the native step (runtime/step.py). One definition, the reference's bits
(ir/philox.py, ir/ops/random.py).

Each is a function of pointers and sizes (`params`), in C:

    uniform_T(const u32 *key, T *out, i64 n, i64 low, i64 high, i64 top):
        out[j] = min(L + (H - L) * u_j, TOP)        (T's bits of L, H, TOP as integers)
    bernoulli_T(const u32 *key, const T *p, bool *out, i64 n):
        out[j] = unit32(s_j) < f32(p[0])           (T: p's dtype)
    normal_f32(const u32 *key, f32 *out, i64 n):
        out[j] = r cos(t) or r sin(t), Box–Muller on pair j >> 1
    key_split_u32(const u32 *key, u32 *out, i64 n):
        out[2j], out[2j + 1] = words 0, 1 of the block for counter j + 2**96 * SPLIT
    fold_in_T(const u32 *key, const T *i, u32 *out, i64 n):       (n = 1)
        out[0], out[1] = words 0, 1 of the block for counter (i mod 2**64) + 2**96 * FOLD_IN
    key_u32(u32 *out, i64 n, i64 low, i64 high):                 (n = 1)
        out[0], out[1] = low, high     (the seed's words)

TOP is the largest value below H where L < H, else +inf (`bounds`); fold_in's i is
sign-extended to 64 bits, a u32's zero-extended."""
from __future__ import annotations

from typing import Callable

import numpy as np
from llvmlite import ir

from backend import cpu, mathlib
from backend.llvm import I8, I32, I64, SCALAR, Emitter, loop, memory_type
from ir import philox
from ir.core import Op
from ir.ops.base import Primitive, np_dtype
from ir.ops.random import TWO_PI, Bernoulli, FoldIn, Key, KeySplit, Normal, Uniform

KEYS = (KeySplit, FoldIn, Key)          # the primitives whose functions make keys


def dtype_of(op: Op) -> str | None:
    """The dtype of the function that computes op (a draw's values', bernoulli's p's, fold_in's
    i's; u32 for the other keys), or None where none does (an f64 normal draw, draws of other
    dtypes, what is not a draw nor a key)."""
    prim = op.primitive
    if isinstance(prim, (KeySplit, Key)):
        return "u32"
    if isinstance(prim, FoldIn):
        return op.inputs[1].dtype
    if isinstance(prim, Bernoulli):
        return op.inputs[1].dtype if op.inputs[1].dtype in ("f32", "f64") else None
    dtype = op.outputs[0].dtype
    if isinstance(prim, Uniform) and dtype in ("f32", "f64") or isinstance(prim, Normal) and dtype == "f32":
        return dtype
    return None


def params(prim: Primitive, dtype: str) -> list[ir.Type]:
    """The argument types of prim's function for dtype (the module docstring's)."""
    words = I32.as_pointer()
    if isinstance(prim, KEYS):
        return {KeySplit: [words, words, I64], FoldIn: [words, memory_type(dtype).as_pointer(), words, I64],
                Key: [words, I64, I64, I64]}[type(prim)]
    t = SCALAR[dtype].as_pointer()
    return {Bernoulli: [words, t, I8.as_pointer(), I64], Normal: [words, t, I64]}.get(
        type(prim), [words, t] + [I64] * 4)


def elements(b: ir.IRBuilder, prim: Primitive, dtype: str, args: list[ir.Value]
             ) -> tuple[ir.Value, Callable[[ir.Value], None]]:
    """(n, store): how many elements (keys) prim's function of these arguments makes, and
    the code that makes and stores element j."""
    if isinstance(prim, KEYS):
        return _keys(b, prim, dtype, args)
    t = SCALAR[dtype]
    if isinstance(prim, Bernoulli):
        key, p, out, n = args
        f32 = SCALAR["f32"]
        p = b.load(p, align=_bytes(dtype))
        threshold = b.fptrunc(p, f32) if dtype == "f64" else p
        value_at = lambda j: b.zext(b.fcmp_ordered("<", _unit(b, key, j, "f32"), threshold), I8)
    elif isinstance(prim, Normal):
        key, out, n = args
        value_at = lambda j: _normal(b, key, j)
    else:
        key, out, n, *bits = args
        as_value = lambda v: b.bitcast(v if dtype == "f64" else b.trunc(v, I32), t)
        low, high, top = map(as_value, bits)
        span = b.fsub(high, low)

        def value_at(j: ir.Value) -> ir.Value:
            x = b.fadd(low, b.fmul(span, _unit(b, key, j, dtype)))
            return b.select(b.fcmp_ordered(">", x, top), top, x)

    return n, lambda j: b.store(value_at(j), b.gep(out, [j], inbounds=True))


def _keys(b: ir.IRBuilder, prim: Primitive, dtype: str, args: list[ir.Value]
          ) -> tuple[ir.Value, Callable[[ir.Value], None]]:
    if isinstance(prim, Key):
        out, n, *seed = args
        made = lambda j: [b.trunc(w, I32) for w in seed]
    elif isinstance(prim, FoldIn):
        key, i, out, n = args
        extend = b.zext if dtype.startswith("u") else b.sext
        made = lambda j: _philox(b, extend(b.load(i, align=_bytes(dtype)), I64) if dtype != "i64"
                                 else b.load(i, align=8), key, philox.FOLD_IN)[:2]
    else:
        key, out, n = args
        made = lambda j: _philox(b, j, key, philox.SPLIT)[:2]

    def key_at(j: ir.Value) -> None:
        for w, word in enumerate(made(j)):
            b.store(word, b.gep(out, [b.add(b.mul(j, ir.Constant(I64, 2)), ir.Constant(I64, w))],
                                inbounds=True), align=4)
    return n, key_at


def bounds(op: Op) -> tuple[int, ...]:
    """A uniform draw's L, H and TOP, each the bits of a value of the draw's dtype as a
    signed integer; nothing for another draw."""
    if not isinstance(op.primitive, Uniform):
        return ()
    a = op.attrs
    low, high, dtype = a.get("low", 0.0), a.get("high", 1.0), op.outputs[0].dtype
    t = np_dtype(dtype)
    signed = np.int64 if dtype == "f64" else np.int32
    values = (t.type(low), t.type(high), Uniform.top(low, high, dtype))
    return tuple(int(np.array(v, t).view(signed)) for v in values)


def function(prim: Primitive, dtype: str) -> int:
    """The address of prim's function for dtype, compiled for the host: a loop over the
    elements, returning -1 (a routine's, backend/step.py's RoutineCall)."""
    def build(module: ir.Module) -> None:
        fn = ir.Function(module, ir.FunctionType(I64, params(prim, dtype)), name=prim.name)
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        n, store = elements(b, prim, dtype, fn.args)
        loop(b, ir.Constant(I64, 0), n, store)
        b.ret(ir.Constant(I64, -1))
    return cpu.routine(prim.name, build, dtype)


def _bytes(dtype: str) -> int:
    return np_dtype(dtype).itemsize


def _philox(b: ir.IRBuilder, index: ir.Value, key: ir.Value, domain: int = philox.DRAW) -> list[ir.Value]:
    """The four words of the Philox 4x32-10 block for counter index + 2**96 * domain under
    key[0], key[1] (ir/philox.py's block)."""
    word = lambda v: ir.Constant(I32, v)
    k0, k1 = (b.load(b.gep(key, [ir.Constant(I64, i)], inbounds=True), align=4) for i in (0, 1))
    c = [b.trunc(index, I32), b.trunc(b.lshr(index, ir.Constant(I64, 32)), I32), word(0), word(domain)]

    def mulhilo(m: int, x: ir.Value) -> tuple[ir.Value, ir.Value]:
        product = b.mul(ir.Constant(I64, m), b.zext(x, I64))
        return b.trunc(b.lshr(product, ir.Constant(I64, 32)), I32), b.trunc(product, I32)

    for r in range(philox.ROUNDS):
        if r:
            k0, k1 = b.add(k0, word(philox.W0)), b.add(k1, word(philox.W1))
        hi0, lo0 = mulhilo(philox.M0, c[0])
        hi1, lo1 = mulhilo(philox.M1, c[2])
        c = [b.xor(b.xor(hi1, c[1]), k0), lo1, b.xor(b.xor(hi0, c[3]), k1), lo0]
    return c


def _stream_word(b: ir.IRBuilder, key: ir.Value, s: ir.Value) -> ir.Value:
    """Word s of the key's draw stream: word s % 4 of block s / 4."""
    words = _philox(b, b.udiv(s, ir.Constant(I64, 4)), key)
    return _pick(b, words, b.trunc(b.urem(s, ir.Constant(I64, 4)), I32))


def _pick(b: ir.IRBuilder, words: list[ir.Value], r: ir.Value) -> ir.Value:
    """words[r] for an i32 r in [0, len(words))."""
    out = words[0]
    for i, word in enumerate(words[1:], 1):
        out = b.select(b.icmp_unsigned("==", r, ir.Constant(I32, i)), word, out)
    return out


def _unit32(b: ir.IRBuilder, w: ir.Value, plus_one: bool = False) -> ir.Value:
    """unit32(w) = f32(w >> 8) * 2^-24 in [0, 1); with plus_one, unit32⁺ in (0, 1]."""
    v = b.lshr(w, ir.Constant(I32, 8))
    if plus_one:
        v = b.add(v, ir.Constant(I32, 1))
    return b.fmul(b.uitofp(v, SCALAR["f32"]), ir.Constant(SCALAR["f32"], 2.0 ** -24))


def _unit(b: ir.IRBuilder, key: ir.Value, j: ir.Value, dtype: str) -> ir.Value:
    """Element j's uniform value in [0, 1): unit32(s_j) for f32, unit64(s_2j, s_2j+1) for f64."""
    if dtype == "f32":
        return _unit32(b, _stream_word(b, key, j))
    two = b.mul(j, ir.Constant(I64, 2))
    lo, hi = (b.zext(_stream_word(b, key, s), I64) for s in (two, b.add(two, ir.Constant(I64, 1))))
    v = b.lshr(b.or_(b.shl(hi, ir.Constant(I64, 32)), lo), ir.Constant(I64, 11))
    return b.fmul(b.uitofp(v, SCALAR["f64"]), ir.Constant(SCALAR["f64"], 2.0 ** -53))


def _rounded(b: ir.IRBuilder, f: Callable, x: ir.Value) -> ir.Value:
    """f(x) for an f32 x, correctly rounded: mathlib's f64 f rounded to f32 (docs/random.md §5:
    on every x a normal draw feeds it, that is RN of the exact value)."""
    return b.fptrunc(f(b, b.fpext(x, SCALAR["f64"])), SCALAR["f32"])


def _normal(b: ir.IRBuilder, key: ir.Value, j: ir.Value) -> ir.Value:
    """Element j of an f32 normal draw: r cos(t) or r sin(t) of pair m = j >> 1, as j is even
    or odd (docs/random.md §5). Words s_2m, s_2m+1 are words 0, 1 or 2, 3 of block m >> 1."""
    f32 = SCALAR["f32"]
    m = b.lshr(j, ir.Constant(I64, 1))
    words = _philox(b, b.lshr(m, ir.Constant(I64, 1)), key)
    second = b.trunc(b.and_(m, ir.Constant(I64, 1)), ir.IntType(1))
    u1 = _unit32(b, b.select(second, words[2], words[0]), plus_one=True)
    u2 = _unit32(b, b.select(second, words[3], words[1]))
    r = Emitter(b, b.module).sqrt(b.fmul(ir.Constant(f32, -2.0), _rounded(b, mathlib.log, u1)))
    t = b.fmul(ir.Constant(f32, float(TWO_PI[np.float32])), u2)
    cos, sin = _rounded(b, mathlib.cos, t), _rounded(b, mathlib.sin, t)
    odd = b.trunc(j, ir.IntType(1))
    return b.fmul(r, b.select(odd, sin, cos))
