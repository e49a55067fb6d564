"""On a GPU: every kernel class, every test program and every example gives the CPU backend's
bits (docs/numerics.md), outputs and gradients; the runtime's failures are DslErrors. Skipped
where no GPU is usable; scripts/gpu-check runs these on a machine that has one."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import dsl
from backend import nvptx
from frontend.diagnostics import DslError
from ir.numerics import CHUNK
from runtime import cuda

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import test_programs as programs  # noqa: E402
from conftest import EXAMPLES, example_case  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda.usable(), reason="no usable NVIDIA GPU")]


def same_bits(got, want) -> bool:
    """Bit-identical arrays (one NaN equals another: payloads are not part of the result)."""
    g, w = np.asarray(got), np.asarray(want)
    if g.shape != w.shape or g.dtype != w.dtype:
        return False
    if g.dtype.kind == "f":
        as_bits = lambda a: np.ascontiguousarray(a).view(f"u{a.itemsize}")
        return bool(np.all((np.isnan(g) & np.isnan(w)) | (as_bits(g) == as_bits(w))))
    return bool(np.array_equal(g, w))


def leaves(value, path="result"):
    if isinstance(value, dict):
        for k in value:
            yield from leaves(value[k], f"{path}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from leaves(v, f"{path}[{i}]")
    elif isinstance(value, dsl.Key):
        yield path, value.words
    else:
        yield path, value


def assert_same(got, want):
    pairs = list(zip(leaves(got), leaves(want)))
    assert len(pairs) == len(list(leaves(want))), "the results differ in structure"
    differ = [p for (p, g), (_, w) in pairs if not same_bits(g, w)]
    assert not differ, f"not bit-identical to the CPU: {', '.join(differ)}"


def both(source: str, name: str = "<gpu test>"):
    return dsl.loads(source, name=name, device="cuda"), dsl.loads(source, name=name, device="cpu")


def special(rng, shape, dtype=np.float32) -> np.ndarray:
    """Random normals with the values that break careless kernels sprinkled in."""
    x = rng.standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    picks = rng.integers(0, flat.size, size=min(flat.size, 8))
    flat[picks] = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -3.5, 3.5], dtype)[:len(picks)]
    return x


# ---------------------------------------------------------------- kernels


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (3, 0, 4), (5, 7, 3), (129, 9, 130), (64, 17, 257),
                                     (300, 513, 200), (1024, 1024, 1024)])
def test_matmul_is_bit_identical(dtype, m, k, n):
    gpu, cpu = both(f"def f(a: {dtype}[M, K], b: {dtype}[K, N]) -> {dtype}[M, N]:\n  return a @ b\n")
    rng = np.random.default_rng(m * 7 + k)
    t = np.float32 if dtype == "f32" else np.float64
    a, b = rng.standard_normal((m, k)).astype(t), rng.standard_normal((k, n)).astype(t)
    assert_same(gpu.f(a, b), cpu.f(a, b))


def test_batched_and_broadcast_matmul_is_bit_identical():
    gpu, cpu = both("def f(a: f32[B, H, T, D], b: f32[H, D, S], v: f32[D]) -> (f32[B, H, T, S], f32[B, H, T]):\n"
                    "  return a @ b, a @ v\n")
    rng = np.random.default_rng(0)
    a, b, v = special(rng, (2, 3, 33, 20)), special(rng, (3, 20, 45)), special(rng, (20,))
    assert_same(gpu.f(a, b, v), cpu.f(a, b, v))


@pytest.mark.parametrize("n", [1, 31, 33, 4096, 4097, 3 * CHUNK + 5])
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
def test_row_and_column_reductions_are_bit_identical(op, n):
    gpu, cpu = both(f"def f(x: f32[R, N]) -> (f32[R], f32[N]):\n  return {op}(x, axis=1), {op}(x, axis=0)\n")
    x = special(np.random.default_rng(n), (5, n))
    assert_same(gpu.f(x), cpu.f(x))


def test_reductions_of_two_levels_and_f64_are_bit_identical():
    gpu, cpu = both("def f(x: f32[N], y: f64[R, M]) -> (f32, f64[R]):\n  return sum(x), mean(y, axis=-1)\n")
    rng = np.random.default_rng(5)
    x = rng.standard_normal(CHUNK * CHUNK + 77).astype(np.float32)
    y = rng.standard_normal((3, 5 * CHUNK + 1))
    assert_same(gpu.f(x, y), cpu.f(x, y))


MATH = ["exp", "log", "tanh", "sigmoid", "sin", "cos", "sqrt", "rsqrt", "floor", "abs", "exp2", "log2"]


@pytest.mark.parametrize("fn", MATH)
def test_elementwise_math_is_bit_identical(fn):
    gpu, cpu = both(f"def f(x: f32[N], y: f64[N]) -> (f32[N], f64[N]):\n  return {fn}(x), {fn}(y)\n")
    rng = np.random.default_rng(3)
    x = special(rng, (100_003,)) * 30
    assert_same(gpu.f(x, x.astype(np.float64)), cpu.f(x, x.astype(np.float64)))


def test_pow_is_bit_identical():
    gpu, cpu = both("def f(x: f32[N], y: f32[N], u: f64[N], v: f64[N]) -> (f32[N], f64[N]):\n"
                    "  return x ** y, u ** v\n")
    rng = np.random.default_rng(4)
    x, y = special(rng, (100_003,)) * 30, special(rng, (100_003,)) * 4
    args = (x, y, x.astype(np.float64), y.astype(np.float64))
    assert_same(gpu.f(*args), cpu.f(*args))


@pytest.mark.parametrize("n", [1, 13, 100_003])
def test_integer_division_concatenation_draws_and_folds_on_the_device_are_bit_identical(n):
    """The programs of tests/runtime/test_on_device.py at sizes past one block and one grid."""
    sys.path.insert(0, str(ROOT / "tests" / "runtime"))
    from test_on_device import CONCAT, DIVISION, DRAWS, FOLD, extremes
    rng = np.random.default_rng(n)
    division = [x for t in (np.int32, np.int64, np.uint32) for x in extremes(t, n)]
    x, y = special(rng, (2, n, 3)), special(rng, (2, 1, 3))
    draws = DRAWS.replace("N", str(n))
    for (gpu, cpu), call, args in ((both(DIVISION), "f", division), (both(CONCAT), "f", (x, y, x)),
                                   (both(draws), "f", (dsl.key(n), np.float32(0.3), np.float64(0.7))),
                                   (both(FOLD), "f", (special(rng, (min(n, 300), 3, 2)), special(rng, (2, 2)),
                                                      special(rng, (3, 2))))):
        assert_same(getattr(gpu, call)(*args), getattr(cpu, call)(*args))


@pytest.mark.parametrize("n", [0, 1, 13, 100_003])
def test_normals_keys_and_fold_in_on_the_device_are_bit_identical(n):
    """normal (log, cos and sin rounded from the math library's f64), fold_in of i32, i64
    and u32, and keys, made by their kernels (tests/runtime/test_on_device.py's program)."""
    sys.path.insert(0, str(ROOT / "tests" / "runtime"))
    from test_on_device import KEYS_AND_NORMALS
    gpu, cpu = both(KEYS_AND_NORMALS.replace("N", str(n)))
    args = (dsl.key(n), np.int32(-1), np.int64(-1), np.uint32(2 ** 32 - 1))
    for _ in range(2):                       # the second: key(seed)'s made once, a CUDA graph's replay
        assert_same(gpu.f(*args), cpu.f(*args))


@pytest.mark.parametrize("t", [1, 11, 500])
def test_persistent_folds_and_cuda_graphs_are_bit_identical(t):
    """An RNN's loss and gradient (a persistent kernel for each fold) and a training step
    replayed as a CUDA graph (tests/runtime/test_on_device.py's and test_cuda.py's programs),
    at every call; the graph is captured once."""
    sys.path.insert(0, str(ROOT / "tests" / "runtime"))
    from test_cuda import GRAPHED
    from test_on_device import RNN
    rng = np.random.default_rng(t)
    (gpu, cpu), wrt = both(RNN), ("w", "u", "h0")
    args = [special(rng, (t, 4, 3))] + [rng.standard_normal(s).astype(np.float32) for s in ((3, 5), (5, 5), (4, 5))]
    assert_same(gpu.value_and_grad("loss", wrt=wrt)(*args), cpu.value_and_grad("loss", wrt=wrt)(*args))
    gpu, cpu = both(GRAPHED)
    for i in range(4):
        step = [rng.standard_normal(s).astype(np.float32) for s in ((4, 3), (3,), (5, 4))] + [dsl.key(i), np.float32(0.1)]
        assert_same(gpu.step(*step), cpu.step(*step))


def test_broadcasts_casts_and_selections_are_bit_identical():
    gpu, cpu = both("def f(x: f32[A, B], b: f32[B], i: i32[A, 1]) -> (f32[A, B], i32[A, B], bool[A, B]):\n"
                    "  y = where(x > b, x / b, maximum(x, b) - cast(i, f32))\n"
                    "  return y, cast(x, i32) * 3 + i, (x < 0.0) & (b > 0.0)\n")
    rng = np.random.default_rng(4)
    x, b = special(rng, (257, 129)), special(rng, (129,))
    i = rng.integers(-5, 5, (257, 1)).astype(np.int32)
    assert_same(gpu.f(x, b, i), cpu.f(x, b, i))


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_take_and_scatter_add_are_bit_identical(dtype, axis):
    """Repeated and negative indices, rows no index names, summands of many magnitudes (so
    any other order of the adds would round differently)."""
    dims = ["A", "B", "C"]
    ax = axis % 3
    u_dims = dims[:ax] + ["N", "M"] + dims[ax + 1:]
    gpu, cpu = both(f"def f(x: {dtype}[A, B, C], i: i32[N, M], u: {dtype}[{', '.join(u_dims)}]):\n"
                    f"  return take(x, i, axis={axis}), scatter_add(x, i, u, axis={axis})\n")
    rng = np.random.default_rng(ax)
    t = np.float32 if dtype == "f32" else np.float64
    x = special(rng, (37, 6, 259), t)
    i = rng.integers(-x.shape[ax], x.shape[ax], (40, 3)).astype(np.int32)
    u_shape = x.shape[:ax] + i.shape + x.shape[ax + 1:]
    u = special(rng, u_shape, t) * 10.0 ** rng.uniform(-4, 4, u_shape).astype(t)
    assert_same(gpu.f(x, i, u), cpu.f(x, i, u))


def test_an_embeddings_lookup_and_gradient_are_bit_identical():
    gpu, cpu = both("def loss(E: f32[V, D], idx: i32[B, T], w: f32[B, T, D]) -> f32:\n"
                    "  return sum(E[idx] * w)\n")
    rng = np.random.default_rng(7)
    E, w = special(rng, (1000, 768)), special(rng, (8, 512, 768))
    idx = np.minimum(rng.zipf(1.3, (8, 512)), 1000).astype(np.int32) - 1     # a few tokens often
    assert_same(gpu.value_and_grad("loss", wrt="E")(E, idx, w), cpu.value_and_grad("loss", wrt="E")(E, idx, w))


@pytest.mark.parametrize("bad", [1000, -1001])
def test_an_index_out_of_range_is_the_cpus_error(bad):
    source = "def f(E: f32[V, D], idx: i32[N], u: f32[N, D]):\n  return E[idx], scatter_add(E, idx, u)\n"
    E, idx, u = np.ones((1000, 4), np.float32), np.array([1, bad, 3], np.int32), np.ones((3, 4), np.float32)
    messages = []
    for prog in both(source):
        with pytest.raises(DslError) as e:
            prog.f(E, idx, u)
        messages.append(str(e.value))
    assert messages[0] == messages[1] and f"index {bad} is out of bounds" in messages[0]


# ---------------------------------------------------------------- programs and examples


PROGRAMS = {"mlp": "mlp", "layer_norm": "layer_norm", "attention": "attention", "lstm": "lstm",
            "conv2d": "conv"}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", PROGRAMS)
def test_test_programs_are_bit_identical(name, seed):
    inputs = getattr(programs, f"{PROGRAMS[name]}_inputs")(seed)
    path = str(programs.PROGRAMS / f"{name}.bend")
    gpu, cpu = dsl.load(path, device="cuda"), dsl.load(path, device="cpu")
    for wrt in [k for k, v in inputs.items() if any(np.asarray(a).dtype.kind == "f" for _, a in leaves(v))]:
        assert_same(gpu.value_and_grad("loss", wrt=wrt)(**inputs),
                    cpu.value_and_grad("loss", wrt=wrt)(**inputs))


@pytest.mark.parametrize("arch", nvptx.ARCHES)
def test_the_ptx_of_every_architecture_the_device_runs_gives_the_cpus_bits(arch, monkeypatch):
    """The driver loads the PTX built for the device's own architecture and for each older one
    (compiling it for the device), and each gives the CPU's bits: attention, forward and back."""
    drv = cuda.driver()
    if nvptx.capability_of(arch) > drv.capability:
        pytest.skip(f"{drv.device_name} is sm_{drv.capability[0]}{drv.capability[1]}, older than {arch}")
    monkeypatch.setattr(cuda, "arch", lambda _: arch)
    inputs = programs.attention_inputs(0)
    path = str(programs.PROGRAMS / "attention.bend")
    gpu, cpu = dsl.load(path, device="cuda"), dsl.load(path, device="cpu")
    wrt = next(iter(inputs))
    assert_same(gpu.value_and_grad("loss", wrt=wrt)(**inputs), cpu.value_and_grad("loss", wrt=wrt)(**inputs))


@pytest.mark.parametrize("name", EXAMPLES)
def test_examples_are_bit_identical(name):
    gpu, args, wrt = example_case(name, "cuda")
    cpu, _, _ = example_case(name, "cpu")
    assert_same(gpu.value_and_grad("loss", wrt=wrt)(**args), cpu.value_and_grad("loss", wrt=wrt)(**args))


# ---------------------------------------------------------------- the runtime


def test_results_stay_on_the_gpu_until_asked_for():
    gpu, cpu = both("def f(x: f32[N]) -> f32[N]:\n  return x * 2.0 + 1.0\n")
    x = np.arange(10, dtype=np.float32)
    y = gpu.f(x)
    assert isinstance(y, cuda.DeviceArray)
    z = gpu.f(y)                                   # back in without a copy
    assert_same(z, cpu.f(cpu.f(x)))
    assert z.numpy().dtype == np.float32


def test_an_impossible_allocation_is_a_dsl_error():
    memory = cuda.Memory(cuda.driver())
    with pytest.raises(DslError, match="cannot allocate"):
        memory.take(1 << 52, "a test")


def test_a_failing_launch_names_the_kernel():
    gpu, _ = both("def f(x: f32[N]) -> f32[N]:\n  return exp(x)\n")
    exe = gpu.executable(gpu.f.lower(np.ones(4, np.float32)).function)
    entry = next(iter(exe.functions))
    exe.launched = []
    with pytest.raises(DslError, match=f"GPU kernel {entry} failed to launch"):
        exe._launch(entry, (1, 1, 1), 4096, [0, 0])          # 4096 threads: more than a block holds


# ---------------------------------------------------------------- other frameworks' CUDA tensors


def test_torch_cuda_tensors_go_in_and_out_without_a_copy():
    """A torch CUDA tensor is the kernel's buffer, and torch.from_dlpack shares the result's."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("this torch has no CUDA")
    prog = dsl.loads("def scale(x: f32[N, M], k: f32) -> f32[N, M]:\n  return x * k\n", device="cuda")
    x = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)[1:]
    out = prog.scale(x, 2.0)
    back = torch.from_dlpack(out)
    assert back.device == torch.device("cuda", 0) and back.data_ptr() == out.ptr
    assert torch.equal(back, x * 2)
    assert prog.scale(back, 0.5).numpy().tolist() == x.cpu().tolist()      # back in, in place
    with pytest.raises(DslError, match="'x' is not contiguous"):
        prog.scale(x.T, 1.0)
