"""Accuracy of the exact-mode math library (backend/mathlib.py), in ulps, against NumPy.

    python benchmarks/mathlib_ulps.py                  # 10^8 float32 inputs per function
    python benchmarks/mathlib_ulps.py -n 1e7 --f64     # also double, against long double
    python benchmarks/mathlib_ulps.py --fit            # re-derive the polynomial coefficients
    python benchmarks/mathlib_ulps.py --fit erfc_p     # only those named
    python benchmarks/mathlib_ulps.py -n 1e7 --f64 --device iree   # IREE's, as dslc exports them

Each function is compiled for the host with MCJIT at O3 (no fast-math) as a loop over an array,
run on inputs spread over its whole range (log-uniform magnitudes, both signs, the regions where
it is hardest), and compared with a float64 reference (a long double one for double; for erf
and erfc SciPy's, and for double erf_long_double below). The table
gives the largest error seen (overall, where the exact result is a normal number, and where
the arguments are normal numbers or zeros too: "in, out"), the time per value of the compiled
scalar loop, and the time the whole measurement took; docs/numerics.md quotes it.

--device iree measures IREE's math library instead: each function as device="iree" compiles it
(docs/numerics.md, "IREE's math library"; "in, out" is its column, since IREE flushes
subnormals to zero); the ns/value are then those of IREE's calls, on its threads.

The tests (tests/backend/test_mathlib.py, tests/test_iree_ulps.py) use this module's compilers
and measure too.
"""
from __future__ import annotations

import argparse
import ctypes
import sys
import time
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import numpy as np
import llvmlite.binding as llvm
from llvmlite import ir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from backend import mathlib  # noqa: E402

FUNCTIONS = ["exp", "exp2", "log", "log2", "tanh", "sigmoid", "sin", "cos", "rsqrt", "pow",
             "tan", "atan", "asin", "acos", "atan2",
             "log1p", "expm1", "sinh", "cosh", "erf", "erfc", "fmod"]
TYPES = {np.float32: ir.FloatType(), np.float64: ir.DoubleType()}
WIDTH = {np.float32: 8, np.float64: 4}          # the vector variants: one AVX-512 register / 2
I64 = ir.IntType(64)


def _emit(name, b, args):
    fn = mathlib.BINARY.get(name) or mathlib.UNARY[name]
    return fn(b, *args)


def kernel_name(name, dtype, width):
    return f"{name}_{np.dtype(dtype).name}_x{width}"


# ---------------------------------------------------------------------------------------------
# Host kernels: void k(T *x, [T *y,] T *out, i64 n) applies the function to n elements, `width`
# at a time (n must be a multiple of width).

def kernel_functions(mod: ir.Module, names) -> Iterator[tuple[str, type, int, ir.Function]]:
    """void k(T *x, [T *y,] T *out, i64 n) declared in mod for every function of names, dtype
    and width: (name, dtype, width, the function)."""
    ptr = ir.PointerType()
    for name in names:
        nin = 2 if name in mathlib.BINARY else 1
        for dtype in TYPES:
            for width in (1, WIDTH[dtype]):
                yield name, dtype, width, ir.Function(
                    mod, ir.FunctionType(ir.VoidType(), [ptr] * (nin + 1) + [I64]),
                    kernel_name(name, dtype, width))


def apply_at(b: ir.IRBuilder, name: str, dtype, width: int, fn: ir.Function, i: ir.Value) -> None:
    """out[i : i + width] = name(x[i : i + width], …), in the kernel fn."""
    t = TYPES[dtype]
    vt = t if width == 1 else ir.VectorType(t, width)
    addr = [b.gep(p, [i], source_etype=t) for p in fn.args[:-1]]
    vals = [b.load(a, typ=vt, align=np.dtype(dtype).itemsize) for a in addr[:-1]]
    b.store(_emit(name, b, vals), addr[-1], align=np.dtype(dtype).itemsize)


def host_module() -> ir.Module:
    mod = ir.Module(name="mathlib_host")
    for name, dtype, width, fn in kernel_functions(mod, FUNCTIONS):
        entry, loop, done = (fn.append_basic_block(s) for s in ("entry", "loop", "done"))
        b = ir.IRBuilder(entry)
        n = fn.args[-1]
        b.cbranch(b.icmp_signed(">", n, I64(0)), loop, done)
        b.position_at_end(loop)
        i = b.phi(I64)
        i.add_incoming(I64(0), entry)
        apply_at(b, name, dtype, width, fn, i)
        nxt = b.add(i, I64(width))
        i.add_incoming(nxt, b.block)        # sin and cos end in a block of their own
        b.cbranch(b.icmp_signed("<", nxt, n), loop, done)
        b.position_at_end(done)
        b.ret_void()
    return mod


def optimize(mod: llvm.ModuleRef, tm, level: int = 3) -> None:
    pto = llvm.create_pipeline_tuning_options(speed_level=level)
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)


class HostKernels:
    """The kernels of host_module(), compiled with MCJIT for this CPU."""

    def __init__(self, opt_level: int = 3):
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        target = llvm.Target.from_default_triple()
        self.tm = target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                               features=llvm.get_host_cpu_features().flatten(),
                                               opt=opt_level)
        mod = llvm.parse_assembly(str(host_module()))
        mod.verify()
        if opt_level:
            optimize(mod, self.tm, opt_level)
        self.engine = llvm.create_mcjit_compiler(mod, self.tm)
        self.engine.finalize_object()
        self.optimized_ir = str(mod)

    def __call__(self, name, *args, width=1):
        """name(*args) elementwise on 1-d arrays of one float dtype; returns a new array."""
        dtype = args[0].dtype.type
        n = len(args[0])
        pad = -n % width
        ins = [np.ascontiguousarray(np.concatenate([a, np.ones(pad, dtype)]), dtype) for a in args]
        out = np.empty(n + pad, dtype)
        addr = self.engine.get_function_address(kernel_name(name, dtype, width))
        cfn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * (len(ins) + 1), ctypes.c_int64)(addr)
        cfn(*[a.ctypes.data for a in ins], out.ctypes.data, n + pad)
        return out[:n]


@lru_cache(maxsize=None)
def host_kernels(opt_level: int = 3) -> HostKernels:
    return HostKernels(opt_level)


# IREE's math library (--device iree): each function as device="iree" runs it, the tensor IR of
# one elementwise op exported to MLIR (ir/mlir.py: the math dialect's operation; sigmoid as
# 1 / (1 + exp(-x)), rsqrt as 1 / sqrt(x)) and compiled by IREE for this CPU.

# (fmod is no primitive of the language: its `%` is, exported to MLIR as docs/mlir.md says)
IREE_FUNCTIONS = [n for n in FUNCTIONS if n != "fmod"] + ["sqrt"]
DTYPE_NAMES = {np.float32: "f32", np.float64: "f64"}


class IreeKernels:
    """Functions of IREE_FUNCTIONS compiled by IREE for arrays of `size` elements, called like
    HostKernels (longer arrays in pieces): those of `together`, pairs (name, dtype), in one
    module at once, any other alone when first called."""

    def __init__(self, size: int = 1 << 20, together=()):
        self.size = size
        self.entries: dict = {}          # (name, dtype): IREE's function, or why it has none
        if together:
            self._compile(list(together))

    def _compile(self, pairs) -> None:
        import iree.runtime
        from ir.core import Builder, tensor_type
        from ir.mlir import function, module
        from runtime.iree import Refused, compile_mlir
        texts = []
        for name, dtype in pairs:
            b = Builder(f"{name}_{DTYPE_NAMES[dtype]}")
            xs = [b.param(tensor_type(DTYPE_NAMES[dtype], (self.size,)))
                  for _ in range(2 if name in mathlib.BINARY else 1)]
            texts.append(function(b.finish([b.emit(name, *xs)])))
        try:
            vmfb = compile_mlir(module(texts))
        except Refused as e:
            self.entries.update(dict.fromkeys(pairs, e.why))
            return
        context = iree.runtime.SystemContext(config=iree.runtime.Config("local-task"))
        context.add_vm_module(iree.runtime.VmModule.copy_buffer(context.instance, vmfb))
        for name, dtype in pairs:
            self.entries[name, dtype] = context.modules.module[f"{name}_{DTYPE_NAMES[dtype]}"]

    def refusal(self, name: str, dtype) -> str | None:
        """Why IREE cannot compile the function (IREE's first error), or None."""
        if (name, dtype) not in self.entries:
            self._compile([(name, dtype)])
        found = self.entries[name, dtype]
        return found if isinstance(found, str) else None

    def __call__(self, name, *args, width=1):
        """name(*args) elementwise on 1-d arrays of one float dtype (width is the host's)."""
        dtype = args[0].dtype.type
        if why := self.refusal(name, dtype):
            raise ValueError(f"IREE cannot compile {name} for {np.dtype(dtype).name}: {why}")
        n = len(args[0])
        pad = -n % self.size
        ins = [np.concatenate([a, np.ones(pad, dtype)]) for a in args]
        fn = self.entries[name, dtype]
        return np.concatenate([np.asarray(fn(*(a[i:i + self.size] for a in ins)))
                               for i in range(0, n + pad, self.size)])[:n]


# GPU kernels: the same functions for NVPTX; thread i applies the function to elements
# [i*width, (i+1)*width) when they are below n.

def nvptx_target_machine():
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    target = llvm.Target.from_triple("nvptx64-nvidia-cuda")
    return target.create_target_machine(cpu="sm_90", features="+ptx80", opt=3)


def nvptx_module(names=FUNCTIONS) -> ir.Module:
    mod = ir.Module(name="mathlib_nvptx")
    mod.triple = "nvptx64-nvidia-cuda"
    i32 = ir.IntType(32)
    sreg = {r: ir.Function(mod, ir.FunctionType(i32, []), f"llvm.nvvm.read.ptx.sreg.{r}")
            for r in ("tid.x", "ntid.x", "ctaid.x")}
    for name, dtype, width, fn in kernel_functions(mod, names):
        body, done = fn.append_basic_block("body"), fn.append_basic_block("done")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        fn.blocks.insert(0, fn.blocks.pop())          # entry first
        tid = b.add(b.mul(b.call(sreg["ctaid.x"], []), b.call(sreg["ntid.x"], [])),
                    b.call(sreg["tid.x"], []))
        i = b.mul(b.zext(tid, I64), I64(width))
        b.cbranch(b.icmp_signed("<", i, fn.args[-1]), body, done)
        b.position_at_end(body)
        apply_at(b, name, dtype, width, fn, i)
        b.branch(done)
        b.position_at_end(done)
        b.ret_void()
        mod.add_named_metadata("nvvm.annotations", [fn, "kernel", i32(1)])
    return mod


def emit_ptx(names=FUNCTIONS) -> str:
    """PTX for sm_90 of the kernels of nvptx_module(names), optimised at O3."""
    tm = nvptx_target_machine()
    mod = llvm.parse_assembly(str(nvptx_module(names)))
    mod.triple = "nvptx64-nvidia-cuda"
    mod.data_layout = str(tm.target_data)
    mod.verify()
    optimize(mod, tm)
    return tm.emit_assembly(mod)


# ---------------------------------------------------------------------------------------------
# References and ulps.

def reference(name, *args):
    """The function in float64 (for float32 arguments) or long double (for float64)."""
    wide = np.float64 if args[0].dtype == np.float32 else np.longdouble
    a = [x.astype(wide) for x in args]
    with np.errstate(all="ignore"):
        if name == "sigmoid":
            x = a[0]
            e = np.exp(-np.abs(x))
            return np.where(x >= 0, 1 / (1 + e), e / (1 + e))
        if name == "rsqrt":
            return 1 / np.sqrt(a[0])
        if name == "sqrt":
            return np.sqrt(a[0])
        if name in ("erf", "erfc"):
            if wide == np.float64:
                import scipy.special
                return getattr(scipy.special, name)(a[0])
            return erf_long_double(name, a[0])
        if name in ("log1p", "expm1", "sinh", "cosh"):
            return getattr(np, name)(a[0])
        return {"exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "tanh": np.tanh,
                "sin": np.sin, "cos": np.cos, "pow": np.power,
                "tan": np.tan, "atan": np.arctan, "asin": np.arcsin, "acos": np.arccos,
                "atan2": np.arctan2, "fmod": np.fmod}[name](*a)


# NumPy has no long double erf: erfc(x) = erfcx(x) e^(-x^2), erfcx = e^(x^2) erfc x from its
# Taylor expansion at the nearest multiple of 1/16 (coefficients by mpmath at 60 digits), e^(-x^2)
# from x^2 split exactly into three long doubles; erf = 1 - erfc, or for |x| < 1/2 its series.
# About 2^-61 relative (checked against mpmath by tests/backend/test_mathlib.py).

ERFCX_STEP, ERFCX_TERMS, ERFCX_TOP = 16, 18, 28.0


@lru_cache(maxsize=None)
def erfcx_taylor():
    """a[k, j]: the j-th Taylor coefficient of erfcx at k/ERFCX_STEP, as long doubles. From
    erfcx' = 2x erfcx - 2/sqrt(pi): (j+1) a_(j+1) = 2c a_j + 2 a_(j-1) (minus 2/sqrt(pi) for j = 0),
    which cancels a digit or two a step: hence the 60 digits."""
    import mpmath as mp
    rows = []
    with mp.workdps(60):
        for k in range(int(ERFCX_TOP * ERFCX_STEP) + 1):
            c = mp.mpf(k) / ERFCX_STEP
            a = [mp.erfc(c) * mp.exp(c * c)]
            a.append(2 * c * a[0] - 2 / mp.sqrt(mp.pi))
            for j in range(1, ERFCX_TERMS - 1):
                a.append((2 * c * a[j] + 2 * a[j - 1]) / (j + 1))
            rows.append([np.longdouble(mp.nstr(v, 30, strip_zeros=False)) for v in a])
    return np.array(rows, np.longdouble)


def erf_long_double(name, x):
    """erf or erfc of long double x (float64 values, |x| <= ERFCX_TOP or where the result is 0,
    1 or 2 anyway), to about 2^-61 relative."""
    a = np.minimum(np.abs(x), ERFCX_TOP)
    k = np.rint(np.where(np.isnan(a), 0, a) * ERFCX_STEP)
    h = a - k / ERFCX_STEP                                 # exact
    coef = erfcx_taylor()[k.astype(np.int64)]
    erfcx = coef[:, -1]
    for j in range(ERFCX_TERMS - 2, -1, -1):
        erfcx = erfcx * h + coef[:, j]
    m, e = np.frexp(a.astype(np.float64))                  # a = ah + al, ah of 26 bits:
    ah = np.ldexp(np.trunc(np.ldexp(m, 26)), e - 26).astype(np.longdouble)
    al = a - ah                                            # a^2 = ah^2 + 2 ah al + al^2 exactly
    erfc = erfcx * np.exp(-ah * ah) * np.exp(-2 * ah * al) * np.exp(-al * al)
    if name == "erfc":
        return np.where(x < 0, 2 - erfc, erfc)
    z = a * a                                              # the series, for |x| < 1/2
    term, series = a, a
    for j in range(1, 30):
        term = -term * z / j
        series = series + term / (2 * j + 1)
    two_over_sqrt_pi = np.longdouble("1.12837916709551257389615890312154517")
    return np.copysign(np.where(a < 0.5, two_over_sqrt_pi * series, 1 - erfc), x)


def ulp_error(got, ref):
    """|got - ref| in units of the last place of `ref` rounded to got's format (subnormal ulps
    below the normal range). Equal infinities and NaN against NaN count 0; a NaN or infinity
    against anything else counts inf."""
    fi = np.finfo(got.dtype)
    wide = ref.dtype
    with np.errstate(all="ignore"):
        rounded = ref.astype(got.dtype)
        _, e = np.frexp(ref)
        ulp = np.ldexp(np.ones_like(ref), np.maximum(e - 1, fi.minexp) - fi.nmant)
        err = np.abs(got.astype(wide) - ref) / ulp
    same = ((got == rounded) & ~np.isfinite(got)) | (np.isnan(got) & np.isnan(ref))
    special = ~np.isfinite(got) | ~np.isfinite(rounded)
    return np.where(same, 0.0, np.where(special, np.inf, err))


# ---------------------------------------------------------------------------------------------
# Inputs: each function's interesting range, log-uniform magnitudes and both signs.

def log_uniform(rng, n, lo, hi, dtype, signs=True):
    """n values with |x| log-uniform in [lo, hi]; random signs if `signs`."""
    x = np.exp2(rng.uniform(np.log2(lo), np.log2(hi), n))
    if signs:
        x = np.where(rng.random(n) < 0.5, -x, x)
    return x.astype(dtype)


def inputs(name, n, rng, dtype):
    """n arguments (a tuple: two arrays for pow) spread over the function's range."""
    f32 = dtype == np.float32
    tiny = np.finfo(dtype).smallest_subnormal
    big = float(np.finfo(dtype).max)
    q = n // 4
    if name in ("exp", "exp2", "sigmoid", "tanh"):
        top = {"exp": 89.0 if f32 else 710.0, "exp2": 128.5 if f32 else 1024.5,
               "sigmoid": 105.0 if f32 else 746.0, "tanh": 10.0 if f32 else 20.0}[name]
        x = np.concatenate([rng.uniform(-top, top, 2 * q).astype(dtype),
                            log_uniform(rng, q, 1e-8, top, dtype),
                            log_uniform(rng, n - 3 * q, tiny, 1e-8, dtype)])
        if name in ("exp", "exp2"):   # the bottom of the range: subnormal results
            lo = {"exp": 104.0 if f32 else 746.0, "exp2": 150.0 if f32 else 1075.0}[name]
            x[:q // 4] = rng.uniform(-lo, -lo * 0.8, q // 4).astype(dtype)
        return (x,)
    if name in ("log", "log2", "rsqrt", "sqrt"):
        x = np.concatenate([log_uniform(rng, 3 * q, tiny, big, dtype, signs=False),
                            rng.uniform(0.5, 2.0, n - 3 * q).astype(dtype)])
        return (x,)
    if name in ("sin", "cos", "tan"):
        # near multiples of pi/2 (as far as float64 can place them: the Cody-Waite range), and
        # every exponent up to the largest float (the Payne-Hanek range above 2^22 / 2^50)
        top = float(mathlib._format(TYPES[dtype]).cody_waite_max)
        k = np.round(rng.uniform(-top, top, q) / (np.pi / 2))
        near = (k * (np.pi / 2)).astype(dtype)
        near = np.nextafter(near, near + rng.choice([-1, 1], q).astype(dtype))
        return (np.concatenate([rng.uniform(-4, 4, q).astype(dtype), near,
                                log_uniform(rng, n - 2 * q, tiny, big, dtype)]),)
    if name in ("erf", "erfc"):
        # the small |x| and the switch to 1 - erfc (0.875), 2-4, and erfc's tail to underflow
        top = 10.1 if f32 else 27.3
        return (np.concatenate([rng.uniform(-top, top, q).astype(dtype),
                                log_uniform(rng, q, tiny, top, dtype),
                                log_uniform(rng, q, 0.5, 4.0, dtype),
                                rng.uniform(0.8 * top, top, n - 3 * q).astype(dtype)]),)
    if name == "log1p":
        # all of x > -1, near 0, and near -1 (1 + x exact, the result large and negative)
        return (np.concatenate([log_uniform(rng, q, tiny, big, dtype, signs=False),
                                -log_uniform(rng, q, tiny, 1.0, dtype, signs=False),
                                log_uniform(rng, q, tiny, 0.5, dtype),
                                (log_uniform(rng, n - 3 * q, 1e-7 if f32 else 1e-16, 0.5,
                                             np.float64, signs=False) - 1).astype(dtype)]),)
    if name in ("expm1", "sinh", "cosh"):
        # near 0, the negative side (expm1 -> -1), and up to overflow (for sinh and cosh, the
        # part where e^|x| overflows but e^|x|/2 does not)
        top = {"expm1": 89.0 if f32 else 710.0}.get(name, 89.5 if f32 else 710.6)
        lo = top if name != "expm1" else 40.0
        return (np.concatenate([rng.uniform(-lo, top, q).astype(dtype),
                                log_uniform(rng, q, tiny, top, dtype),
                                rng.uniform(-2.0, 2.0, q).astype(dtype),
                                rng.uniform(top - 1.5, top, n - 3 * q).astype(dtype)]),)
    if name == "pow":
        span = 1e30 if f32 else 1e300
        x = log_uniform(rng, n, 1 / span, span, dtype, signs=False)
        # y so that |y * log2 x| spans the whole exponent range
        lim = 150.0 if f32 else 1075.0
        y = rng.uniform(-lim, lim, n) / np.maximum(np.abs(np.log2(x.astype(np.float64))), 1e-3)
        y = np.where(rng.random(n) < 0.25, rng.uniform(-10, 10, n), y).astype(dtype)
        return (x, y)
    if name == "atan":
        # both sides of the reduction's breaks (1/2, 1, 2), and every magnitude up to the largest
        x = np.concatenate([rng.uniform(-4, 4, q), rng.uniform(0.4, 0.6, q // 2),
                            rng.uniform(1.8, 2.2, n - 3 * q - q // 2)]).astype(dtype)
        x = np.where(rng.random(len(x)) < 0.5, -x, x)
        return (np.concatenate([x, log_uniform(rng, 2 * q, tiny, big, dtype)]),)
    if name in ("asin", "acos"):
        # near +-1 (asin's vertical tangent), around the break at +-1/2, and down to 0
        eps = float(np.finfo(dtype).eps) / 4
        a = np.concatenate([rng.uniform(0, 1, q), rng.uniform(0.45, 0.55, q),
                            1 - log_uniform(rng, q, eps, 0.5, np.float64, signs=False),
                            log_uniform(rng, n - 3 * q, tiny, 1.0, np.float64, signs=False)])
        return (np.where(rng.random(n) < 0.5, -a, a).astype(dtype),)
    if name == "atan2":
        # every quadrant, ratios |y/x| from underflow to overflow (independent magnitudes over
        # the whole range), ratios near the breaks 1/2, 1, 2; some zeros and infinities
        y = log_uniform(rng, n, tiny, big, dtype)
        x = log_uniform(rng, n, tiny, big, dtype)
        with np.errstate(over="ignore"):
            y = np.where(rng.random(n) < 0.5, x * rng.uniform(0.3, 3.3, n).astype(dtype), y)
        y = np.where(rng.random(n) < 0.5, -y, y)
        for v in (x, y):
            odd = rng.random(n) < 0.01
            v[odd] = rng.choice(np.array([0.0, -0.0, np.inf, -np.inf], dtype), odd.sum())
        return (y, x)
    if name == "fmod":
        # magnitudes independent over the whole range (exponents' gaps of up to 277 and 2098
        # bits: the most steps), quotients near 1 to 2^12 (one or two), some zeros and infinities
        x, y = log_uniform(rng, n, tiny, big, dtype), log_uniform(rng, n, tiny, big, dtype)
        near = rng.random(n) < 0.5
        with np.errstate(over="ignore"):
            y = np.where(near, x / np.exp2(rng.uniform(-1, 12, n)).astype(dtype), y)
        for v in (x, y):
            odd = rng.random(n) < 0.01
            v[odd] = rng.choice(np.array([0.0, -0.0, np.inf, -np.inf], dtype), odd.sum())
        return (x, y)
    raise KeyError(name)


def normal_in_out(args, ref) -> np.ndarray:
    """Where the arguments are normal numbers or zeros and the exact result is normal: IREE
    flushes subnormal arguments and results to zero."""
    smallest_normal = np.finfo(args[0].dtype).smallest_normal
    return (np.abs(ref) >= smallest_normal) & np.all(
        [(a == 0) | (np.abs(a) >= smallest_normal) for a in args], axis=0)


def measure(name, dtype, n, seed=0, chunk=1 << 22, width=1, kernels=None):
    """Over n inputs: (max ulp error, the same over normal results only, argument(s) of the
    max, seconds spent in the compiled kernel, seconds in all, the max over normal arguments
    and results); kernels: host_kernels()'s unless given (an IreeKernels)."""
    k = kernels or host_kernels()
    rng = np.random.default_rng(seed)
    worst, worst_normal, worst_in_out, where, kernel = 0.0, 0.0, 0.0, None, 0.0
    t0 = time.perf_counter()
    smallest_normal = np.finfo(dtype).smallest_normal
    for start in range(0, n, chunk):
        args = inputs(name, min(chunk, n - start), rng, dtype)
        t1 = time.perf_counter()
        got = k(name, *args, width=width)
        kernel += time.perf_counter() - t1
        ref = reference(name, *args)
        err = ulp_error(got, ref)
        i = int(np.argmax(err))
        if err[i] > worst:
            worst, where = float(err[i]), tuple(a[i] for a in args)
        normal = np.abs(ref) >= smallest_normal
        worst_normal = max(worst_normal, float(err[normal].max(initial=0.0)))
        worst_in_out = max(worst_in_out, float(err[normal_in_out(args, ref)].max(initial=0.0)))
    return worst, worst_normal, where, kernel, time.perf_counter() - t0, worst_in_out


# ---------------------------------------------------------------------------------------------
# The coefficient fits (mpmath): minimax relative error by Remez exchange on a dense grid.

def fit_all(keys=None):
    """Fit and print the polynomials of backend/mathlib.py (those named in keys, or all)."""
    import mpmath as mp
    mp.mp.dps = 80

    def remez(F, fixed, m, powers, a, b, npts=3000, iters=30):
        n = len(powers)
        a, b = mp.mpf(a), mp.mpf(b)
        grid = [(a + b) / 2 - (b - a) / 2 * mp.cos(mp.pi * (i + mp.mpf(1) / 2) / npts)
                for i in range(npts)]
        grid = [t for t in grid if abs(t) > mp.mpf(10) ** -12]
        g = [(F(t) - fixed(t)) / m(t) for t in grid]              # what P must match
        w = [m(t) / F(t) for t in grid]                           # relative error weight
        basis = [[t ** p for p in powers] for t in grid]
        idx = [int(round(i * (len(grid) - 1) / n)) for i in range(n + 1)]
        for _ in range(iters):
            A, rhs = mp.matrix(n + 1, n + 1), mp.matrix(n + 1, 1)
            for j, k in enumerate(idx):
                for i in range(n):
                    A[j, i] = basis[k][i]
                A[j, n] = (-1) ** j / w[k]
                rhs[j] = g[k]
            sol = mp.lu_solve(A, rhs)
            c, E = [sol[i] for i in range(n)], sol[n]
            err = [w[k] * (g[k] - mp.fsum(ci * bi for ci, bi in zip(c, basis[k])))
                   for k in range(len(grid))]
            segs, cur = [], [0]                                   # runs of one sign
            for k in range(1, len(grid)):
                if mp.sign(err[k]) == mp.sign(err[cur[0]]):
                    cur.append(k)
                else:
                    segs.append(cur)
                    cur = [k]
            segs.append(cur)
            ext = [max(s, key=lambda k: abs(err[k])) for s in segs]
            while len(ext) > n + 1:
                ext = ext[1:] if abs(err[ext[0]]) < abs(err[ext[-1]]) else ext[:-1]
            emax = max(abs(e) for e in err)
            if len(ext) < n + 1 or emax <= abs(E) * (1 + mp.mpf(10) ** -6):
                break
            idx = ext
        return c, emax

    def fit(F, fixed, m, powers, a, b, rnd, dw=0, plain=False):
        """Round the coefficients one at a time, lowest first, refitting the rest each time (or,
        plain, round those of one fit); the first dw to double-words (hi + lo, each rounded)."""
        def rounded(i, c):
            return rnd(c) + (rnd(c - rnd(c)) if i < dw else 0)
        if plain:
            c, _ = remez(F, fixed, m, powers, a, b)
            cs = [rounded(i, v) for i, v in enumerate(c)]
            grid = [a + (b - a) * (1 - mp.cos(mp.pi * i / 3000)) / 2 for i in range(3001)]
            return cs, max(abs(1 - (fixed(t) + m(t) * mp.fsum(c * t ** p for c, p in
                                                               zip(cs, powers))) / F(t))
                           for t in grid)
        done = []
        for i in range(len(powers)):
            def fx(t, cs=list(done)):
                return fixed(t) + m(t) * mp.fsum(c * t ** p for c, p in cs)
            c, emax = remez(F, fx, m, powers[i:], a, b)
            done.append((rounded(i, c[0]), powers[i]))
        return [c for c, _ in done], emax

    ln2 = mp.log(2)
    fits = {  # name: (F, the exact leading terms, the factor of P, powers of P's argument, range)
        "exp_q": (mp.exp, lambda r: 1 + r, lambda r: r * r, 1, -ln2 / 2 * 1.002, ln2 / 2 * 1.002),
        "log_t": (lambda s: mp.log((1 + s) / (1 - s)), lambda s: 2 * s + 2 * s ** 3 / 3,
                  lambda s: s ** 5, 2, 1e-9, mp.mpf(1) / 5 * 1.002),
        "tanh_t": (mp.tanh, lambda x: x, lambda x: x ** 3, 2, 1e-9, 0.55),
        "sin_s": (mp.sin, lambda r: r, lambda r: r ** 3, 2, 1e-9, mp.pi / 4 * 1.002),
        "cos_c": (mp.cos, lambda r: 1 - r * r / 2, lambda r: r ** 4, 2, 1e-9, mp.pi / 4 * 1.002),
        "atan_t": (mp.atan, lambda z: z, lambda z: z ** 3, 2, 1e-9, mp.mpf(1) / 2 * 1.002),
        "asin_t": (mp.asin, lambda t: t, lambda t: t ** 3, 2, 1e-9, mp.mpf(1) / 2 * 1.002),
        "erf_q": (mp.erf, lambda x: 2 * x / mp.sqrt(mp.pi), lambda x: x ** 3, 2, 1e-9, 0.5),
        # erfc x = e^(-x^2) (1 - s) P(s), s = (x - 2)/(x + 2), for x in [0, erfc_max]
        "erfc_p": (lambda s: mp.erfc(2 * (1 + s) / (1 - s)) * mp.exp((2 * (1 + s) / (1 - s)) ** 2),
                   lambda s: 0, lambda s: 1 - s, 1, -1,
                   lambda fmt: (mp.mpf(fmt.erfc_max) - 2) / (mp.mpf(fmt.erfc_max) + 2)),
    }
    # erfc_p is a polynomial in s over all of [-1, 0.86]: there refitting after each rounding
    # settles on a worse polynomial than the one fit rounded (2^-27 against 2^-31 in float32).
    plain = {"erfc_p"}
    for fmt, rnd in ((mathlib.F32, lambda v: mp.mpf(float(np.float32(float(v))))),
                     (mathlib.F64, lambda v: mp.mpf(float(v)))):
        for key, (F, fixed, m, step, a, b) in fits.items():
            if keys and key not in keys:
                continue
            deg = len(getattr(fmt, key)) - 1
            dw = len(getattr(fmt, key + "_lo", ()))      # the first dw are double-words
            b = b(fmt) if callable(b) else b
            cs, emax = fit(F, fixed, m, [step * i for i in range(deg + 1)], a, b, rnd, dw,
                           key in plain)
            print(f"{fmt.name} {key}: relative error 2^{float(mp.log(emax, 2)):.1f}")
            print("   ", ", ".join(float(rnd(c)).hex() for c in cs))
            if dw:
                print("    lo:", ", ".join(float(c - rnd(c)).hex() for c in cs[:dw]))


# ---------------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("-n", type=float, default=1e8, help="inputs per function (default 1e8)")
    ap.add_argument("--f64", action="store_true",
                    help="also measure double, on n/10 inputs (long double reference)")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--device", choices=("host", "iree"), default="host",
                    help="iree: IREE's math library, each function as device='iree' compiles it")
    ap.add_argument("--fit", nargs="*", metavar="POLY",
                    help="re-derive the polynomial coefficients (all, or those named: sin_s …)")
    args = ap.parse_args()
    if args.fit is not None:
        fit_all(args.fit)
        return
    t0 = time.perf_counter()
    if args.device == "iree":
        kernels, names = IreeKernels(), args.only or IREE_FUNCTIONS
    else:
        kernels, names = host_kernels(), args.only or FUNCTIONS
        print(f"compiled {len(FUNCTIONS) * 4} kernels in {time.perf_counter() - t0:.1f} s "
              f"for {llvm.get_host_cpu_name()}")
    print(f"{'function':<9} {'type':<8} {'inputs':>12} {'max ulp':>8} {'normal':>8} "
          f"{'in, out':>8} {'ns/value':>8} {'seconds':>8}   worst at")
    dtypes = [np.float32] + ([np.float64] if args.f64 else [])
    for dtype in dtypes:
        n = int(args.n) if dtype == np.float32 else int(args.n) // 10
        for name in names:
            why = kernels.refusal(name, dtype) if args.device == "iree" else None
            if why:
                print(f"{name:<9} {np.dtype(dtype).name:<8} iree-compile refuses it: {why}")
                continue
            worst, normal, where, kernel, secs, in_out = measure(name, dtype, n, kernels=kernels)
            at = ", ".join(repr(float(v)) for v in where) if where else "-"
            print(f"{name:<9} {np.dtype(dtype).name:<8} {n:>12,} {worst:>8.3f} {normal:>8.3f} "
                  f"{in_out:>8.3f} {kernel / n * 1e9:>8.2f} {secs:>8.1f}   {at}", flush=True)

if __name__ == "__main__":
    main()
