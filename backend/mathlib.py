"""Exact-mode math library: exp, log, tanh, sin … as LLVM IR built from + * fma and bit ops.

Each public function takes an `llvmlite.ir.IRBuilder` and a value of type float, double,
<N x float> or <N x double>, appends a straight-line sequence of instructions (no calls except
`llvm.fma` and `llvm.sqrt`) and returns the result, of the same type. The exceptions to
"straight-line": sin, cos and tan branch, when some lane's |x| is beyond 2^22 (float) or 2^50
(double), to the Payne-Hanek reduction, and fmod loops until every lane's remainder is below
|y|; they leave the builder at the end of a new block (a caller that builds a phi after them
takes the incoming block from `b.block`). That sequence *is* the definition of the result: it
uses only IEEE operations that every target rounds the same way (fadd fsub fmul fdiv, fma, sqrt,
integer and bit operations, compares and selects), never fast-math flags, so the CPU and the
GPU produce the same bits. The vector variants run the same sequence lane by lane and give the
same bits as the scalar ones.

    exp exp2 log log2 tanh sigmoid sin cos rsqrt      f(b, x) -> value like x
    tan atan asin acos                                f(b, x) -> value like x
    log1p expm1 sinh cosh erf erfc                    f(b, x) -> value like x
    pow                                               pow(b, x, y) -> value like x
    atan2                                             atan2(b, y, x) -> value like y
    fmod                                              fmod(b, x, y) -> value like x (exact)

Every NaN result is the quiet NaN with a clear sign bit (0x7fc00000, 0x7ff8000000000000), so
NaNs too are the same bits everywhere; but fmod's, which are the C library's on x86-64 (its
argument's NaN, else the default NaN, whose sign is set), as NumPy's `%` gives them.
docs/numerics.md gives each function's algorithm, its measured accuracy and its special
values; the polynomial coefficients were fitted by
`python benchmarks/mathlib_ulps.py --fit` (minimax relative error, Remez exchange in mpmath, each
coefficient rounded to the target precision in turn and the rest refitted). All polynomials are
evaluated by Horner's rule with one fma per coefficient.

Words used below: a *double-word* value is an unevaluated sum hi + lo of two floats with
|lo| <= ulp(hi); `p` is the precision (24 for float, 53 for double).
"""
from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

__all__ = ["exp", "exp2", "log", "log2", "tanh", "sigmoid", "sin", "cos", "pow", "rsqrt",
           "tan", "atan", "asin", "acos", "atan2",
           "log1p", "expm1", "sinh", "cosh", "erf", "erfc", "fmod",
           "UNARY", "BINARY"]

H = float.fromhex


@dataclass(frozen=True)
class Format:
    """The constants of one floating-point format; every constant is exactly representable."""
    name: str
    bits: int              # storage width
    mant: int              # fraction bits: 23 or 52
    bias: int              # exponent bias: 127 or 1023
    qnan: int              # bits of the canonical NaN
    # rint by the "shifter": x + 1.5*2^mant rounds x to an integer (|x| < 2^(mant-1)).
    shifter: float
    # exp and exp2: the argument range outside of which the result is 0 or inf anyway.
    exp_lo: float
    exp_hi: float
    exp2_lo: float
    exp2_hi: float
    log2e: float           # RN(1/ln 2) and RN(1/ln 2 - log2e)
    log2e_lo: float
    ln2: float             # RN(ln 2) and RN(ln 2 - ln2)
    ln2_lo: float
    ln2_hi_short: float    # ln 2 cut to few bits, so k * ln2_hi_short is exact for every exponent k
    ln2_lo_short: float    # RN(ln 2 - ln2_hi_short)
    log_split: int         # bits of RN(2/3): log reduces the mantissa to [2/3, 4/3)
    two_thirds: float      # RN(2/3) and RN(2/3 - two_thirds)
    two_thirds_lo: float
    two_over_pi: tuple     # RN(2/pi) and RN(2/pi - that)
    pio2: tuple            # pi/2 = sum of four parts, each the rounding of what the others leave
    sin_tiny: float        # below this |x|, sin x rounds to x (and tan x, atan x, asin x)
    cody_waite_max: float  # sin/cos reduce |x| up to this by Cody-Waite, beyond by Payne-Hanek
    ph_digits: int         # Payne-Hanek: digits of 2/pi multiplied by the mantissa
    tanh_small: float      # below this |x| tanh uses its odd polynomial
    rsqrt_scale: int       # rsqrt rescales x by 2^(+-2s) when |x| is outside 2^(+-2s)
    # Polynomials (coefficients of u^0, u^1, …, fitted as described in the module docstring):
    exp_q: tuple           # e^r = 1 + r + r^2 Q(r),                       |r| <= ln2/2
    log_t: tuple           # log((1+s)/(1-s)) = 2s + 2s^3/3 + s^5 T(s^2),   |s| <= 1/5
    tanh_t: tuple          # tanh x = x + x^3 T(x^2),                        |x| <= tanh_small
    sin_s: tuple           # sin r = r + r^3 S(r^2),                         |r| <= pi/4
    cos_c: tuple           # cos r = 1 - r^2/2 + r^4 C(r^2),                 |r| <= pi/4
    atan_t: tuple          # atan z = z + z^3 T(z^2),                        |z| <= 1/2
    asin_t: tuple          # asin t = t + t^3 A(t^2),                        |t| <= 1/2
    # expm1, sinh, cosh, erf, erfc:
    expm1_lo: float        # below this x, e^x < 2^-(p+1) and expm1 rounds to -1
    erf_split: float       # erf uses its polynomial below this |x|, 1 - erfc above
    erfc_max: float        # above this x, erfc x underflows to 0
    two_over_sqrt_pi: tuple  # RN(2/sqrt(pi)) and RN(2/sqrt(pi) - that)
    erf_q: tuple           # erf x = 2x/sqrt(pi) + x^3 Q(x^2),               |x| <= erf_split
    erfc_p: tuple          # e^(x^2) erfc x = (1 - s) P(s), s = (x-2)/(x+2),  0 <= x <= erfc_max
    erfc_p_lo: tuple       # the first coefficients of P are double-words: these are their lows


F32 = Format(
    name="float", bits=32, mant=23, bias=127, qnan=0x7FC00000,
    shifter=H("0x1.8p23"),
    exp_lo=-104.0, exp_hi=89.0, exp2_lo=-151.0, exp2_hi=129.0,
    log2e=H("0x1.715476p+0"), log2e_lo=H("0x1.4ae0c0p-26"),
    ln2=H("0x1.62e430p-1"), ln2_lo=H("-0x1.05c610p-29"),
    ln2_hi_short=H("0x1.62e4p-1"), ln2_lo_short=H("0x1.7f7d1cp-20"),
    log_split=0x3F2AAAAB, two_thirds=H("0x1.555556p-1"), two_thirds_lo=H("-0x1.555556p-26"),
    two_over_pi=(H("0x1.45f306p-1"), H("0x1.b9391p-26")),
    pio2=(H("0x1.921fb6p+0"), H("-0x1.777a5cp-25"), H("-0x1.ee59dap-50"), H("0x1.98a2e0p-77")),
    sin_tiny=H("0x1p-12"), cody_waite_max=H("0x1p22"), ph_digits=6, tanh_small=0.55,
    rsqrt_scale=32,
    exp_q=(H("0x1p-1"), H("0x1.55553cp-3"), H("0x1.5554f2p-5"), H("0x1.113746p-7"),
           H("0x1.6d413ap-10"), H("0x1.6b515ap-13")),
    log_t=(H("0x1.999aa2p-2"), H("0x1.2419ap-2"), H("0x1.e8ff2p-3")),
    tanh_t=(H("-0x1.555554p-2"), H("0x1.111082p-3"), H("-0x1.b9f392p-5"), H("0x1.63b824p-6"),
            H("-0x1.0c800ap-7"), H("0x1.1911cep-9")),
    sin_s=(H("-0x1.555556p-3"), H("0x1.111174p-7"), H("-0x1.a05954p-13"), H("0x1.7c2c4ep-19")),
    cos_c=(H("0x1.555556p-5"), H("-0x1.6c175cp-10"), H("0x1.a06f9p-16"), H("-0x1.35851cp-22")),
    atan_t=(H("-0x1.55555p-2"), H("0x1.99966ap-3"), H("-0x1.244076p-3"), H("0x1.bf70b8p-4"),
            H("-0x1.444922p-4"), H("0x1.3555f2p-5")),
    asin_t=(H("0x1.55554cp-3"), H("0x1.3338acp-4"), H("0x1.6ca756p-5"), H("0x1.04d298p-5"),
            H("0x1.d52a64p-7"), H("0x1.34c2c4p-5")),
    expm1_lo=-18.0, erf_split=0.5, erfc_max=10.1,
    two_over_sqrt_pi=(H("0x1.20dd76p+0"), H("-0x1.f7ac92p-25")),
    erf_q=(H("-0x1.812746p-2"), H("0x1.ce2ea6p-4"), H("-0x1.b810fap-6"), H("0x1.53a44ap-8"),
           H("-0x1.839f24p-11")),
    erfc_p=(H("0x1.058672p-2"), H("-0x1.5fd386p-3"), H("0x1.1e2deep-4"), H("-0x1.2a8898p-7"),
            H("-0x1.606c7p-8"), H("0x1.a88504p-10"), H("0x1.949f02p-11"), H("-0x1.b3d008p-13"),
            H("-0x1.53f054p-13"), H("0x1.bec4ccp-18"), H("0x1.e47dd2p-16"), H("0x1.dcf18cp-18")),
    erfc_p_lo=(H("-0x1.27f78cp-28"), H("-0x1.2914bap-28"), H("-0x1.94a5bep-29")),
)

F64 = Format(
    name="double", bits=64, mant=52, bias=1023, qnan=0x7FF8000000000000,
    shifter=H("0x1.8p52"),
    exp_lo=-746.0, exp_hi=710.0, exp2_lo=-1076.0, exp2_hi=1025.0,
    log2e=H("0x1.71547652b82fep+0"), log2e_lo=H("0x1.777d0ffda0d24p-56"),
    ln2=H("0x1.62e42fefa39efp-1"), ln2_lo=H("0x1.abc9e3b39803fp-56"),
    # fdlibm's split of ln 2 (32 significant bits, then the rest):
    ln2_hi_short=H("0x1.62e42feep-1"), ln2_lo_short=H("0x1.a39ef35793c76p-33"),
    log_split=0x3FE5555555555555,
    two_thirds=H("0x1.5555555555555p-1"), two_thirds_lo=H("0x1.5555555555555p-55"),
    two_over_pi=(H("0x1.45f306dc9c883p-1"), H("-0x1.6b01ec5417056p-55")),
    pio2=(H("0x1.921fb54442d18p+0"), H("0x1.1a62633145c07p-54"), H("-0x1.f1976b7ed8fbcp-110"),
          H("0x1.4cf98e804177dp-164")),
    sin_tiny=H("0x1p-27"), cody_waite_max=H("0x1p50"), ph_digits=10, tanh_small=0.55,
    rsqrt_scale=256,
    exp_q=(H("0x1.0000000000000p-1"), H("0x1.555555555555bp-3"), H("0x1.5555555555501p-5"),
           H("0x1.111111110ebcep-7"), H("0x1.6c16c16c30ac9p-10"), H("0x1.a01a01b3b6e27p-13"),
           H("0x1.a01a01355adf3p-16"), H("0x1.71ddef906fa3bp-19"), H("0x1.27e5b5ad3afe2p-22"),
           H("0x1.af6ce7f7fe179p-26"), H("0x1.1e3c839215d5bp-29")),
    log_t=(H("0x1.9999999999967p-2"), H("0x1.2492492498f46p-2"), H("0x1.c71c71bc47c0ep-3"),
           H("0x1.745d1bd496b96p-3"), H("0x1.3b12957bfb535p-3"), H("0x1.113a6d4bf561ap-3"),
           H("0x1.dac63ea0743a3p-4"), H("0x1.019d5c5d1fb08p-3")),
    tanh_t=(H("-0x1.5555555555555p-2"), H("0x1.111111111107bp-3"), H("-0x1.ba1ba1ba101d9p-5"),
            H("0x1.664f487f34448p-6"), H("-0x1.226e34ba06066p-7"), H("0x1.d6d3aaf1f564cp-9"),
            H("-0x1.7da0775c326ebp-10"), H("0x1.353096d7af1e1p-11"), H("-0x1.f29c7f8b38466p-13"),
            H("0x1.8438e770bf2dbp-14"), H("-0x1.fa4549e938987p-16"), H("0x1.1c0a3156bd129p-18"),
            H("0x1.b7f4b2f39aa1bp-20")),
    sin_s=(H("-0x1.5555555555555p-3"), H("0x1.1111111111069p-7"), H("-0x1.a01a019ffe548p-13"),
           H("0x1.71de3a33ac36bp-19"), H("-0x1.ae642c5f5923fp-26"), H("0x1.6109c92a6ffcbp-33"),
           H("-0x1.a004ac675b283p-41")),
    cos_c=(H("0x1.5555555555555p-5"), H("-0x1.6c16c16c16b31p-10"), H("0x1.a01a019ffcf76p-16"),
           H("-0x1.27e4fb5a7da7bp-22"), H("0x1.1eed7001b0ba3p-29"), H("-0x1.9374fd5f3cb7cp-37"),
           H("0x1.9e048e7d0f07cp-45")),
    atan_t=(H("-0x1.5555555555551p-2"), H("0x1.9999999998ee7p-3"), H("-0x1.24924924485p-3"),
            H("0x1.c71c71a6d76b2p-4"), H("-0x1.745d131c27291p-4"), H("0x1.3b135892c48e5p-4"),
            H("-0x1.110c0f12fc021p-4"), H("0x1.e17c8349ee88cp-5"), H("-0x1.ac4ed55128173p-5"),
            H("0x1.77732c07c36e1p-5"), H("-0x1.2ecbf23aa9bbfp-5"), H("0x1.7fe292450a461p-6"),
            H("-0x1.0d74f5e8654aep-7")),
    asin_t=(H("0x1.5555555555579p-3"), H("0x1.333333332dc98p-4"), H("0x1.6db6db724cb8p-5"),
            H("0x1.f1c71a7deb5f7p-6"), H("0x1.6e8be1873c6e8p-6"), H("0x1.1c49bec444b78p-6"),
            H("0x1.ca245e409c141p-7"), H("0x1.755cd1a4b719ap-7"), H("0x1.6227cadc5ec52p-7"),
            H("0x1.d7adada8cde43p-9"), H("0x1.6812171a3bf8dp-6"), H("-0x1.5e75dce98913bp-6"),
            H("0x1.0d590c370ae53p-5")),
    expm1_lo=-40.0, erf_split=0.5, erfc_max=27.3,
    two_over_sqrt_pi=(H("0x1.20dd750429b6dp+0"), H("0x1.1ae3a914fed8p-56")),
    erf_q=(H("-0x1.812746b0379e7p-2"), H("0x1.ce2f21a042c23p-4"), H("-0x1.b82ce312890a8p-6"),
           H("0x1.565bcd0d97a08p-8"), H("-0x1.c02db3423d048p-11"), H("0x1.f9a2dbc44a466p-14"),
           H("-0x1.f4c203da09db6p-17"), H("0x1.b7e05b5a1ced9p-20"), H("-0x1.3cdb667e14652p-23")),
    erfc_p=(H("0x1.058671b52c776p-2"), H("-0x1.5fd386754eff9p-3"), H("0x1.1e2deea6b1165p-4"),
            H("-0x1.2a88e6107d7b3p-7"), H("-0x1.606e415525e78p-8"), H("0x1.a89eaff8979a4p-10"),
            H("0x1.9517bb6d5c938p-11"), H("-0x1.b6fbf9b0ceab1p-13"), H("-0x1.5ba437a506aabp-13"),
            H("0x1.20541ea925a80p-17"), H("0x1.2efa151ba7663p-15"), H("0x1.1e761891ebc9bp-17"),
            H("-0x1.6bfe19f07963ap-18"), H("-0x1.0e7622aee1485p-18"), H("-0x1.2eb8c6ccb5e1fp-22"),
            H("0x1.e8fc36aa71e97p-21"), H("0x1.0d8262ae49bf0p-21"), H("0x1.1315aa0055baep-30"),
            H("-0x1.391c21fdfc4f4p-23"), H("-0x1.61695f9827b70p-24"), H("0x1.a9439919028c4p-29"),
            H("0x1.f8e4dcf48f950p-26"), H("0x1.82b1314a44e38p-27"), H("-0x1.1e5e4ba12ffbcp-28"),
            H("-0x1.c7307af80c743p-29"), H("0x1.8d72615b66f8fp-35"), H("0x1.2ea64c00d6094p-32")),
    erfc_p_lo=(H("-0x1.164fc1f7a02a4p-58"), H("0x1.ce564ed422a0fp-57"),
               H("0x1.2840240536cf6p-58")),
)

# ---------------------------------------------------------------------------------------------
# A value with operators: the algorithms below read like their formulas.

class _V:
    """An IR value with arithmetic operators. Floats use fadd/fsub/fmul/fdiv (no fast-math
    flags: each operator is one IEEE-rounded operation); integers use add/sub/and/or/xor/shl/
    ashr; comparisons give masks (i1 or <N x i1>). Python numbers become constants (splatted
    for vectors) of the other operand's type."""
    __slots__ = ("b", "v")
    __hash__ = None

    def __init__(self, b: ir.IRBuilder, v: ir.Value):
        self.b, self.v = b, v

    @property
    def type(self):
        return self.v.type

    @property
    def is_float(self):
        t = self.v.type
        return isinstance(t.element if isinstance(t, ir.VectorType) else t,
                          (ir.FloatType, ir.DoubleType))

    def like(self, value) -> "_V":
        """A constant of this value's type."""
        if isinstance(value, _V):
            return value
        t = self.v.type
        if isinstance(t, ir.VectorType):
            return _V(self.b, ir.Constant(t, [value] * t.count))
        return _V(self.b, ir.Constant(t, value))

    def _op(self, other, fop, iop, swap=False):
        a, c = self, self.like(other)
        if swap:
            a, c = c, a
        return _V(self.b, getattr(self.b, fop if self.is_float else iop)(a.v, c.v))

    def __add__(self, o): return self._op(o, "fadd", "add")
    def __radd__(self, o): return self._op(o, "fadd", "add", swap=True)
    def __sub__(self, o): return self._op(o, "fsub", "sub")
    def __rsub__(self, o): return self._op(o, "fsub", "sub", swap=True)
    def __mul__(self, o): return self._op(o, "fmul", "mul")
    def __rmul__(self, o): return self._op(o, "fmul", "mul", swap=True)
    def __truediv__(self, o): return self._op(o, "fdiv", None)
    def __rtruediv__(self, o): return self._op(o, "fdiv", None, swap=True)
    def __and__(self, o): return self._op(o, None, "and_")
    def __or__(self, o): return self._op(o, None, "or_")
    def __xor__(self, o): return self._op(o, None, "xor")
    def __lshift__(self, o): return self._op(o, None, "shl")
    def __rshift__(self, o): return self._op(o, None, "ashr")

    def __neg__(self):
        return _V(self.b, self.b.fneg(self.v))

    def __invert__(self):
        return _V(self.b, self.b.not_(self.v))

    def _cmp(self, op, o):
        o = self.like(o)
        if self.is_float:   # ordered: false when either side is NaN
            return _V(self.b, self.b.fcmp_ordered(op, self.v, o.v))
        return _V(self.b, self.b.icmp_signed(op, self.v, o.v))

    def __lt__(self, o): return self._cmp("<", o)
    def __le__(self, o): return self._cmp("<=", o)
    def __gt__(self, o): return self._cmp(">", o)
    def __ge__(self, o): return self._cmp(">=", o)
    def eq(self, o): return self._cmp("==", o)
    def ne(self, o): return self._cmp("!=", o)    # ordered for floats


def _int_type(t):
    """The integer type of the same shape and width as float type t."""
    if isinstance(t, ir.VectorType):
        return ir.VectorType(_int_type(t.element), t.count)
    return ir.IntType(32 if isinstance(t, ir.FloatType) else 64)


def _format(t) -> Format:
    elem = t.element if isinstance(t, ir.VectorType) else t
    if not isinstance(elem, (ir.FloatType, ir.DoubleType)):
        raise TypeError(f"mathlib works on float, double and vectors of them, not {t}")
    return F32 if isinstance(elem, ir.FloatType) else F64


def _intrinsic(x: _V, name: str, nargs: int):
    t = x.type
    suffix = f"f{_format(t).bits}"                   # llvm.fma.f32, llvm.fma.v8f32, …
    if isinstance(t, ir.VectorType):
        suffix = f"v{t.count}{suffix}"
    full = f"llvm.{name}.{suffix}"
    module = x.b.module
    fn = module.globals.get(full)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(t, [t] * nargs), full)
    return fn


def fma(a: _V, b, c) -> _V:
    """a*b + c with one rounding (llvm.fma)."""
    b, c = a.like(b), a.like(c)
    return _V(a.b, a.b.call(_intrinsic(a, "fma", 3), [a.v, b.v, c.v]))


def _sqrt(a: _V) -> _V:
    return _V(a.b, a.b.call(_intrinsic(a, "sqrt", 1), [a.v]))


def _select(mask: _V, a, b) -> _V:
    """mask ? a : b, lane by lane; a or b (not both) may be a Python number."""
    ref = a if isinstance(a, _V) else b
    a, b = ref.like(a), ref.like(b)
    return _V(mask.b, mask.b.select(mask.v, a.v, b.v))


def _bits(x: _V) -> _V:
    return _V(x.b, x.b.bitcast(x.v, _int_type(x.type)))


def _from_bits(i: _V, like: _V) -> _V:
    return _V(i.b, i.b.bitcast(i.v, like.type))


def _iconst(x: _V, value: int) -> _V:
    """An integer constant of x's integer type (x a float value)."""
    t = _int_type(x.type)
    return _V(x.b, ir.Constant(t, [value] * t.count if isinstance(t, ir.VectorType) else value))


def _fconst_bits(x: _V, value: float) -> _V:
    """The bits of float constant `value`, as an integer constant of x's integer type."""
    return _bits(x.like(value))


def _isnan(x: _V) -> _V:
    return _V(x.b, x.b.fcmp_unordered("uno", x.v, x.v))


def _sign_mask(x: _V) -> int:
    """The integer with only the sign bit of x's format set (as a signed number)."""
    return -(1 << (_format(x.type).bits - 1))


def _abs(x: _V) -> _V:
    return _from_bits(_bits(x) & ~_sign_mask(x), x)


def _xor_sign(y: _V, sign: _V) -> _V:
    """y with its sign flipped where the integer `sign` has the sign bit set."""
    return _from_bits(_bits(y) ^ (sign & _sign_mask(y)), y)


def _horner(u: _V, coeffs) -> _V:
    """c0 + u*(c1 + u*(c2 + …)): one fma per coefficient, highest degree first."""
    acc = u.like(coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = fma(acc, u, c)
    return acc


def _rint(x: _V):
    """(n, i): x rounded to the nearest integer (ties to even) as a float and as an integer,
    by the shifter trick: adding 1.5*2^mant pushes the fraction bits out. |x| < 2^(mant-1)."""
    f = _format(x.type)
    t = x + f.shifter
    return t - f.shifter, _bits(t) - _fconst_bits(x, f.shifter)


def _int_to_float(i: _V, like: _V) -> _V:
    """Exact conversion of a small integer (|i| < 2^(mant-1)): the shifter trick backwards."""
    f = _format(like.type)
    return _from_bits(i + _fconst_bits(like, f.shifter), like) - f.shifter


def _pow2(k: _V, like: _V) -> _V:
    """2^k for an integer k in the normal exponent range, built from its bits."""
    f = _format(like.type)
    return _from_bits((k + f.bias) << f.mant, like)


def _scale(y: _V, n: _V) -> _V:
    """y * 2^n for y in [1/2, 2) and n up to one past either end of the exponent range, with a
    single rounding (into a subnormal, or to inf) at the end: y * 2^(n - n//2) is exact."""
    n1 = n >> 1
    return (y * _pow2(n - n1, y)) * _pow2(n1, y)


def _clamp(x: _V, lo: float, hi: float) -> _V:
    """min(max(x, lo), hi); a NaN passes through."""
    return _select(x > hi, hi, _select(x < lo, lo, x))


def _nan(x: _V) -> _V:
    """The canonical quiet NaN, of x's type."""
    return _from_bits(_iconst(x, _format(x.type).qnan), x)


def _canonical(y: _V) -> _V:
    """y, with any NaN replaced by the canonical NaN (the targets disagree on NaN bits)."""
    return _select(_isnan(y), _nan(y), y)


# Error-free transformations (Knuth, Dekker; with fma for the product).

def _two_sum(a: _V, b: _V):
    """s + e = a + b exactly, s = RN(a + b)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _fast_two_sum(a: _V, b):
    """s + e = a + b exactly, when |a| >= |b| (or a = 0)."""
    s = a + b
    return s, b - (s - a)


def _two_prod(a: _V, b) -> tuple:
    """p + e = a * b exactly (barring underflow)."""
    p = a * b
    return p, fma(a, b, -p)


def _wrap(b: ir.IRBuilder, x: ir.Value) -> tuple:
    return _V(b, x), _format(x.type)


# ---------------------------------------------------------------------------------------------
# exp, exp2: x = n*ln2 + r, e^x = 2^n * e^r.

def _exp_kernel(f: Format, r: _V, rl: _V) -> _V:
    """e^(r + rl) for |r| <= ln2/2 and |rl| <= ulp(r): a value in [1/sqrt2, sqrt2].
    1 + r is kept exactly as hi + lo, so the only large rounding is the last addition."""
    q = (r * r) * _horner(r, f.exp_q)          # e^r - 1 - r
    hi = 1.0 + r
    lo = (1.0 - hi) + r                         # hi + lo = 1 + r exactly (|r| < 1)
    return hi + (lo + (q + fma(rl, r, rl)))     # e^(r+rl) ~ e^r + rl*(1 + r)


def _exp2_dw(f: Format, xh: _V, xl=None) -> _V:
    """2^(xh + xl), for a float xh or a double-word xh + xl (pow)."""
    xc = _clamp(xh, f.exp2_lo, f.exp2_hi)       # beyond these the result is 0 or inf anyway
    n, ni = _rint(xc)
    t = xc - n                                  # exact, |t| <= 1/2
    r, rl = _two_prod(t, f.ln2)                 # r + rl = t * ln2 to 2p bits
    rl = fma(t, f.ln2_lo, rl)
    if xl is not None:
        xl = _select(xc.eq(xh), xl, 0.0)        # a clamped (or infinite) xh drops its tail
        r, rl = _fast_two_sum(r, fma(xl, f.ln2, rl))   # |rl| <= ulp(r) again
    return _scale(_exp_kernel(f, r, rl), ni)


def exp(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """e^x. Reduction x = n*ln2 + r (Cody-Waite with fma), |r| <= ln2/2."""
    x, f = _wrap(b, x)
    return _canonical(_exp(f, x)).v


def _exp(f: Format, x: _V) -> _V:
    """e^x before NaN canonicalisation (tanh and sigmoid build on it)."""
    ni, r, rl = _exp_reduce(f, _clamp(x, f.exp_lo, f.exp_hi))  # beyond, the result is 0 or inf
    return _scale(_exp_kernel(f, r, rl), ni)


def _exp_reduce(f: Format, x: _V):
    """(n, r, rl): x = n*ln2 + r + rl, n an integer, |r| <= ln2/2 (plus a hair), |rl| <= ulp(r),
    for x in [exp_lo, exp_hi] and a little beyond, where the first step is exact."""
    n, ni = _rint(x * f.log2e)
    rh = fma(-n, f.ln2, x)                      # exact: both terms are on a common grid
    r = fma(-n, f.ln2_lo, rh)
    return ni, r, fma(-n, f.ln2_lo, rh - r)     # rl: what that rounding lost


def exp2(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """2^x. Reduction x = n + t (exact), 2^t = e^(t*ln2) with t*ln2 kept to 2p bits."""
    x, f = _wrap(b, x)
    return _canonical(_exp2_dw(f, x)).v


# ---------------------------------------------------------------------------------------------
# log, log2: x = 2^k * (1 + g) with 1 + g in [2/3, 4/3), log(1+g) = 2 atanh(g / (2 + g)).

def _log_reduce(f: Format, x: _V):
    """(k, g): x = 2^k * (1 + g), |g| <= 1/3, for finite x > 0 (subnormals too). g is exact."""
    sub = x < 2.0 ** (1 - f.bias)                          # below the smallest normal
    xs = _select(sub, x * float(2 ** f.mant), x)          # make subnormals normal
    ix = _bits(xs)
    e = (ix - f.log_split) >> f.mant                       # exponent, relative to [2/3, 4/3)
    m = _from_bits(ix - (e << f.mant), x)                  # the mantissa, in [2/3, 4/3)
    k = _int_to_float(e, x) - _select(sub, x.like(float(f.mant)), 0.0)
    return k, m - 1.0                                      # m - 1 is exact (Sterbenz)


def _log1p_dw(f: Format, g: _V):
    """log(1 + g) for |g| <= 1/3 as a double-word h + l, relative error about 2^-(p+10).
    With s = g/(2+g), |s| <= 1/5: log(1+g) = 2s + 2s^3/3 + s^5 T(s^2); the first two terms
    are carried in double-word, the tail (at most 2^-11.6 of the sum) in working precision."""
    d = 2.0 + g
    dl = g - (d - 2.0)                          # d + dl = 2 + g exactly
    sh = g / d
    sl = (fma(-sh, d, g) - sh * dl) / d         # sh + sl = g / (2 + g) to 2p bits
    u, ul = _two_prod(sh, sh)                   # s^2
    c, cl = _two_prod(sh, u)                    # s^3 = c + cl
    cl = cl + fma(sh, ul, 3.0 * u * sl)
    t, tl = _two_prod(c, f.two_thirds)          # 2s^3/3 = t + tl
    tl = tl + fma(c, f.two_thirds_lo, f.two_thirds * cl)
    tail = (c * u) * _horner(u, f.log_t)        # s^5 T(s^2)
    h, e = _fast_two_sum(2.0 * sh, t)           # |2s| >= |2s^3/3|
    return h, e + ((2.0 * sl + tl) + tail)


def _log2_dw(f: Format, x: _V):
    """log2(x) as a double-word, for finite x > 0."""
    k, g = _log_reduce(f, x)
    h, l = _log1p_dw(f, g)
    ph, pl = _two_prod(h, f.log2e)              # (h + l) * log2(e) to 2p bits
    pl = pl + fma(h, f.log2e_lo, l * f.log2e)
    s, e = _fast_two_sum(k, ph)                 # |k| >= 1 > |ph|, or k = 0
    return _fast_two_sum(s, e + pl)


def _log_special(x: _V, y: _V) -> _V:
    """y for finite x > 0; log(+0) = log(-0) = -inf, log(x < 0) = NaN, log(inf) = inf."""
    ordinary = (x > 0.0) & (x < float("inf"))
    special = _select(x.eq(0.0), float("-inf"), _select(x < 0.0, _nan(x), x))
    return _canonical(_select(ordinary, y, special))


def log(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Natural logarithm: k*ln2 + log(1+g), one rounding at the end."""
    x, f = _wrap(b, x)
    k, g = _log_reduce(f, x)
    h, l = _log1p_dw(f, g)
    s, e = _fast_two_sum(k * f.ln2_hi_short, h) # k*ln2_hi_short is exact; |it| > |h| or k = 0
    y = s + (e + fma(k, f.ln2_lo_short, l))
    return _log_special(x, y).v


def log2(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Base-2 logarithm: k + log(1+g)*log2(e), one rounding at the end."""
    x, f = _wrap(b, x)
    s, e = _log2_dw(f, x)
    return _log_special(x, s + e).v


# ---------------------------------------------------------------------------------------------
# tanh and sigmoid, from exp.

def tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """tanh x = sign(x) * (|x| < 0.55 ? |x| + |x|^3 T(x^2) : 1 - 2/(e^(2|x|) + 1))."""
    x, f = _wrap(b, x)
    a = _abs(x)
    u = a * a
    small = fma(a * u, _horner(u, f.tanh_t), a)
    large = 1.0 - 2.0 / (_exp(f, 2.0 * a) + 1.0)           # e^(2a) = inf gives exactly 1
    y = _select(a < f.tanh_small, small, large)
    return _canonical(_xor_sign(y, _bits(x))).v            # odd: tanh(-x) = -tanh(x)


def sigmoid(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """1/(1 + e^-x), as e^-|x| / (1 + e^-|x|) for x < 0 so that nothing overflows; the
    denominator is kept exactly and the quotient corrected once."""
    x, f = _wrap(b, x)
    e = _exp(f, -_abs(x))                                  # in [0, 1]
    num = _select(x >= 0.0, 1.0, e)
    d = 1.0 + e
    dl = (1.0 - d) + e                                     # d + dl = 1 + e exactly
    y = num / d
    y = y + (fma(-y, d, num) - y * dl) / d                 # num/(d + dl) to ~2p bits
    return _canonical(y).v


# ---------------------------------------------------------------------------------------------
# sin, cos: x = q*pi/2 + r, |r| <= pi/4, then sin or cos of r by the quadrant q mod 4.

def _sincos_reduce(f: Format, x: _V):
    """(q, rh, rl): x = q*pi/2 + rh + rl with |rh + rl| <= pi/4 (plus a hair), for |x| <=
    cody_waite_max. Cody-Waite with pi/2 in four parts, every product k*p_i kept exactly (fma) and
    summed without loss, so the reduced argument is right to ~2^-(3p) absolute even when x is
    extremely close to a multiple of pi/2."""
    c, c_lo = f.two_over_pi
    vh = x * c
    vl = fma(x, c_lo, fma(x, c, -vh))           # x*2/pi = vh + vl
    k, q = _rint(vh)
    d = (vh - k) + vl                           # RN(x*2/pi) may sit on the wrong side of a half:
    up, down = d > 0.5, d < -0.5                # then step k by one
    k = k + _select(up, 1.0, _select(down, x.like(-1.0), 0.0))
    q = q + _select(up, _iconst(x, 1), _select(down, _iconst(x, -1), _iconst(x, 0)))
    p1, p2, p3, p4 = f.pio2
    a = fma(-k, p1, x)                          # exact: x and k*p1 lie on a common fine grid
    m2, e2 = _two_prod(k, p2)                   # k*p2 = m2 + e2 exactly
    m3, e3 = _two_prod(k, p3)                   # k*p3 = m3 + e3 exactly
    s, t1 = _two_sum(a, -m2)                    # a - m2 - e2 - m3, exactly, as s + t1 + t2 + t3
    s, t2 = _two_sum(s, -e2)
    s, t3 = _two_sum(s, -m3)
    rl = ((t1 + t2) + t3) - fma(k, p4, e3)      # the small terms; their rounding is ~2^-3p
    return (q, *_fast_two_sum(s, rl))


def _sin_poly(f: Format, r: _V, rl: _V):
    """sin(r + rl) ~ r + r^3 S(r^2) + rl*(1 - r^2/2), as a double-word (sin takes its high part,
    tan both)."""
    u = r * r
    return _fast_two_sum(r, fma(r * u, _horner(u, f.sin_s), fma(-0.5 * u, rl, rl)))


def _cos_poly(f: Format, r: _V, rl: _V):
    """cos(r + rl) ~ 1 - r^2/2 + r^4 C(r^2) - r*rl, with 1 - r^2/2 kept as a double-word; the
    result as a double-word, like _sin_poly's."""
    u, ul = _two_prod(r, r)                     # r^2 = u + ul
    hu = 0.5 * u
    hi = 1.0 - hu
    lo = (1.0 - hi) - hu                        # hi + lo = 1 - u/2 exactly
    tail = fma(u * u, _horner(u, f.cos_c), -fma(r, rl, 0.5 * ul))
    return _fast_two_sum(hi, lo + tail)


# Payne-Hanek: beyond cody_waite_max, x = m * 2^e (m the integer mantissa) is reduced exactly.
# Only the bits of 2/pi from about 2^-e on matter: earlier ones make m * 2^e * bit a multiple
# of 4 (a whole number of turns), later ones are below the precision kept. Those bits are
# fetched from a table of 2/pi in DIGIT-bit digits and multiplied by m in integer arithmetic.

DIGIT = 22          # bits per digit: a digit converts to a float exactly (shifter trick, even
                    # for float) and sums of products of digits fit an i64 with room for carries
LEAD = 2            # zero digits before 2/pi's first, so the window's start is never negative


def _two_over_pi_digits(count: int) -> list:
    """The first `count` DIGIT-bit digits of 2/pi after the binary point, preceded by LEAD
    zeros: pi by Machin's formula in integer arithmetic, with 64 guard bits."""
    bits = count * DIGIT + 64
    one = 1 << bits

    def atan_inv(n):                        # atan(1/n) * 2^bits, by its Taylor series
        total, term, k = 0, one // n, 0
        while term:
            total += term // (2 * k + 1) * (-1) ** k
            term //= n * n
            k += 1
        return total
    pi = 16 * atan_inv(5) - 4 * atan_inv(239)
    frac = ((2 * one * one) // pi) >> 64    # 2/pi * 2^(count*DIGIT), truncated
    mask = (1 << DIGIT) - 1
    return [0] * LEAD + [(frac >> (DIGIT * (count - 1 - i))) & mask for i in range(count)]


# Enough for the largest double (e = 971) and the widest window (10 digits), plus one.
TWO_OVER_PI = _two_over_pi_digits((971 + DIGIT) // DIGIT + 12)


def _table(b: ir.IRBuilder) -> ir.GlobalVariable:
    """The digits of 2/pi as an internal constant i32 array of the module (one per module)."""
    name = "mathlib.two_over_pi"
    g = b.module.globals.get(name)
    if g is None:
        t = ir.ArrayType(ir.IntType(32), len(TWO_OVER_PI))
        g = ir.GlobalVariable(b.module, t, name)
        g.global_constant = True
        g.linkage = "internal"
        g.initializer = ir.Constant(t, TWO_OVER_PI)
    return g


def _digit_at(i: _V) -> _V:
    """TWO_OVER_PI[i] as an i64, i an i64 (or a vector of them: one load per lane)."""
    b, g = i.b, _table(i.b)

    def load(idx):
        ptr = b.gep(g, [ir.Constant(ir.IntType(64), 0), idx], inbounds=True,
                    source_etype=g.value_type)
        return b.zext(b.load(ptr, typ=ir.IntType(32)), ir.IntType(64))
    t = i.type
    if not isinstance(t, ir.VectorType):
        return _V(b, load(i.v))
    out = ir.Constant(t, ir.Undefined)
    for lane in range(t.count):
        at = ir.Constant(ir.IntType(32), lane)
        out = b.insert_element(out, load(b.extract_element(i.v, at)), at)
    return _V(b, out)


def _to_i64(i: _V) -> _V:
    """A non-negative integer (of x's integer type) widened to i64."""
    t = i.type
    wide = ir.VectorType(ir.IntType(64), t.count) if isinstance(t, ir.VectorType) else ir.IntType(64)
    return i if t == wide else _V(i.b, i.b.zext(i.v, wide))


def _from_i64(i: _V, like: _V) -> _V:
    """An i64 value that fits, as like's integer type."""
    t = _int_type(like.type)
    return i if i.type == t else _V(i.b, i.b.trunc(i.v, t))


def _beyond_cody_waite(f: Format, x: _V) -> _V:
    """The lanes that take Payne-Hanek: finite, and too large for Cody-Waite."""
    a = _abs(x)
    return (a > f.cody_waite_max) & (a < float("inf"))


def _payne_hanek(f: Format, x: _V):
    """(q, rh, rl) as _sincos_reduce gives them, for finite |x| > cody_waite_max (other lanes
    may hold anything: they are replaced by a harmless value and their result is unused)."""
    n, mask = f.ph_digits, (1 << DIGIT) - 1
    ia = _bits(_select(_beyond_cody_waite(f, x), _abs(x), 2.0 * f.cody_waite_max))
    m = _to_i64((ia & ((1 << f.mant) - 1)) | (1 << f.mant))        # a = m * 2^e
    e = _to_i64(ia >> f.mant) - (f.bias + f.mant)
    # The window: n digits of 2/pi from bit e - DIGIT + 1 on, W = sum w_j 2^(DIGIT (n-1-j)), so
    # that a * 2/pi = m * W * 2^(-DIGIT (n-1)) mod 4 (bits before the window give multiples of
    # 4; those after it, less than 2^(p - DIGIT (n-1))). The window starts inside table digit
    # k0 at bit offset sh.
    start = e + (LEAD - 1) * DIGIT                                  # >= 0 for e >= -1
    k0 = _V(x.b, x.b.udiv(start.v, start.like(DIGIT).v))
    sh = start - k0 * DIGIT
    d = [_digit_at(k0 + k) for k in range(n + 1)]
    w = [((d[k] << sh) | (d[k + 1] >> (DIGIT - sh))) & mask for k in range(n)]
    # P = m * W in base 2^DIGIT, least significant digit first; digits above n-1 only add
    # multiples of 4 and are not formed.
    md = [(m >> (DIGIT * i)) & mask for i in range(-(-(f.mant + 1) // DIGIT))]
    col = [None] * n
    for i, mi in enumerate(md):
        for j, wj in enumerate(w):
            k = i + n - 1 - j
            if k < n:
                col[k] = mi * wj if col[k] is None else col[k] + mi * wj
    c, carry = [], None
    for k in range(n):
        t = col[k] if carry is None else col[k] + carry
        c.append(t & mask)
        carry = t >> DIGIT
    # c[n-1] holds the integer part (its low 2 bits, the quadrant), c[n-2] … c[0] the fraction.
    # Round to the nearest quadrant: a fraction >= 1/2 becomes fraction - 1, q + 1.
    up = _select(c[n - 2] >= (1 << (DIGIT - 1)), c[0].like(1), 0)
    q = c[n - 1] + up
    top = c[n - 2] - (up << DIGIT)                                  # signed, in [-2^21, 2^21)
    # The fraction as a double-word: digits summed exactly from the least significant (all
    # positive) up; only the last sum, with the signed top digit, may cancel, and it is exact.
    scale = [x.like(2.0 ** (-DIGIT * (n - 1 - k))) for k in range(n - 1)]
    hi, lo = _int_to_float(_from_i64(c[0], x), x) * scale[0], x.like(0.0)
    for k in range(1, n - 1):
        v = _int_to_float(_from_i64(top if k == n - 2 else c[k], x), x) * scale[k]
        hi, err = _two_sum(v, hi)
        lo = lo + err
    fh, fl = _fast_two_sum(hi, lo)
    p1, p2 = f.pio2[:2]                                             # r = fraction * pi/2
    rh, rl = _two_prod(fh, p1)
    rl = rl + fma(fh, p2, fl * p1)
    rh, rl = _fast_two_sum(rh, rl)
    # sin and cos are odd and even: reduce |x|, then negate q and r for x < 0.
    neg = x < 0.0
    q = _from_i64(q, x)
    return (_select(neg, _iconst(x, 0) - q, q), _select(neg, -rh, rh), _select(neg, -rl, rl))


def _any(mask: _V) -> ir.Value:
    """An i1: whether any lane of the mask is set."""
    b, t = mask.b, mask.type
    if not isinstance(t, ir.VectorType):
        return mask.v
    out = b.extract_element(mask.v, ir.Constant(ir.IntType(32), 0))
    for lane in range(1, t.count):
        out = b.or_(out, b.extract_element(mask.v, ir.Constant(ir.IntType(32), lane)))
    return out


def _reduce(f: Format, x: _V):
    """(q, rh, rl) for every finite x: Cody-Waite, and where some lane is beyond its range, a
    branch to Payne-Hanek for that lane. The builder ends in a new block (the join)."""
    b = x.b
    fast = _sincos_reduce(f, x)
    big = _beyond_cody_waite(f, x)
    before = b.block
    with b.if_then(_any(big), likely=False):
        slow = [_select(big, s, v) for s, v in zip(_payne_hanek(f, x), fast)]
        slow_end = b.block
    out = []
    for v, s in zip(fast, slow):
        phi = b.phi(v.type)
        phi.add_incoming(v.v, before)
        phi.add_incoming(s.v, slow_end)
        out.append(_V(b, phi))
    return out


def _sincos(b: ir.IRBuilder, x: ir.Value, quadrant_shift: int) -> ir.Value:
    x, f = _wrap(b, x)
    q, r, rl = _reduce(f, x)
    q = q + quadrant_shift                      # cos x = sin(x + pi/2)
    s, c = _sin_poly(f, r, rl)[0], _cos_poly(f, r, rl)[0]
    y = _select((q & 1).eq(0), s, c)            # quadrants 1, 3: the cosine of r
    y = _xor_sign(y, (q & 2) << (f.bits - 2))  # quadrants 2, 3: negated
    if quadrant_shift == 0:
        y = _select(_abs(x) < f.sin_tiny, x, y) # sin x = x exactly here; keeps sin(-0) = -0
    y = _select(_abs(x) < float("inf"), y, _nan(x))     # inf and NaN: NaN
    return y.v


def sin(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """sin x for every float; NaN for inf and NaN. Branches (rarely) for |x| > 2^22 / 2^50."""
    return _sincos(b, x, 0)


def cos(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """cos x for every float; NaN for inf and NaN. Branches (rarely) for |x| > 2^22 / 2^50."""
    return _sincos(b, x, 1)


# ---------------------------------------------------------------------------------------------
# tan: the reduction of sin and cos, and both their polynomials.

def tan(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """tan x = sin r / cos r, or -cos r / sin r in odd quadrants: both polynomials as
    double-words, the quotient corrected once. Branches (rarely) for |x| > 2^22 / 2^50."""
    x, f = _wrap(b, x)
    q, r, rl = _reduce(f, x)
    s, c = _sin_poly(f, r, rl), _cos_poly(f, r, rl)
    odd = (q & 1).eq(1)                         # tan(r + pi/2) = -cos r / sin r
    nh, nl = (_select(odd, cv, sv) for sv, cv in zip(s, c))
    dh, dl = (_select(odd, sv, cv) for sv, cv in zip(s, c))
    y = nh / dh
    y = y + (fma(-y, dh, nh) + (nl - y * dl)) / dh      # (nh + nl)/(dh + dl) to ~2p bits
    y = _xor_sign(y, q << (f.bits - 1))        # odd quadrants: negated
    y = _select(_abs(x) < f.sin_tiny, x, y)     # tan x = x exactly here; keeps tan(-0) = -0
    return _select(_abs(x) < float("inf"), y, _nan(x)).v


# ---------------------------------------------------------------------------------------------
# atan2, atan, asin, acos: an odd polynomial on [-1/2, 1/2] after a reduction that is exact or
# carried in double-word, plus a multiple of pi/4 added in double-word.

def _add_quarter_pis(f: Format, k: _V, zh: _V, zl: _V) -> _V:
    """k*pi/4 + zh + zl with one significant rounding, for k in {0, 1, 2, 3, 4} (a float) and
    |zh| <= |k*pi/4| where k != 0."""
    p1, p2 = f.pio2[:2]
    oh, ol = _two_prod(k, 0.5 * p1)             # k*pi/4 = oh + ol to 2p bits
    ol = fma(k, 0.5 * p2, ol)
    s, e = _fast_two_sum(oh, zh)
    return s + (e + (ol + zl))


def _atan2(f: Format, y: _V, x: _V) -> _V:
    """atan2(y, x) with C99's special cases, never forming y/x itself: the angle of (|x|, |y|)
    is k*pi/4 + atan(z) with z = n/d, |z| <= 1/2, n and d exact or double-word."""
    ay, ax = _abs(y), _abs(x)
    # Both below 2^64 / 2^512 (about the square root of the range): scale both by that (exact;
    # the angle is unchanged). Then the halves below are exact, and the remainder of n/d below
    # loses (by underflow) no more than 2^-40 of an ulp of the result: n is above 2^-85 /
    # 2^-562 when scaled, d above 2^64 / 2^512 when not.
    root = 2.0 ** ((f.bias + 1) // 2)
    up = _select((ay < root) & (ax < root), ay.like(root), 1.0)
    ay, ax = ay * up, ax * up
    # Points at infinity, and the origin, move to one with the same angle: an infinite
    # coordinate becomes 1 and a finite one 0; (0, 0) becomes (1, 0) (the sign of x decides).
    inf = float("inf")
    y_inf, x_inf = ay.eq(inf), ax.eq(inf)
    ay, ax = (_select(y_inf, 1.0, _select(x_inf, ay.like(0.0), ay)),
              _select(x_inf | ay.eq(0.0), 1.0, _select(y_inf, ax.like(0.0), ax)))
    # |y|/|x| < 1/2: z = |y|/|x|; > 2: pi/2 + atan(-|x|/|y|); between: pi/4 + atan of
    # (|y| - |x|)/(|y| + |x|), from halves (exact there: both are normal) so that nothing
    # overflows; the difference is exact (Sterbenz), the sum kept as a double-word.
    small, large = 2.0 * ay < ax, ay > 2.0 * ax
    hy, hx = 0.5 * ay, 0.5 * ax
    sh, sl = _two_sum(hy, hx)
    n = _select(small, ay, _select(large, -ax, hy - hx))
    d = _select(small, ax, _select(large, ay, sh))
    dl = _select(small | large, 0.0, sl)
    k = _select(small, 0.0, _select(large, x.like(2.0), 1.0))
    # x < 0 (-0 too): the angle is pi - that, (4 - k)*pi/4 + atan(-z).
    x_neg = _bits(x) < 0
    n, k = _select(x_neg, -n, n), _select(x_neg, 4.0 - k, k)
    zh = n / d
    zl = (fma(-zh, d, n) - zh * dl) / d         # n/(d + dl) - zh, to ~2p bits
    u = zh * zh
    tail = fma(zh * u, _horner(u, f.atan_t), fma(-u, zl, zl))  # atan(zh + zl) - zh
    r = _xor_sign(_add_quarter_pis(f, k, zh, tail), _bits(y))     # odd in y
    return _select(_isnan(x) | _isnan(y), _nan(x), r)


def atan2(b: ir.IRBuilder, y: ir.Value, x: ir.Value) -> ir.Value:
    """The angle of the point (x, y), in [-pi, pi]; C99's special cases (signed zeros,
    infinities)."""
    y, f = _wrap(b, y)
    return _atan2(f, y, _V(b, x)).v


def atan(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """atan x = atan2(x, 1)."""
    x, f = _wrap(b, x)
    return _atan2(f, x, x.like(1.0)).v


def _asin_acos(b: ir.IRBuilder, x: ir.Value, is_acos: bool) -> ir.Value:
    """k*pi/4 + m*asin t, where t = |x| <= 1/2, or t = sqrt((1 - |x|)/2) <= 1/2 (a double-word)
    by asin|x| = pi/2 - 2 asin t; acos x = pi/2 - asin x."""
    x, f = _wrap(b, x)
    a = _abs(x)
    big = a > 0.5
    w = 0.5 * (1.0 - a)                         # exact for a in [1/2, 1] (Sterbenz)
    th = _select(big, _sqrt(w), a)
    tl = _select(big & (a < 1.0), fma(-th, th, w) / (th + th), 0.0)  # sqrt(w) - th (0 at a = 1)
    u = th * th
    tail = fma(th * u, _horner(u, f.asin_t), fma(0.5 * u, tl, tl))   # asin(th + tl) - th
    if is_acos:     # pi/2 -+ asin t; 2 asin t for x > 1/2, pi - 2 asin t for x < -1/2
        k = _select(big, _select(x < 0.0, 4.0, x.like(0.0)), 2.0)
        m = _xor_sign(_select(big, 2.0, x.like(-1.0)), _bits(x))
    else:           # asin t; pi/2 - 2 asin t for |x| > 1/2, then odd in x
        k, m = _select(big, 2.0, x.like(0.0)), _select(big, -2.0, x.like(1.0))
    y = _add_quarter_pis(f, k, m * th, m * tail)
    if not is_acos:
        y = _xor_sign(y, _bits(x))
    return _select(a <= 1.0, y, _nan(x)).v      # |x| > 1 and NaN: NaN


def asin(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """asin x in [-pi/2, pi/2]; NaN outside [-1, 1]."""
    return _asin_acos(b, x, False)


def acos(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """acos x in [0, pi]; NaN outside [-1, 1]."""
    return _asin_acos(b, x, True)


# ---------------------------------------------------------------------------------------------
# rsqrt, pow.

def rsqrt(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """1/sqrt(x): y0 = 1/sqrt(x) (two correctly rounded operations), then one Newton step
    y = y0 + y0/2 * (1 - x*y0^2) with the residual computed to 2p bits."""
    x, f = _wrap(b, x)
    s = f.rsqrt_scale                           # keep y0^2 normal: rescale huge and tiny x
    big, tiny = x > float(2.0 ** (2 * s)), x < float(2.0 ** (-2 * s))
    xs = x * _select(big, float(2.0 ** (-2 * s)), _select(tiny, x.like(2.0 ** (2 * s)), 1.0))
    y0 = 1.0 / _sqrt(xs)
    y2, y2l = _two_prod(y0, y0)
    e = fma(-xs, y2, 1.0) - xs * y2l            # 1 - x*y0^2
    y = fma(0.5 * y0, e, y0)
    y = y * _select(big, float(2.0 ** -s), _select(tiny, x.like(2.0 ** s), 1.0))
    ordinary = (x > 0.0) & (x < float("inf"))   # else y0 is already right: +-inf, 0, NaN
    return _canonical(_select(ordinary, y, y0)).v


def _int_parity(f: Format, y: _V):
    """(is_integer, is_odd_integer) masks for y."""
    a = _abs(y)
    big = a >= float(2 ** f.mant)               # every float this large is an integer
    t = a + float(2 ** f.mant)                  # below it: t's last bit is a rounded to integer
    is_int = big | (t - float(2 ** f.mant)).eq(a)
    odd_small = (_bits(t) & 1).eq(1)
    odd_big = (a < float(2 ** (f.mant + 1))) & (_bits(a) & 1).eq(1)
    return is_int, is_int & _select(big, odd_big, odd_small)


def pow(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """x^y = 2^(y * log2|x|), with log2|x| and the product carried in double-word; the special
    cases of C99 / NumPy `power`."""
    x, f = _wrap(b, x)
    y = _V(b, y)
    ax = _abs(x)
    lh, ll = _log2_dw(f, ax)
    ph, pl = _two_prod(y, lh)
    mag = _exp2_dw(f, ph, fma(y, ll, pl))       # |x|^y
    y_int, y_odd = _int_parity(f, y)
    neg = _select(y_odd, _bits(x), _iconst(x, 0))          # x < 0 and y odd: negative result
    r = _xor_sign(mag, neg)
    inf = float("inf")
    finite_y = _abs(y) < inf
    r = _select((x < 0.0) & finite_y & ~y_int, _nan(x), r)  # negative base, fractional y
    # y = +-inf: |x| = 1 gives 1; |x| < 1 with y = -inf, or |x| > 1 with y = +inf, gives inf.
    y_inf = _abs(y).eq(inf)
    to_inf = ((ax < 1.0) & (y < 0.0)) | ((ax > 1.0) & (y > 0.0))
    r = _select(y_inf & ~_isnan(x), _select(ax.eq(1.0), 1.0, _select(to_inf, x.like(inf), 0.0)), r)
    # x = +-0 or +-inf: 0 or inf, negative when x is negative and y an odd integer.
    x_zero, x_inf = ax.eq(0.0), ax.eq(inf)
    to_inf = (x_zero & (y < 0.0)) | (x_inf & (y > 0.0))
    r = _select(x_zero | x_inf, _xor_sign(_select(to_inf, x.like(inf), 0.0), neg), r)
    r = _select(_isnan(x) | _isnan(y), _nan(x), r)
    r = _select(y.eq(0.0) | x.eq(1.0), 1.0, r)             # even pow(NaN, 0) and pow(1, NaN)
    return r.v


# ---------------------------------------------------------------------------------------------
# log1p, expm1, sinh, cosh, erf, erfc: the log and exp reductions, with the sums that cancel in
# the naive formulas carried in double-word.

def _keep_tiny(x: _V, y: _V) -> _V:
    """x where |x| < 2^-(p+1), where f(x) = x + O(x^2) rounds to x (log1p, expm1): keeps -0
    and the subnormals exact."""
    return _select(_abs(x) < float(2.0 ** -(_format(x.type).mant + 2)), x, y)


def _add_dw(a: tuple, b: tuple) -> tuple:
    """(ah + al) + (bh + bl) as a double-word, for sums that do not cancel much."""
    s, e = _two_sum(a[0], b[0])
    return _fast_two_sum(s, e + (a[1] + b[1]))


def log1p(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """log(1 + x) = log(u) + c/u where u + c = 1 + x exactly; when u's reduction leaves k = 0,
    g + c is x itself and log1p is log's log(1 + g) of x, with no rounding of 1 + x at all."""
    x, f = _wrap(b, x)
    u, c = _two_sum(x.like(1.0), x)
    k, g = _log_reduce(f, u)
    near = k.eq(0.0)                                        # 1 + x in [2/3, 4/3)
    h, l = _log1p_dw(f, _select(near, x, g))
    l = l + _select(near, 0.0, c / u)                       # log(u + c) = log(u) + c/u
    s, e = _fast_two_sum(k * f.ln2_hi_short, h)
    y = s + (e + fma(k, f.ln2_lo_short, l))
    return _keep_tiny(x, _log_special(u, y)).v              # x = -1: u = 0; x < -1: u < 0


def _expm1_kernel(f: Format, r: _V, rl: _V) -> tuple:
    """e^(r + rl) - 1 as a double-word, for |r| <= ln2/2 and |rl| <= ulp(r): r + r^2/2 exactly
    (exp_q[0] is 1/2), the rest, r^3 Q1(r) + rl e^r, at most 2^-5 of the sum, rounded."""
    u, ul = _two_prod(r, 0.5 * r)                           # r^2/2 = u + ul
    tail = ((2.0 * u) * r) * _horner(r, f.exp_q[1:])
    s, e = _fast_two_sum(r, u)                              # |r| >= r^2/2
    return _fast_two_sum(s, e + (ul + (tail + fma(rl, r, rl))))


def _pow2_neg(n: _V, like: _V) -> _V:
    """2^-n for an integer n below the bias; beyond, 2^(1-bias), as negligible in the sums it
    goes into as 2^-n would be."""
    top = _format(like.type).bias - 1
    return _pow2(_iconst(like, 0) - _select(n > top, _iconst(like, top), n), like)


def expm1(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """e^x - 1 = 2^n ((1 - 2^-n) + (e^r - 1)), with x = n*ln2 + r as for exp and the sum in
    double-word: no cancellation is left, near 0 (n = 0) nor where n < 0."""
    x, f = _wrap(b, x)
    ni, r, rl = _exp_reduce(f, _clamp(x, f.expm1_lo, f.exp_hi))   # beyond, -1 or inf anyway
    v, _ = _add_dw(_two_sum(x.like(1.0), -_pow2_neg(ni, x)), _expm1_kernel(f, r, rl))
    return _canonical(_keep_tiny(x, _scale(v, ni))).v


def _sinh_cosh(f: Format, x: _V, sign: float) -> _V:
    """(e^a + sign*e^-a)/2 for a = |x| (sinh for sign = -1, cosh for +1). With a = n*ln2 + r,
    E = e^r - 1 and F = E/(1 + E) = 1 - e^-r, that is 2^(n-1) ((1 + sign*t) + E - sign*t*F) for
    t = 2^-2n: a sum without cancellation for n >= 1, and E + F for sinh when n = 0."""
    a = _abs(x)
    a = _select(a > f.exp_hi + 1.0, f.exp_hi + 1.0, a)     # beyond, e^a/2 overflows anyway
    ni, r, rl = _exp_reduce(f, a)
    eh, el = _expm1_kernel(f, r, rl)
    dh, dl = _fast_two_sum(x.like(1.0), eh)                 # 1 + E
    dl = dl + el
    fh = eh / dh
    fl = (fma(-fh, dh, eh) + (el - fh * dl)) / dh          # F = fh + fl to about 2p bits
    h = _pow2_neg(ni, x)
    t = h * h if sign > 0 else -(h * h)                     # 0 once 2^-2n underflows
    v, _ = _add_dw(_add_dw(_fast_two_sum(x.like(1.0), t), (eh, el)), (-t * fh, -t * fl))
    return _scale(v, ni - 1)                                # the /2 is in the scaling


def sinh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """sinh x = sign(x) (e^|x| - e^-|x|)/2, from expm1's kernel; odd, and x itself for tiny x."""
    x, f = _wrap(b, x)
    return _canonical(_xor_sign(_sinh_cosh(f, x, -1.0), _bits(x))).v


def cosh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """cosh x = (e^|x| + e^-|x|)/2, from expm1's kernel."""
    x, f = _wrap(b, x)
    return _canonical(_sinh_cosh(f, x, 1.0)).v


def _horner_dw(u: _V, coeffs, lows) -> tuple:
    """c0 + u*(c1 + …) as a double-word: Horner's rule in working precision down to c_k
    (k = len(lows)), then k steps in double-word, c_i being coeffs[i] + lows[i] there."""
    k = len(lows)
    h, l = _horner(u, coeffs[k:]), u.like(0.0)
    for c, cl in zip(reversed(coeffs[:k]), reversed(lows)):
        p, pe = _two_prod(h, u)
        h, se = _two_sum(u.like(c), p)
        l = fma(l, u, pe + (se + cl))
    return h, l


def _erfc_core(f: Format, a: _V) -> tuple:
    """(n, vh, vl): erfc a = 2^n (vh + vl) for 0 <= a <= erfc_max, as e^(-a^2) erfcx(a) with
    erfcx(a) = (1 - s) P(s), s = (a - 2)/(a + 2) in [-1, 1), and both factors in double-word."""
    dh, dl = _two_sum(a, a.like(2.0))                       # a + 2
    nh, nl = _two_sum(a, a.like(-2.0))                      # a - 2
    s = nh / dh
    mh, ml = _fast_two_sum(a.like(1.0), -s)                 # 1 - s
    ph, pl = _horner_dw(s, f.erfc_p, f.erfc_p_lo)
    gh, gl = _two_prod(mh, ph)
    gl = gl + fma(mh, pl, ml * ph)                          # (1 - s) P(s)
    # That is erfcx at x(s) = 2(1 + s)/(1 - s), s being rounded, not at a: step from there to a
    # along erfcx' = 2x erfcx - 2/sqrt(pi). a - x(s) = ((a - 2) - s(a + 2))/(1 - s).
    dx = (fma(-s, dh, nh) + (nl - s * dl)) / mh
    gl = gl + dx * fma(2.0 * a, gh, -f.two_over_sqrt_pi[0])
    zh, zl = _two_prod(a, a)                                # e^-(zh + zl) = e^-(a^2)
    ni, r, rl = _exp_reduce(f, -zh)
    r, rl = _two_sum(r, rl - zl)
    kh, kl = _expm1_kernel(f, r, rl)
    eh, el = _fast_two_sum(a.like(1.0), kh)                 # e^r = 1 + (e^r - 1)
    vh, vl = _two_prod(eh, gh)
    return ni, vh, vl + fma(eh, gl, (el + kl) * gh)


def _minus_erfc(c: float, n: _V, vh: _V, vl: _V) -> _V:
    """c - 2^n (vh + vl), rounded once, for c >= 2^n vh (1 - erfc, 2 - erfc)."""
    s, e = _fast_two_sum(vh.like(c), -_scale(vh, n))
    return s + (e - _scale(vl, n))


def erf(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """erf x = sign(x) erf |x|: 2a/sqrt(pi) + a^3 Q(a^2) for a = |x| < erf_split, 1 - erfc a
    above."""
    x, f = _wrap(b, x)
    a = _abs(x)
    c, c_lo = f.two_over_sqrt_pi
    z = a * a
    # 2^2p * a keeps a * (c_lo + z Q(z)) off the subnormals' coarse grid: the only rounding of
    # any size is the fma's.
    up = float(2.0 ** (2 * f.mant + 2))
    small = fma(a * up, c, (a * up) * fma(z, _horner(z, f.erf_q), c_lo)) * (1.0 / up)
    large = _minus_erfc(1.0, *_erfc_core(f, _select(a > f.erfc_max, f.erfc_max, a)))
    y = _select(a < f.erf_split, small, large)
    return _canonical(_xor_sign(y, _bits(x))).v


def erfc(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """erfc x = e^(-x^2) erfcx(x) for x >= 0, 2 - erfc(-x) for x < 0."""
    x, f = _wrap(b, x)
    a = _abs(x)
    n, vh, vl = _erfc_core(f, _select(a > f.erfc_max, f.erfc_max, a))
    y = _select(x < 0.0, _minus_erfc(2.0, n, vh, vl), _scale(vh + vl, n))
    return _canonical(y).v


# ---------------------------------------------------------------------------------------------
# fmod: the remainder of a / b truncated, exact. Each step subtracts q * 2^e * |b| for an
# integer q < 2^(p-2) by one fma: the exact difference is a multiple of 2^e |b|'s ulp below
# 2^e |b| in magnitude, so it is representable and the fma returns it unrounded.

def _ilogb(f: Format, v: _V) -> _V:
    """floor(log2 v) as an integer, for v > 0 finite (a subnormal scaled into range first)."""
    sub = v < 2.0 ** (1 - f.bias)
    w = _select(sub, v * 2.0 ** (f.mant + 1), v)
    e = (_bits(w) >> f.mant) - f.bias
    return _select(sub, e - (f.mant + 1), e)


def _fmod_step(f: Format, r: _V, d: _V, d_exponent: _V) -> _V:
    """r - q Y, exactly, for r >= d > 0: Y = d 2^e with e = max(0, ilogb r - ilogb d - (p - 3)),
    so that r / Y < 2^(p-2), q that quotient rounded (one more than its floor at most), and Y
    added back where q was one more: a value in [0, Y)."""
    e = _ilogb(f, r) - d_exponent - (f.mant - 2)
    e = _select(e < 0, 0, e)
    quarter = e >> 2                # 2^e in four factors, each a normal float, each product exact
    big = d * _pow2(quarter, d) * _pow2(quarter, d) * _pow2(quarter, d) * _pow2(e - 3 * quarter, d)
    q, _ = _rint(r / big)
    rest = fma(-q, big, r)
    return _select(rest < 0.0, rest + big, rest)


def fmod(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """C's fmod: x - n y for the integer n = trunc(x / y), exact, with x's sign; NaN where x is
    infinite or NaN, or y is 0 or NaN (the C library's, not the canonical NaN); x where
    |x| < |y|. A loop of _fmod_step until no lane's remainder is at least |y| (a step takes
    p - 3 bits off the exponents' gap: at most 14 for float, 43 for double); the builder ends
    in a new block."""
    x, f = _wrap(b, x)
    a, d = _abs(x), _abs(_V(b, y))
    valid = (a < float("inf")) & (d > 0.0)           # (ordered: false for a NaN)
    d_exponent = _ilogb(f, _select(valid, d, 1.0))
    before = b.block
    head, body, done = (b.append_basic_block(f"fmod.{s}") for s in ("head", "body", "done"))
    b.branch(head)
    b.position_at_end(head)
    r = _V(b, b.phi(a.type))
    r.v.add_incoming(a.v, before)
    active = valid & (r >= d)
    b.cbranch(_any(active), body, done)
    b.position_at_end(body)
    r.v.add_incoming(_select(active, _fmod_step(f, r, d, d_exponent), r).v, b.block)
    b.branch(head)
    b.position_at_end(done)
    return _select(valid, _xor_sign(r, _bits(x)), _fmod_nan(f, x, _V(b, y))).v


def _fmod_nan(f: Format, x: _V, y: _V) -> _V:
    """The C library's NaN of an invalid fmod, (x·y) / (x·y) on x86-64: x's quieted, else y's,
    else the default NaN (its sign set): NumPy's bits, on every target."""
    quiet = 1 << (f.mant - 1)
    default = _from_bits(_iconst(x, f.qnan | _sign_mask(x)), x)
    return _select(_isnan(x), _from_bits(_bits(x) | quiet, x),
                   _select(_isnan(y), _from_bits(_bits(y) | quiet, y), default))


UNARY = {"exp": exp, "exp2": exp2, "log": log, "log2": log2, "tanh": tanh, "sigmoid": sigmoid,
         "sin": sin, "cos": cos, "rsqrt": rsqrt,
         "tan": tan, "atan": atan, "asin": asin, "acos": acos,
         "log1p": log1p, "expm1": expm1, "sinh": sinh, "cosh": cosh, "erf": erf, "erfc": erfc}
BINARY = {"pow": pow, "atan2": atan2, "fmod": fmod}
