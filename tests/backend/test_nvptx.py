"""Every kernel of every test program and example, forward and backward, lowered to PTX for
sm_80 and sm_90 and accepted by ptxas; launch shapes within the chips' limits; no call
that LLVM cannot select on NVPTX (math functions are the math library's own code)."""
from __future__ import annotations

import functools
import re
import shutil
import sys
from pathlib import Path

import pytest

import dsl
from backend import nvptx, schedule, tensorcore
from backend.llvm import row_major
from backend.loops import Instr, Load, LoopKernel, Reduce
from dsl.inputs import example_inputs
from ir.ad import grad_function
from ir.core import Builder, tensor_type
from ir.numerics import CHUNK
from ir.ops.index import ScatterAdd, Take
from backend.gpu_plan import GpuKernels, gpu_kernels, gpu_schedule, module_ptx
from ir.ops.random import Bernoulli, FoldIn, Key, KeySplit, Normal, Uniform
from ir.ops.reduce import ArgMax, ArgMin
from ir.ops.shape import Concat, SliceSpec, Split
from ir.passes import for_backends, optimize

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import test_programs as programs  # noqa: E402
from conftest import EXAMPLES, example_case  # noqa: E402

needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on the PATH")


def gpt():
    prog = dsl.load(str(ROOT / "benchmarks" / "models" / "gpt.bend"))
    d = prog._def("loss")
    return prog, example_inputs(d, prog._resolved.main,
                                {"B": 2, "T": 8, "D": 16, "V": 11, "H": 2, "p.blocks": 2})


def example(name: str):
    prog, args, _ = example_case(name, "cpu")
    return prog, args


CASES = {
    "mlp": lambda: (programs.load("mlp"), programs.mlp_inputs(0)),
    "layer_norm": lambda: (programs.load("layer_norm"), programs.layer_norm_inputs(0)),
    "attention": lambda: (programs.load("attention"), programs.attention_inputs(0)),
    "lstm": lambda: (programs.load("lstm"), programs.lstm_inputs(0)),
    "conv2d": lambda: (programs.load("conv2d"), programs.conv_inputs(0)),
    "gpt_benchmark": lambda: gpt(),
    **{name: functools.partial(example, name) for name in EXAMPLES},
}
CI_ARCHES = ("sm_80", "sm_90")          # every program for these; every kernel class for all
REGISTERS = 64 * 1024                   # 32-bit registers per block, sm_80 to sm_120
MATMULS = ("f32", "f64")                # the contraction kernels' dtypes
# each architecture's first PTX ISA version (NVIDIA's PTX ISA, "PTX ISA notes" per target)
ARCH_PTX = {"sm_80": "7.0", "sm_86": "7.1", "sm_89": "7.8", "sm_90": "7.8", "sm_100": "8.6",
            "sm_120": "8.7"}


def gpu_parts(fn, name, numerics: str = "exact") -> list[GpuKernels]:
    """What the GPU runtime compiles for fn: its plan's kernels, contractions and gathers, and
    those of each scan and checkpoint body it holds."""
    fn = for_backends(fn)
    plan = gpu_schedule(fn, name, numerics)
    out = [gpu_kernels(plan, name, numerics)]
    for i, step in enumerate(plan.steps):
        if isinstance(step, schedule.HostStep) and step.op.body is not None:
            out += gpu_parts(step.op.body, f"{name}_b{i}", numerics)
    return out


def within_limits(text: str, report: str, launches: list) -> None:
    """Each launch's entry is in the PTX, and its block, grid, registers (ptxas's count) and
    static shared memory fit every architecture's limits."""
    used = dict(re.findall(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", report, re.S))
    for shape in launches:
        grid = shape.grid if isinstance(shape.grid, tuple) else (shape.grid, 1, 1)
        assert f".entry {shape.entry}(" in text
        assert shape.block <= 1024 and grid[0] <= nvptx.MAX_GRID_X and max(grid[1:]) <= nvptx.MAX_GRID_YZ
        assert shape.shared <= nvptx.SHARED_LIMIT
        assert int(used[shape.entry]) * shape.block <= REGISTERS, (shape.entry, used[shape.entry])


@needs_ptxas
@pytest.mark.parametrize("name", CASES)
def test_every_kernel_assembles(name):
    """The forward and backward kernels of a program, as the runtime compiles them: the LLVM
    IR built once, its PTX for each architecture of CI_ARCHES through ptxas. (The contraction
    kernels, the same for every program, are test_reductions_and_contractions_….)"""
    prog, args = CASES[name]()
    low, _ = prog.lower("loss", (), args)
    grad = optimize(grad_function(low.function, list(range(len(low.function.params)))[:1] or [0]))
    parts = gpu_parts(low.function, f"{name}_f") + gpu_parts(grad, f"{name}_g")
    ks = [k for p in parts for k in p.kernels]
    gathers = tuple(sorted({g for p in parts for g in p.gather_kernels}, key=lambda g: (g[0].name, g[1])))
    assert ks, "nothing to compile"
    assert {d for p in parts for d in p.matmuls} <= set(MATMULS), "a contraction kernel no test assembles"
    module = str(nvptx.module_ir(ks, gathers=gathers))
    launches = [s for p in parts for s in p.launches.values()] + \
        [nvptx.gather_launch(*g, 10 ** 9) for g in gathers]
    for arch in CI_ARCHES:
        text = nvptx.assemble(module, arch)
        assert f"\n.target {arch}\n" in text
        assert not re.search(r"\bcall(\.uni)?\s", text), "a call reached the PTX"
        within_limits(text, nvptx.ptxas(text, arch), launches)


@needs_ptxas
@pytest.mark.parametrize("name", EXAMPLES)
def test_every_examples_training_step_in_fast_numerics_assembles(name):
    """An example's loss and gradient as fast numerics compiles them: one module with the
    tensor-core kernels of its products (and no exact contraction kernel for them), through
    ptxas for each architecture of CI_ARCHES, every launch within the limits."""
    prog, args = CASES[name]()
    low, _ = prog.lower("loss", (), args)
    grad = optimize(grad_function(low.function, [0]))
    parts = gpu_parts(low.function, f"{name}_f", "fast") + gpu_parts(grad, f"{name}_g", "fast")
    mmas = tuple(sorted({d for p in parts for d in p.mmas}))
    assert mmas and not any(p.matmuls for p in parts)
    gathers = tuple(sorted({g for p in parts for g in p.gather_kernels}, key=lambda g: (g[0].name, g[1])))
    launches = [s for p in parts for s in p.launches.values()] + \
        [tensorcore.launch(d, 1, 4096, 4096) for d in mmas]
    for arch in CI_ARCHES:
        text = module_ptx([k for p in parts for k in p.kernels], (), gathers, mmas, arch)
        within_limits(text, nvptx.ptxas(text, arch), launches)


def reduction(name, dtype, outer, n, combine="add", columns=False, count=None):
    """A reduction kernel: over the rows of an [*outer, n] array, or (columns) over the
    columns of an [n, m] array (outer = (m,), the reduced axis's stride m)."""
    if columns:
        (m,) = outer
        source, strides = (n, m), (1, m)
    else:
        source, strides = outer + (n,), row_major(outer + (n,))
    return LoopKernel(name, outer, ((dtype, source), (dtype, outer)),
                      (Instr.read(Load(0, strides), dtype),),
                      reduce=Reduce(combine, 0, 1, count), n=n)


def window_kernels() -> list[LoopKernel]:
    """Map kernels that read windows, in several dtypes: the gradients of qkv[:, :, i] (one
    of them transposed) added, and a slice's gradient reshaped (read through a copy)."""
    out = []
    for dtype in ("f32", "f64", "i32"):
        b = Builder()
        dq, dk, dv = (b.param(tensor_type(dtype, s)) for s in ((2, 5, 8), (2, 5, 8), (5, 2, 8)))
        all_ = SliceSpec()
        parts = [b.emit("unindex", d, items=(all_, all_, i), shape=(2, 5, 3, 8)) for i, d in
                 enumerate((dq, dk, b.emit("transpose", dv, perm=(1, 0, 2))))]
        total = b.emit("add", b.emit("add", parts[0], parts[1]), parts[2])
        sliced = b.emit("unindex", dq, items=(all_, SliceSpec(1, 6)), shape=(2, 7, 8))
        fn = b.finish([total, b.emit("reshape", sliced, shape=(2, 56))])
        out += schedule.schedule(fn, f"window_{dtype}").kernels
    assert sum(bool(i.load and i.load.window) for k in out for i in k.body) == 12
    return out


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_windowed_loads_assemble(arch):
    nvptx.ptxas(nvptx.ptx(window_kernels(), arch), arch)


# Reductions of every length class: one warp (≤ CHUNK), a block with chunk results in shared
# memory (≤ CHUNK²), and a block with a second level; rows and columns; every float dtype.
REDUCTIONS = [
    reduction("warp_rows", "f32", (7,), 100),
    reduction("warp_cols", "f32", (5,), 300, "max", columns=True),
    reduction("empty", "f32", (3,), 0),
    reduction("one_level", "f32", (2,), 3 * CHUNK + 5, count=3 * CHUNK + 5),
    reduction("two_levels", "f32", (), CHUNK * CHUNK + 7),
    reduction("f64_max", "f64", (4,), 2 * CHUNK + 1, "max"),
    reduction("f64_cols", "f64", (6,), 9000, "min", columns=True),
    reduction("f16_min", "f16", (3,), 70, "min"),
]


@functools.cache
def kernel_classes() -> str:
    """The LLVM IR of every reduction shape class and both contraction kernels, built once."""
    return str(nvptx.module_ir(REDUCTIONS, MATMULS))


@needs_ptxas
@pytest.mark.parametrize("arch", nvptx.ARCHES)
def test_reductions_and_contractions_assemble_within_the_limits(arch):
    """For every architecture: every reduction shape class and both contraction kernels pass
    ptxas, with the shared memory the launch shape declares, registers for a whole block, no
    spills in f32, and the canonical tree as shuffles."""
    text = nvptx.assemble(kernel_classes(), arch)
    assert re.search(rf"^\.version {ARCH_PTX[arch]}\n\.target {arch}\n", text, re.M)
    report = nvptx.ptxas(text, arch)
    within_limits(text, report, [nvptx.launch(k) for k in REDUCTIONS] +
                  [nvptx.matmul_launch(d, 1, m, m) for d in MATMULS for m in (4096, 64)])
    usage = dict(re.findall(r"Compiling entry function '(\w+)'.*?Used \d+ registers.*?(\d+ bytes smem|\n)",
                            report, re.S))
    for k in REDUCTIONS:
        shape = nvptx.launch(k)
        smem = usage[shape.entry]
        assert (int(smem.split()[0]) if "smem" in smem else 0) >= shape.shared
        body = text.split(f".entry {shape.entry}(")[1].split("\n}\n")[0]
        assert body.count("shfl.sync.down") >= 5, "the halving tree is five shuffles"
    for dtype in MATMULS:
        for batch, m, n, tiles in ((3, 4096, 4096, "large"), (8, 64, 64, "small")):
            shape = nvptx.matmul_launch(dtype, batch, m, n)
            assert shape.entry == f"dslc_matmul_{dtype}_{tiles}"
            assert max(shape.grid[1:]) <= nvptx.MAX_GRID_YZ
            assert int(usage[shape.entry].split()[0]) == shape.shared
    for tiles in nvptx.TILES:
        entry = nvptx.matmul_entry("f32", tiles)
        f32 = report.split(f"Compiling entry function '{entry}'")[1].split("Compile time")[0]
        assert "0 bytes spill stores" in f32
        mm = text.split(f".entry {entry}(")[1].split("\n}\n")[0]
        assert mm.count("fma.rn.f32") >= tiles.bk * tiles.tm * tiles.tn
        assert "ld.shared.v4" in mm and "bar.sync" in mm
        assert not re.search(r"\b(add|mul|sub)\.(rn\.)?f32", mm), "only fmas touch the accumulators"


def row_kernels() -> list[LoopKernel]:
    """Row kernels of every length class (a warp a row, a block a row: one level, and chunks
    of chunks), several dtypes: softmax and layer norm forward and backward, with a
    per-row stage, a stored exp and a windowed load."""
    out = []
    for dtype, shape in (("f32", (3, 1)), ("f32", (5, 33)), ("f64", (2, 3, 100)),
                         ("f32", (3, CHUNK + 7)), ("f32", (2, 3 * CHUNK))):
        b = Builder()
        x = b.param(tensor_type(dtype, shape))
        g = b.param(tensor_type(dtype, shape[-1:]))
        m = b.emit("max", x, axis=-1, keepdims=True)
        e = b.emit("exp", b.emit("sub", x, m))
        y = b.emit("div", e, b.emit("sum", e, axis=-1, keepdims=True))
        mu = b.emit("mean", x, axis=-1, keepdims=True)
        d = b.emit("sub", x, mu)
        var = b.emit("mean", b.emit("mul", d, d), axis=-1, keepdims=True)
        z = b.emit("mul", b.emit("mul", d, b.emit("rsqrt", b.emit("add", var, b.constant(1e-5, dtype)))), g)
        dy = b.emit("mul", y, b.emit("sub", g, b.emit("sum", b.emit("mul", g, y), axis=-1, keepdims=True)))
        fn = b.finish([y, z, dy])
        out += schedule.schedule(fn, f"rows_{dtype}_{'_'.join(map(str, shape))}").kernels
    assert all(k.is_rows for k in out)
    return out


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_row_kernels_assemble_within_the_limits(arch):
    ks = row_kernels()
    text = nvptx.ptx(ks, arch)
    assert not re.search(r"\bcall(\.uni)?\s", text), "a call reached the PTX"
    nvptx.ptxas(text, arch)
    for k in ks:
        shape = nvptx.launch(k)
        assert shape.block <= 1024 and 1 <= shape.grid <= nvptx.MAX_GRID_X
        assert shape.shared <= nvptx.SHARED_LIMIT
        body = text.split(f".entry {shape.entry}(")[1].split("\n}\n")[0]
        if 1 < k.n <= CHUNK:                                       # a warp a row
            assert "shfl.sync.idx" in body and "bar.warp.sync" in body
        elif k.n > CHUNK:                                           # a block a row
            assert "bar.sync" in body


def test_long_reductions_stay_within_shared_memory():
    k = reduction("huge", "f64", (), CHUNK * CHUNK * nvptx.MAX_SECOND_LEVEL)
    assert nvptx.launch(k).shared <= nvptx.SHARED_LIMIT
    with pytest.raises(ValueError, match="longer than"):
        nvptx.launch(reduction("too_long", "f64", (), CHUNK * CHUNK * nvptx.MAX_SECOND_LEVEL + 1))


def test_ptxas_rejection_is_reported():
    if shutil.which("ptxas") is None:
        pytest.skip("ptxas is not on the PATH")
    with pytest.raises(RuntimeError, match="ptxas rejected"):
        nvptx.ptxas(".version 8.0\n.target sm_90\nthis is not ptx\n")


TAKE, SCATTER_ADD, CONCAT, NORMAL = Take(), ScatterAdd(), Concat(), Normal()
GATHERS = tuple((prim, d) for prim in (TAKE, CONCAT, Split(), ArgMax(), ArgMin()) for d in ("f32", "f64", "f16", "i32", "i64", "bool")) + \
    tuple((prim, d) for prim in (SCATTER_ADD, Uniform(), Bernoulli()) for d in ("f32", "f64")) + \
    ((KeySplit(), "u32"), (Key(), "u32"), (NORMAL, "f32")) + tuple((FoldIn(), d) for d in ("i32", "i64", "u32"))


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_gather_kernels_assemble(arch):
    """take, concat, split, argmax, argmin, scatter_add, the draws and the keys: no call, no atomics, and scatter_add's sums
    and uniform's L + (H - L) · u as plain operations (no fma, which would round once for two;
    normal's are the math library's)."""
    text = nvptx.ptx([], arch, gathers=GATHERS)
    assert not re.search(r"\bcall(\.uni)?\s", text), "a call reached the PTX"
    nvptx.ptxas(text, arch)
    for prim, dtype in GATHERS:
        shape = nvptx.gather_launch(prim, dtype, 10 ** 9)
        assert shape.block <= 1024 and 1 <= shape.grid <= nvptx.MAX_GRID_X
        body = text.split(f".entry {shape.entry}(")[1].split("\n}\n")[0]
        assert "atom" not in body and ("fma" not in body or prim == NORMAL)
        if prim == SCATTER_ADD:
            assert f"add.rn.{dtype}" in body


@needs_ptxas
def test_the_manifest_lists_gathers_as_gpu_kernels(tmp_path):
    """`dslc compile --target ptx`: an embedding's lookup and its gradient, and a
    concatenation and its gradient (a split), are gather kernels in kernels.ptx: no host step."""
    prog = dsl.loads("def loss(E: f32[V, D], idx: i32[B, T]) -> f32:\n  h = concat([E[idx], E[idx]])\n"
                     "  return sum(h * h)\n")
    manifest = prog.compile_to("loss", "ptx", str(tmp_path), dims={"V": 11, "D": 8, "B": 2, "T": 3}, grad="E")
    gathers = [s for s in manifest["steps"] if "gather" in s]
    assert {(s["gather"], s["entry"]) for s in gathers} == {("take", "dslc_take_f32"),
                                                            ("scatter_add", "dslc_scatter_add_f32"),
                                                            ("concat", "dslc_concat_f32"),
                                                            ("split", "dslc_split_f32")}
    assert not [s for s in manifest["steps"] if "host" in s]
    text = (tmp_path / "kernels.ptx").read_text()
    assert manifest["gather_entries"] and all(f".entry {e}(" in text for e in manifest["gather_entries"])
    nvptx.ptxas(text)


@pytest.mark.parametrize("capability, arch", [((8, 0), "sm_80"), ((8, 6), "sm_86"), ((8, 7), "sm_86"),
                                              ((8, 9), "sm_89"), ((9, 0), "sm_90"), ((10, 0), "sm_100"),
                                              ((10, 3), "sm_100"), ((11, 0), "sm_100"),
                                              ((12, 0), "sm_120"), ((12, 1), "sm_120"), ((13, 0), "sm_120")])
def test_a_device_runs_its_own_architecture_or_the_newest_before_it(capability, arch):
    assert nvptx.arch_for(capability) == arch


def test_an_architecture_older_than_sm_80_is_refused():
    with pytest.raises(ValueError, match="sm_75 is older than sm_80"):
        nvptx.arch_for((7, 5))
    with pytest.raises(ValueError, match="unknown GPU architecture 'sm_75': one of sm_80, sm_86"):
        nvptx.assemble("", "sm_75")
