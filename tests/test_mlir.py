"""The MLIR export (ir/mlir.py) checked by IREE against the interpreter: every entry point of
tests/programs, tests/corpus/valid and examples, forward and gradient, exported, compiled by
IREE (one module a file) and run on random inputs, on IREE and on the CPU backend, against the
interpreter (the default run: tests/programs and the examples; DSLC_SLOW=1: every file).

Bounds (docs/numerics.md): a result computed only by exact operations (arithmetic, comparisons,
casts, gathers, copies; no reduction, contraction or math-library function on its way) must
agree bit for bit. Others may differ by the order IREE reduces in and by its math library:
|got - want| ≤ ε·(168·m + 17·max|want|), ε the dtype's (2e-5·m + 2e-6·max|want| in f32), m a
bound on the sum of |terms| behind the result (`definition`) and max|want| the largest finite
|want|. A disagreement names the op that made the result.
Every entry must export (an op the exporter cannot write is an error at its line: the
tests below show one)."""
from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np
import pytest

import dsl
from conftest import SLOW, beyond_iree_bound, dslc, quick, raises, slow, user_error
from dsl.inputs import dimension_names
from dsl.safetensors import read_with_metadata
from frontend.diagnostics import DslError
from ir import interp
from ir.ad import grad_function
from ir.core import Builder, Function, Op, Value, tensor_type
from ir.mlir import NotExpressible, function, module
from ir.ops.base import EvalError, Role, np_dtype
from ir.ops.contract import Einsum
from ir.ops.elementwise import Div, MathFunction, Mul, Sub, Unary
from ir.ops.random import Normal
from ir.passes import optimize
from runtime import cpu

iree = pytest.importorskip("iree.compiler", reason="IREE is not installed (pip install 'dslc[iree]')")

ROOT = Path(__file__).resolve().parents[1]
FILES = {p.stem: p for p in sorted((ROOT / "tests" / "programs").glob("*.bend")) +
         sorted(p for p in (ROOT / "tests" / "corpus" / "valid").glob("*.bend") if re.match(r"\d\d_", p.name)) +
         sorted((ROOT / "examples").glob("*.bend"))}
SIZE = 3                   # every dimension; static ints and list lengths are 2
# IREE compiles and runs a file in 5-20 s here, and the CPU backend compiles it in as long: the
# default run checks the test programs and the examples (the CPU backend on the programs and two
# examples), DSLC_SLOW=1 the corpus too and every file on the CPU backend
PROGRAMS = {p.stem for p in (ROOT / "tests" / "programs").glob("*.bend")}
QUICK = PROGRAMS | {p.stem for p in (ROOT / "examples").glob("*.bend")}
ON_THE_CPU = PROGRAMS | {"xor", "names_mlp"}
BY_FILE = [pytest.param(stem, marks=[] if stem in QUICK else [slow]) for stem in FILES]


def specialised(prog: dsl.Program, name: str) -> Function | None:
    """The entry at small sizes, or None for one whose inputs no sizes make (a record of
    functions)."""
    d = prog._def(name)
    try:
        dims = dict.fromkeys(dimension_names(d, prog._resolved.main), SIZE)
    except DslError:
        return None
    for _ in range(8):
        try:
            return prog._specialised(d, dims)[0].function
        except DslError as e:
            wanted = re.search(r"must give (?:the static int|the length of the list) '([^']+)'", e.message)
            if not wanted:
                return None
            dims[wanted[1]] = 2
    return None


@functools.cache
def cases(stem: str) -> dict[str, Function]:
    """Every entry of one file and its gradient with respect to its float inputs, by a unique
    name (built when a test asks, not as the tests are collected)."""
    found = {}
    prog = dsl.load(str(FILES[stem]), device="reference")
    for name in prog.functions():
        fn = specialised(prog, name)
        if fn is None:
            continue
        found[f"{stem}.{name}"] = fn
        floats = [i for i, v in enumerate(fn.params) if v.dtype in ("f16", "f32", "f64")]
        if floats:
            found[f"{stem}.{name}.grad"] = optimize(grad_function(fn, floats, with_value=True))
    return found


def symbol(case: str) -> str:
    return "f_" + re.sub(r"\W", "_", case)


@functools.cache
def exported(stem: str) -> tuple[dict[str, str], dict[str, NotExpressible]]:
    texts, refused = {}, {}
    for case, fn in cases(stem).items():
        try:
            texts[case] = function(fn, symbol(case))
        except NotExpressible as e:
            refused[case] = e
    return texts, refused


@functools.cache
def context(stem: str):
    """The exported functions of one file's entries in one IREE module, compiled once."""
    import iree.runtime
    from runtime.iree import compile_mlir
    config = iree.runtime.Config("local-task")
    ctx = iree.runtime.SystemContext(config=config)
    vmfb = compile_mlir(module(list(exported(stem)[0].values())))
    ctx.add_vm_module(iree.runtime.VmModule.copy_buffer(ctx.instance, vmfb))
    return ctx


def inputs(fn: Function, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for v in fn.params:
        if v.dtype in ("f16", "f32", "f64"):
            out.append((rng.standard_normal(v.shape) * 0.5).astype(np_dtype(v.dtype)))
        elif v.dtype == "bool":
            out.append(rng.integers(0, 2, v.shape).astype(bool))
        else:                                   # indices stay in range of every axis (≥ 2)
            out.append(rng.integers(0, 2, v.shape).astype(np_dtype(v.dtype)))
    return out


def inexact(fn: Function) -> set[Value]:
    """The values whose bits depend on an order of summation or a math library (normal's
    log, cos and sin among them)."""
    found: set[Value] = set()
    for op in fn.ops:
        p = op.primitive
        order = p.role in (Role.REDUCTION, Role.CONTRACTION, Role.SCAN) or isinstance(p, Einsum)
        structured = op.body is not None and inexact(op.body) & set(op.body.results)
        if order or structured or isinstance(p, (MathFunction, Normal)) or found & set(op.inputs):
            found.update(op.outputs)
    return found


def definition(fn: Function, arrays: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The interpreter's results and, for each, a bound on the sum of |terms| it was computed
    from: the interpreter run on magnitudes (|x| for a float input, a - b as |a| + |b|; a
    product and a quotient carry their operands' relative bounds, to first order), never below
    the result's |value|. (A bound that magnitudes make NaN, inf - inf, is the |value|.)
    A sum that cancels to near 0 is only known to a few ulp of its terms, whatever the order."""
    values = dict(zip(fn.params, arrays))
    size = {v: np.abs(a) if a.dtype.kind == "f" else a for v, a in zip(fn.params, arrays)}
    for op in fn.ops:
        outs = interp.evaluate(op, [values[v] for v in op.inputs])
        sizes = [size[v] for v in op.inputs]
        try:
            with np.errstate(all="ignore"):             # (inf · 0 is a NaN bound, not an error)
                bounds = _magnitude(op, [values[v] for v in op.inputs], sizes)
        except EvalError:
            bounds = outs
        for v, out, bound in zip(op.outputs, outs, bounds, strict=True):
            values[v] = out
            size[v] = np.fmax(np.abs(out), np.abs(bound)) if out.dtype.kind == "f" else out
    return [values[v] for v in fn.results], [size[v] for v in fn.results]


def _magnitude(op: Op, args: list[np.ndarray], sizes: list[np.ndarray]) -> list[np.ndarray]:
    p = op.primitive
    if isinstance(p, Sub):
        return [sizes[0] + sizes[1]]
    if isinstance(p, Mul):
        return [sizes[0] * np.abs(args[1]) + np.abs(args[0]) * sizes[1]]
    if isinstance(p, Div) and args[0].dtype.kind == "f":
        return [sizes[0] / np.abs(args[1]) + np.abs(args[0]) * sizes[1] / np.square(args[1])]
    return interp.evaluate(op, sizes)


def maker(fn: Function, v: Value) -> str:
    op = next((op for op in fn.ops if v in op.outputs), None)
    if op is None:
        return "an input"
    return f"'{op.primitive.name}' at {op.origin.span if op.origin else '?'}"


@pytest.mark.parametrize("stem", BY_FILE)
def test_every_entry_exports(stem):
    assert not {case: str(e) for case, e in exported(stem)[1].items()}


@slow
def test_the_files_give_at_least_491_entries():
    """No entry drops out of the check unseen (an entry no sizes make is left out)."""
    assert sum(len(exported(stem)[0]) for stem in FILES) >= 491


@pytest.mark.parametrize("stem", BY_FILE)
def test_iree_and_the_cpu_backend_agree_with_the_interpreter(stem):
    """Each exported entry of a file, forward and gradient, on IREE and on the CPU backend,
    against the interpreter. (The CPU backend compiles a file in as long as IREE does: its
    side runs on ON_THE_CPU by default, on every file with DSLC_SLOW=1.)"""
    for case, fn in cases(stem).items():
        if case in exported(stem)[0]:
            arrays = inputs(fn)
            want, scale = definition(fn, arrays)
            entry = context(stem).modules.module[symbol(case)]
            agrees(f"{case} on IREE", fn, iree_run(entry, fn, arrays), want, scale)
            if stem in ON_THE_CPU or SLOW:
                agrees(f"{case} on the CPU backend", fn, cpu.Executable(fn, "k").run(arrays), want, scale)


def iree_run(entry, fn: Function, arrays: list[np.ndarray]) -> list[np.ndarray]:
    from runtime.iree import _argument, _result
    out = entry(*(_argument(a, v.dtype) for a, v in zip(arrays, fn.params)))
    return [_result(o, v.dtype, v.shape) for o, v in zip(out if isinstance(out, (tuple, list)) else (out,),
                                                          fn.results, strict=True)]


def agrees(case: str, fn: Function, got: list[np.ndarray], want: list[np.ndarray], scale: list[np.ndarray]) -> None:
    """The same bits where only exact operations made a result, else within the bound."""
    loose = inexact(fn)
    for k, (g, w, m, v) in enumerate(zip(got, want, scale, fn.results, strict=True)):
        assert g.dtype == w.dtype and g.shape == w.shape, case
        if v not in loose or w.dtype.kind not in "f":
            assert g.tobytes() == w.tobytes(), f"{case}: result {k}, made by {maker(fn, v)}, differs in its bits"
            continue
        bad = beyond_iree_bound(g, w, m)
        assert not bad.any(), (f"{case}: result {k}, made by {maker(fn, v)}, differs beyond the bound: "
                               f"{g[bad][:3]} against {w[bad][:3]}")


MLP = ROOT / "tests" / "programs" / "mlp.bend"
MLP_DIMS = "B=4,D=3,H=5,C=2"


def test_dslc_ir_level_mlir_prints_named_linalg_ops_at_their_lines():
    r = dslc("ir", str(MLP), "--entry", "loss", "--dims", MLP_DIMS, "--level", "mlir")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("module {\n  func.func @loss(%p.W1: tensor<3x5xf32>, ")
    assert f'linalg.matmul ins(%x, %p.W1 : tensor<4x3xf32>, tensor<3x5xf32>)' in r.stdout
    assert f'loc("{MLP}":15:14)' in r.stdout
    assert "math.tanh" in r.stdout


class _Unsayable(Unary):
    """An elementwise primitive with no MLIR (nor kernel body), which no op of the language
    is any longer."""
    name = "unsayable"
    reference = staticmethod(np.negative)


def test_an_op_mlir_cannot_say_yet_is_reported_at_its_origin():
    """The error names the op and carries where the source wrote it: dslc reports it there,
    as an error at the op's line."""
    b = Builder("f")
    x = b.param(tensor_type("f32", (2,)))
    b.origin = "f.bend:2:12"
    fn = b.finish([b.emit(_Unsayable(), x)])
    with pytest.raises(NotExpressible, match="^not expressible in MLIR yet: 'unsayable'$") as e:
        function(fn, "f")
    assert e.value.origin == "f.bend:2:12"


def test_device_iree_runs_an_entry_as_the_cpu_backend_does():
    args = {"p": {"W1": np.full((3, 5), 0.5, np.float32), "b1": np.zeros(5, np.float32),
                  "W2": np.full((5, 2), -0.25, np.float32), "b2": np.ones(2, np.float32)},
            "x": np.arange(12, dtype=np.float32).reshape(4, 3) / 10, "y": np.array([0, 1, 1, 0], np.int32)}
    got = dsl.load(str(MLP), device="iree").loss(**args)
    want = dsl.load(str(MLP), device="cpu").loss(**args)
    assert abs(got - want) <= 2e-5 * abs(want)


def test_dslc_run_device_iree_gives_the_cpu_backends_bits_for_exact_ops(tmp_path: Path):
    """xor's update is p - lr * g: exact, so IREE must not fuse the product into the difference."""
    rng = np.random.default_rng(1)
    shapes = {"W1": (2, 4), "b1": (4,), "W2": (4, 1), "b2": (1,)}
    arrays = {f"{r}.{k}": rng.standard_normal(s).astype(np.float32) for r in "pg" for k, s in shapes.items()}
    np.savez(tmp_path / "in.npz", **arrays, lr=np.float32(0.1))
    out = {}
    for device in ("cpu", "iree"):
        r = dslc("run", str(ROOT / "examples" / "xor.bend"), "--entry", "update", "--inputs",
                 str(tmp_path / "in.npz"), "-o", str(tmp_path / f"{device}.npz"), "--device", device)
        assert r.returncode == 0, r.stderr
        with np.load(tmp_path / f"{device}.npz") as f:
            out[device] = {k: f[k] for k in f.files}
    assert sorted(out["iree"]) == ["out.W1", "out.W2", "out.b1", "out.b2"]
    for k, want in out["cpu"].items():
        assert out["iree"][k].tobytes() == want.tobytes(), k


# xor steps by gradient descent: its weights are held to the bound. names_mlp's Adam divides
# each gradient by its root mean square, which turns a gradient that cancels to near 0 into a
# step of ±lr whatever its last bits: its losses are held, its weights only named and shaped.
@pytest.mark.parametrize("example, steps, held", [
    ("xor", 20, ("p.", "loss")),
    pytest.param("names_mlp", 3, ("loss", "valid.loss"), marks=slow)])   # (40 s here)
def test_dslc_train_device_iree_trains_as_the_cpu_backend_does(tmp_path: Path, example: str,
                                                               steps: int, held: tuple[str, ...]):
    """Init (normal's Philox draws), steps and evaluations on IREE end to end agree with the
    CPU backend's within the bound, magnitude each value's |value| (tanh, log and normal's
    log, cos and sin are IREE's approximations)."""
    model = quick(tmp_path, ROOT / "examples" / f"{example}.bend")
    saved = {}
    for device in ("cpu", "iree"):
        r = dslc("train", str(model), "--steps", str(steps), "--device", device,
                 "--checkpoint-dir", str(tmp_path / device))
        assert r.returncode == 0, r.stderr
        saved[device] = read_with_metadata(tmp_path / device / f"step{steps:07d}.safetensors")[0]
    assert sorted(saved["iree"]) == sorted(saved["cpu"])
    assert any(k.startswith(held) for k in saved["cpu"])
    for k, want in saved["cpu"].items():
        got = saved["iree"][k]
        assert got.dtype == want.dtype and got.shape == want.shape, k
        if k.startswith(held):                      # (losses are f32's, averaged into f64)
            got, want = got.astype(np.float32), want.astype(np.float32)
            assert not beyond_iree_bound(got, want, np.abs(want)).any(), (k, got, want)


@pytest.mark.parametrize("dtype, value", [("f64", "1e-12"), ("f32", "3e+38"), ("f64", "1e300"), ("f32", "-2.5")])
def test_a_literal_in_exponent_notation_is_a_float_mlir_reads(dtype: str, value: str):
    """repr writes 1e-12 without a point, which MLIR's lexer does not take as a float."""
    source = f"def f(x: {dtype}[N]) -> {dtype}[N]:\n  return x + {value}\n"
    x = np.arange(3, dtype=np_dtype(dtype))
    want = dsl.loads(source, device="cpu").f(x)
    assert dsl.loads(source, device="iree").f(x).tobytes() == want.tobytes()


def test_device_iree_computes_f64_in_f64():
    """IREE demotes f64 to f32 unless told not to: then 1 + 1e-12 - 1 would be 0 (or the call
    would refuse its f64 arguments)."""
    prog = dsl.loads("def f(x: f64[N], y: f64[N]) -> f64[N]:\n  return (x + y) - x\n", device="iree")
    got = prog.f(np.ones(3), np.full(3, 1e-12))
    assert got.dtype == np.float64
    assert got.tobytes() == ((1.0 + np.full(3, 1e-12)) - 1.0).tobytes()


def test_a_function_iree_cannot_compile_is_a_dsl_error(tmp_path: Path):
    """IREE's llvm-cpu has no math.erfc: the API and dslc say so, with IREE's reason."""
    source = "def f(x: f32[N]) -> f32[N]:\n  return erfc(x)\n"
    raises(lambda: dsl.loads(source, device="iree").f(np.ones(2, np.float32)),
           "IREE's compiler failed (target llvm-cpu): failed to legalize operation 'math.erfc'")
    (tmp_path / "f.bend").write_text(source)
    np.savez(tmp_path / "in.npz", x=np.ones(2, np.float32))
    user_error(dslc("run", str(tmp_path / "f.bend"), "--entry", "f", "--inputs", str(tmp_path / "in.npz"),
                    "--device", "iree"), "error: IREE's compiler failed (target llvm-cpu): failed to "
               "legalize operation 'math.erfc' that was explicitly marked illegal (IREE's math library")


EXACT = ROOT / "tests" / "programs" / "exact_ops.bend"


def test_argmax_and_argmin_on_iree_pick_numpys_index_of_nan_ties_and_signed_zeros():
    """The first NaN, else the first extreme; -0.0 ties with 0.0; -inf and +inf can win."""
    nan, inf = np.nan, np.inf
    x = np.array([[1.0, nan, 3.0, nan], [-0.0, 0.0, -inf, -inf], [inf, 2.0, inf, -1.0]], np.float32)
    n = np.array([[0, 7, 7, -3], [-3, 5, -3, 5], [2, 2, 2, 2]], np.int32)
    m = np.array([[False, True, True, False], [False] * 4, [True, False, False, True]])
    got = dsl.load(str(EXACT), device="iree").extremes(x, n, m)
    want = (np.argmax(x, 1), np.argmin(x, -1)[:, None], np.argmax(x), np.argmin(n, 0),
            np.argmax(m, 1), np.argmin(n).reshape(1, 1))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.int32 and g.tolist() == w.tolist()
