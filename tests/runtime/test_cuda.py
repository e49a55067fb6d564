"""The GPU runtime's logic without a GPU: device selection, and runtime/cuda.py driven through
a fake driver whose "device memory" is host memory and whose launches run the same loop
kernels compiled for the CPU (the contraction through the CPU's contraction kernel, the
gather kernels through a NumPy model of their contract). What is tested is everything
around the kernels: uploads, device-resident results, buffers freed and reused, host
steps, reshapes as views, scan bodies, the contraction's batch strides, the gathers'
indices prepared on the host, and failures becoming DslErrors that name the kernel. The
PTX itself is tested by ptxas (tests/backend/test_nvptx.py) and on a GPU (tests/gpu/)."""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest

import dsl
from backend import nvptx
from backend.contract import Matmul
from backend.cpu import Compiled
from frontend.diagnostics import DslError
from ir.ops.base import np_dtype
from ir.ops.random import Bernoulli, FoldIn, Key, KeySplit, Normal, Uniform
from runtime import cuda

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))          # (emulator.py: the fake driver's folds)
import test_programs as programs  # noqa: E402


class FakeDriver:
    """Host memory as device memory; a module is the loop kernels it was compiled from. A
    CUDA graph is the list of launches made while capturing (which run none), and what else
    a capture forbids (a copy, an upload, a wait) fails as the driver would fail it."""
    name = "fake"
    capability = (9, 0)
    device_name = "fake GPU"
    graphs = True

    def __init__(self):
        self.blocks: dict[int, np.ndarray] = {}
        self.pending: tuple = ()
        self.uploads = self.allocs = self.launches = self.synchronized = 0
        self.pointers: list[list[int]] = []          # each launch's device pointers
        self.entries: list[str] = []                 # each launch's entry
        self.downloaded: list[np.dtype] = []
        self.uploaded: list[tuple[str, tuple[int, ...]]] = []    # each upload's dtype and shape
        self.fail_launch: str | None = None
        self.fail_alloc_over: int | None = None
        self.never_done = False
        self.recording: list | None = None           # a graph's launches, while capturing
        self.captures = self.replays = 0

    def compile_ptx(self, kernels, matmuls, gathers, target, mmas=(), folds=()):
        self.pending = (list(kernels), matmuls, gathers, mmas, folds)
        return "fake ptx"

    def load(self, ptx):
        kernels, *_, folds = self.pending
        return {"compiled": Compiled(kernels) if kernels else None,
                "kernels": {nvptx.launch(k).entry: k for k in kernels}, "folds": folds}

    def function(self, module, name):
        return module, name

    def alloc(self, nbytes):
        if self.fail_alloc_over is not None and nbytes > self.fail_alloc_over:
            raise cuda.DriverError("cuMemAlloc: out of memory")
        try:
            block = np.empty(nbytes, np.uint8)
        except MemoryError:
            raise cuda.DriverError("cuMemAlloc: out of memory") from None
        self.allocs += 1
        self.blocks[block.ctypes.data] = block
        return block.ctypes.data

    def free(self, ptr):
        del self.blocks[ptr]

    def upload(self, ptr, array):
        self.uncaptured("cuMemcpyHtoD")
        self.uploads += 1
        self.uploaded.append((array.dtype.name, array.shape))
        ctypes.memmove(ptr, array.ctypes.data, array.nbytes)

    def download(self, array, ptr):
        self.uncaptured("cuMemcpyDtoH")
        self.downloaded.append(array.dtype)
        ctypes.memmove(array.ctypes.data, ptr, array.nbytes)

    def copy(self, dst, src, nbytes):
        self.uncaptured("cuMemcpyDtoD")
        ctypes.memmove(dst, src, nbytes)

    def begin_capture(self):
        assert self.recording is None, "a capture inside a capture"
        self.recording = []

    def end_capture(self):
        graph, self.recording = self.recording, None
        self.captures += 1
        return graph

    def replay(self, graph):
        self.uncaptured("cuGraphLaunch")
        self.replays += 1
        for launch in graph:
            self.run(*launch)

    def free_graph(self, graph):
        pass

    def uncaptured(self, call: str) -> None:
        """A call the legacy stream makes, which a capture in progress forbids."""
        if self.recording is not None:
            raise cuda.DriverError(f"{call}: operation not permitted when stream is capturing")

    def launch(self, fn, grid, block, pointers, integers):
        (module, entry) = fn
        if entry == self.fail_launch:
            raise cuda.DriverError("cuLaunchKernel: too many resources requested for launch")
        if block > 1024:
            raise cuda.DriverError("cuLaunchKernel: invalid argument")
        if self.recording is not None:
            self.recording.append((fn, grid, block, list(pointers), list(integers)))
            return
        self.run(fn, grid, block, pointers, integers)

    def run(self, fn, grid, block, pointers, integers):
        """A launch, run now."""
        (module, entry) = fn
        self.launches += 1
        self.entries.append(entry)
        self.pointers.append(list(pointers))
        if entry.startswith("dslc_matmul_"):
            return self.matmul(entry.split("_")[2], grid, pointers, integers)
        prim, _, dtype = entry.removeprefix("dslc_").rpartition("_")
        if prim in ("take", "scatter_add", "concat", "split"):     # the gather kernels' entries
            return self.gather(prim, np_dtype(dtype), pointers, integers)
        if prim in ("argmax", "argmin"):                  # the extreme kernels: NumPy's
            outer, n, inner = integers
            x = device_array(pointers[0], outer * n * inner, np_dtype(dtype)).reshape(outer, n, inner)
            device_array(pointers[1], outer * inner, np.int32)[:] = getattr(np, prim)(x, axis=1).reshape(-1)
            return
        if prim in ("uniform", "bernoulli", "normal", "key_split", "fold_in", "key"):
            return self.draw(prim, dtype, pointers, integers)
        if entry in [f.entry for f in module["folds"]]:     # a persistent kernel: emulated
            from emulator import Emulator
            module.setdefault("emulator", Emulator([], folds=module["folds"]))
            return module["emulator"].launch(entry, grid, block, pointers, integers)
        k = module["kernels"][entry]
        extent = k.extent
        module["compiled"].function(k.name)((ctypes.c_void_p * len(pointers))(*pointers), 0, extent, k.n)

    def matmul(self, dtype, grid, pointers, integers):
        m, n, k, sa, sb, _, batch = integers
        view = lambda ptr, count: device_array(ptr, count, np.float32 if dtype == "f32" else np.float64)
        if k == 0:                                 # the empty sum
            view(pointers[2], batch * m * n)[:] = -0.0
            return
        a = view(pointers[0], (batch if sa else 1) * m * k).reshape(-1, m, k)
        b = view(pointers[1], (batch if sb else 1) * k * n).reshape(-1, k, n)
        assert grid == nvptx.matmul_launch(dtype, batch, m, n).grid
        view(pointers[2], batch * m * n)[:] = Matmul(dtype)(a, b).reshape(-1)

    def gather(self, prim, t, pointers, integers):
        """The gather kernels' contract (backend/nvptx.py), in NumPy: one add at a time."""
        if prim in ("concat", "split"):
            outer, n, size, inner, start = integers
            whole, part = (1, 0) if prim == "concat" else (0, 1)
            slab = device_array(pointers[part], outer * n * inner, t).reshape(outer, n, inner)
            at = device_array(pointers[whole], outer * size * inner, t).reshape(outer, size, inner)[:, start:start + n]
            (at if prim == "concat" else slab)[:] = slab if prim == "concat" else at
            return
        outer, n, size, inner = integers
        x = device_array(pointers[0], outer * size * inner, t).reshape(outer, size, inner)
        if prim == "take":
            rows = device_array(pointers[1], n, np.int64)
            device_array(pointers[2], outer * n * inner, t)[:] = x[:, rows].reshape(-1)
            return
        order, bounds = device_array(pointers[1], n, np.int64), device_array(pointers[2], size + 1, np.int64)
        updates = device_array(pointers[3], outer * n * inner, t).reshape(outer, n, inner)
        out = device_array(pointers[4], outer * size * inner, t).reshape(outer, size, inner)
        out[:] = x
        for r in range(size):
            for s in order[bounds[r]:bounds[r + 1]]:
                out[:, r] += updates[:, s]

    def draw(self, prim, dtype, pointers, integers):
        """The draw and key kernels' contract (backend/nvptx.py): the interpreter's draw of n
        elements (of n keys, for split)."""
        if prim == "key":
            device_array(pointers[0], 2, np.uint32)[:] = Key().evaluate(integers[1] | integers[2] << 32)
            return
        key, n, t = device_array(pointers[0], 2, np.uint32), integers[0], np_dtype(dtype)
        if prim == "key_split":
            device_array(pointers[1], 2 * n, np.uint32)[:] = np.concatenate(KeySplit().evaluate(key, n))
            return
        if prim == "fold_in":
            device_array(pointers[2], 2, np.uint32)[:] = FoldIn().evaluate(key, device_array(pointers[1], 1, t)[0])
            return
        if prim == "normal":
            device_array(pointers[1], n, t)[:] = Normal().evaluate(key, (n,), dtype)
            return
        if prim == "bernoulli":
            p = device_array(pointers[1], 1, t)[0]
            device_array(pointers[2], n, np.bool_)[:] = Bernoulli().evaluate(key, p, (n,))
            return
        low, high = (np.array(i, np.int64 if dtype == "f64" else np.int32).view(t) for i in integers[1:3])
        device_array(pointers[1], n, t)[:] = Uniform().evaluate(key, (n,), low, high, dtype)

    def synchronize(self):
        self.uncaptured("cuCtxSynchronize")
        self.synchronized += 1

    def record(self):
        self.uncaptured("cuEventRecord")
        return object()

    def done(self, event):
        return not self.never_done


class EmulatedDriver(FakeDriver):
    """The fake driver launching the GPU kernels themselves, their IR run on the host by
    tests/gpu/emulator.py: the runtime's launch shapes and arguments meet the real kernels."""

    def load(self, ptx):
        from emulator import Emulator
        return {"emulator": Emulator(*self.pending)}

    def run(self, fn, grid, block, pointers, integers):
        (module, entry) = fn
        self.launches += 1
        self.entries.append(entry)
        if not entry.startswith("dslc_matmul_"):
            grid = (min(grid[0], 2), 1, 1)          # a loop kernel's grid-stride loop covers the rest
        module["emulator"].launch(entry, grid, block, pointers, integers)


def device_array(ptr: int, count: int, dtype) -> np.ndarray:
    """The fake device memory at ptr as a NumPy array of count elements."""
    nbytes = count * np.dtype(dtype).itemsize
    return np.ctypeslib.as_array((ctypes.c_byte * nbytes).from_address(ptr)).view(dtype) if nbytes else \
        np.empty(0, dtype)


def install(monkeypatch, drv):
    monkeypatch.setattr(cuda, "driver", lambda: drv)
    monkeypatch.setattr(cuda, "compile_ptx", drv.compile_ptx)
    monkeypatch.delenv("DSLC_DEVICE", raising=False)
    return drv


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver())


@pytest.fixture
def emulated(monkeypatch):
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    return install(monkeypatch, EmulatedDriver())


def bits(x) -> np.ndarray:
    a = np.asarray(x)
    return a.reshape(-1).view(np.uint8) if a.dtype.kind in "fiub" else a


def assert_same(got, want, path="result"):
    """Equal structure and bit-identical arrays."""
    if isinstance(want, dict):
        assert set(got) == set(want), path
        for k in want:
            assert_same(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{path}[{i}]")
    else:
        g, w = np.asarray(got), np.asarray(want)
        assert g.shape == w.shape and g.dtype == w.dtype, path
        assert np.array_equal(bits(g), bits(w)), f"{path} differs"


# ---------------------------------------------------------------- device selection

def test_auto_falls_back_to_the_cpu_without_a_gpu(monkeypatch):
    monkeypatch.delenv("DSLC_DEVICE", raising=False)
    monkeypatch.setattr(cuda, "usable", lambda: False)
    assert dsl.loads("def f(x: f32[3]) -> f32[3]:\n  return x + 1.0\n").device == "cpu"


def test_auto_picks_the_gpu_where_one_is_usable(fake):
    assert dsl.loads("def f(x: f32[3]) -> f32[3]:\n  return x + 1.0\n").device == "cuda"


def test_dslc_device_overrides_auto(monkeypatch):
    monkeypatch.setenv("DSLC_DEVICE", "reference")
    assert dsl.loads("def f(x: f32[3]) -> f32[3]:\n  return x + 1.0\n").device == "reference"


def test_cuda_without_a_gpu_is_a_clear_error(monkeypatch):
    """Here no loader imports or no driver loads: the error says which and why."""
    monkeypatch.setenv("DSLC_CUDA_LOADER", "")
    cuda.driver.cache_clear()
    try:
        if cuda.usable():
            pytest.skip("this machine has a usable GPU")
        with pytest.raises(DslError, match="device 'cuda' is not usable: .*(pycuda|cuda.bindings)"):
            dsl.loads("def f(x: f32[3]) -> f32[3]:\n  return x + 1.0\n", device="cuda")
    finally:
        cuda.driver.cache_clear()


def test_unknown_loader_is_named(monkeypatch):
    monkeypatch.setenv("DSLC_CUDA_LOADER", "opencl")
    with pytest.raises(DslError, match="unknown loader 'opencl'"):
        cuda._open_driver()


# ---------------------------------------------------------------- the runtime on a fake GPU

CASES = ["mlp", "layer_norm", "attention", "lstm", "conv2d"]


def inputs_of(name: str) -> dict:
    return getattr(programs, ("conv" if name == "conv2d" else name) + "_inputs")(0)


@pytest.mark.parametrize("name", CASES)
def test_programs_and_gradients_match_the_cpu_bit_for_bit(fake, name):
    inputs = inputs_of(name)
    path = str(programs.PROGRAMS / f"{name}.bend")
    gpu, cpu = dsl.load(path, device="cuda"), dsl.load(path, device="cpu")
    first = next(iter(inputs))
    got = gpu.value_and_grad("loss", wrt=first)(**inputs)
    want = cpu.value_and_grad("loss", wrt=first)(**inputs)
    assert isinstance(got[0], cuda.DeviceArray)
    assert_same(got, want)
    assert fake.launches > 0


@pytest.mark.parametrize("name", ["mlp", "layer_norm", "attention"])
def test_the_gpu_kernels_run_by_the_runtime_give_the_cpu_bits(emulated, name):
    """End to end without a GPU: the runtime launching the GPU kernels' own IR (emulated)."""
    inputs = inputs_of(name)
    path = str(programs.PROGRAMS / f"{name}.bend")
    first = next(iter(inputs))
    got = dsl.load(path, device="cuda").value_and_grad("loss", wrt=first)(**inputs)
    want = dsl.load(path, device="cpu").value_and_grad("loss", wrt=first)(**inputs)
    assert_same(got, want)
    assert emulated.launches > 0


STEP = """
def step(w: f32[4, 3], x: f32[5, 4], lr: f32) -> (f32[4, 3], f32):
  def loss(w):
    y = reshape(x @ w, [15])
    return mean(y * y)
  l, g = value_and_grad(loss, wrt=w)(w)
  return w - lr * g, l
"""


def test_results_stay_on_the_device_and_go_back_in_without_a_copy(fake):
    prog = dsl.loads(STEP, device="cuda")
    rng = np.random.default_rng(0)
    w, x = rng.standard_normal((4, 3), np.float32), rng.standard_normal((5, 4), np.float32)
    w1, l1 = prog.step(w, x, np.float32(0.1))
    assert isinstance(w1, cuda.DeviceArray) and w1.shape == (4, 3) and w1.dtype == np.float32
    uploads = fake.uploads
    prog.step(w, x, np.float32(0.1))
    from_host = fake.uploads - uploads
    uploads = fake.uploads
    w2, _ = prog.step(w1, x, np.float32(0.1))
    assert fake.uploads - uploads == from_host - 1          # w1 is already there
    cpu = dsl.loads(STEP, device="cpu")
    c1, cl = cpu.step(w, x, np.float32(0.1))
    c2, _ = cpu.step(c1, x, np.float32(0.1))
    assert_same((w1, l1, w2), (c1, cl, c2))
    assert float(l1) == float(cl) and w2.numpy().shape == (4, 3)


GRAPHED = """
def step(w: f32[4, 3], b: f32[3], x: f32[5, 4], k: Key, lr: f32) -> (f32[4, 3], f32[3], f32, f32[5, 3]):
  def loss(w, b):
    h = tanh(x @ w + b) * cast(bernoulli(k, 0.8, [5, 3]), f32)
    hs = fold r in h with s = b:
      s = s * 0.5 + r
      return s
    return mean(h * h) + sum(hs) * 0.01
  l, g = value_and_grad(loss, wrt=(w, b))(w, b)
  return w - lr * g[0], b - lr * g[1], l, concat([x[:, :3], normal(k, [5, 1])], axis=1) @ w
"""


def test_a_cuda_graphs_replays_give_the_bits_of_plain_runs(fake, monkeypatch):
    """A training step (products, a persistent fold and its reverse, draws, a concat) is
    captured once, at its second call, and replayed after: each call's results are those of
    a plain walk of the plan and the CPU's, and a replay's results outlive the next one.
    (The kernels are the fake driver's; the emulated ones give the CPU's bits elsewhere.)"""
    rng = np.random.default_rng(0)
    calls = [[rng.standard_normal(s).astype(np.float32) for s in ((4, 3), (3,), (5, 4))] +
             [dsl.key(i), np.float32(0.1)] for i in range(3)]
    prog = dsl.loads(GRAPHED, device="cuda")
    got = [prog.step(*args) for args in calls]
    assert (fake.captures, fake.replays) == (1, 2)
    monkeypatch.setenv("DSLC_CUDA_GRAPHS", "0")
    plain, cpu = dsl.loads(GRAPHED, device="cuda"), dsl.loads(GRAPHED, device="cpu")
    for args, g in zip(calls, got):
        assert_same(g, plain.step(*args))
        assert_same(g, cpu.step(*args))
    assert (fake.captures, fake.replays) == (1, 2)
    w, b = got[1][:2]                     # parameters going back in: copied into the graph's inputs
    assert_same(prog.step(w, b, *calls[2][2:]), cpu.step(w.numpy(), b.numpy(), *calls[2][2:]))


def test_a_capture_makes_no_call_a_capture_forbids(fake):
    """The fake driver fails an upload, a download, a copy or a wait while capturing, as
    CUDA does: the capture of a step with a gather (whose indices come to the host) is not
    attempted, and the plan is walked at every call."""
    src = "def f(E: f32[9, 4], i: i32[3]) -> f32[3, 4]:\n  return tanh(E[i]) * 2.0 + sum(E)\n"
    prog = dsl.loads(src, device="cuda")
    for _ in range(3):
        prog.f(np.ones((9, 4), np.float32), np.arange(3, dtype=np.int32))
    assert fake.captures == 0
    fake.begin_capture()
    with pytest.raises(cuda.DriverError, match="not permitted when stream is capturing"):
        fake.upload(0, np.zeros(1))


@pytest.mark.parametrize("graphs", ["1", "0"])
def test_buffers_are_reused_across_calls(fake, monkeypatch, graphs):
    """After the first call (and the second, which may capture a CUDA graph and the buffers
    it keeps), a call allocates nothing."""
    monkeypatch.setenv("DSLC_CUDA_GRAPHS", graphs)
    prog = dsl.loads(STEP, device="cuda")
    w, x = np.ones((4, 3), np.float32), np.ones((5, 4), np.float32)
    for _ in range(2):
        prog.step(w, x, np.float32(0.1))
    allocs = fake.allocs
    for _ in range(3):
        prog.step(w, x, np.float32(0.1))
    assert fake.allocs == allocs


@pytest.mark.parametrize("a_shape, b_shape", [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)),
                                              ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)),
                                              ((2, 1, 3, 4), (1, 2, 4, 5)), ((2, 3, 0), (2, 0, 5))])
def test_contraction_batch_and_vector_shapes(fake, a_shape, b_shape):
    src = f"def f(a: f32{list(a_shape)}, b: f32{list(b_shape)}):\n  return a @ b\n"
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(a_shape, np.float32), rng.standard_normal(b_shape, np.float32)
    got = np.asarray(dsl.loads(src, device="cuda").f(a, b))
    want = np.asarray(dsl.loads(src, device="cpu").f(a, b))
    assert_same(got, want)
    assert got.shape == np.matmul(a, b).shape
    if a.size and b.size:
        np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-5, atol=1e-5)



EPILOGUES = """
def mlp(x: f32[70, 16], W: f32[16, 24], b: f32[24]) -> f32[70, 24]:
  h = x @ W + b
  return 0.5 * h * (1.0 + tanh(0.7978845608028654 * (h + 0.044715 * h * h * h)))

def normed(x: f32[2, 35, 16], W: f32[16, 24], r: f32[2, 35, 24]) -> f32[2, 35, 24]:
  y = r + x @ W
  m = mean(y, axis=-1, keepdims=True)
  return (y - m) * rsqrt(mean((y - m) * (y - m), axis=-1, keepdims=True) + 1e-5)
"""


@pytest.mark.parametrize("driver", ["fake", "emulated"])
@pytest.mark.parametrize("name, shapes", [("mlp", [(70, 16), (16, 24), (24,)]),
                                          ("normed", [(2, 35, 16), (16, 24), (2, 35, 24)])])
def test_a_contractions_epilogue_runs_after_it_as_a_kernel(request, driver, name, shapes):
    drv = request.getfixturevalue(driver)
    rng = np.random.default_rng(2)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    gpu = dsl.loads(EPILOGUES, device="cuda")
    got = getattr(gpu, name)(*args)
    assert_same(got, getattr(dsl.loads(EPILOGUES, device="cpu"), name)(*args))
    assert drv.launches == 2                        # the product, then its epilogue

def test_a_failing_launch_names_the_kernel(fake):
    prog = dsl.loads("def f(x: f32[8]) -> f32[8]:\n  return exp(x) * 2.0\n", device="cuda")
    fake.fail_launch = "f_0_gpu"
    with pytest.raises(DslError, match="GPU kernel f_0_gpu failed to launch: .*too many resources"):
        prog.f(np.ones(8, np.float32))


def test_a_failing_allocation_is_a_dsl_error(fake):
    prog = dsl.loads("def f(x: f32[1000]) -> f32[1000]:\n  return exp(x)\n", device="cuda")
    fake.fail_alloc_over = 1000
    with pytest.raises(DslError, match="cannot allocate 4000 bytes for .*f_0_gpu|an input"):
        prog.f(np.ones(1000, np.float32))


def test_a_gpu_that_never_finishes_times_out_instead_of_hanging(fake, monkeypatch):
    monkeypatch.setenv("DSLC_CUDA_TIMEOUT", "0.05")
    prog = dsl.loads("def f(x: f32[8]) -> f32[8]:\n  return exp(x)\n", device="cuda")
    fake.never_done = True
    with pytest.raises(DslError, match="did not finish kernel f_0_gpu within 0.05 s"):
        prog.f(np.ones(8, np.float32))


def test_transposes_broadcasts_and_slices_run_as_kernels_without_copies_to_the_host(fake):
    src = ("def f(x: f32[2, 3, 4], b: f32[3, 1]) -> (f32[4, 2, 3], f32[2, 3, 5], bool[1, 3], f32[2, 4], f32[1, 3, 4]):\n"
           "  return transpose(x, [2, 0, 1]), broadcast_to(b, [2, 3, 5]), transpose(b > 0.0), x[:, 1], x[1:2]\n")
    prog = dsl.loads(src, device="cuda")
    rng = np.random.default_rng(2)
    x, b = rng.standard_normal((2, 3, 4), np.float32), rng.standard_normal((3, 1), np.float32)
    prog.f(x, b)
    uploads = fake.uploads
    got = prog.f(x, b)
    assert fake.uploads - uploads == 2   # the inputs only: nothing went to the host and back
    assert_same(got, dsl.loads(src, device="reference").f(x, b))


GATHERS = """
def f(E: f64[7, 3], x: f32[2, 5, 4], i: i32[6], j: i64[3, 2], u: f32[2, 3, 2, 4], m: bool[5, 2]
      ) -> (f64[6, 3], f32[2, 3, 2, 4], f32[2, 5, 4], bool[3, 2, 2]):
  return E[i], take(x, j, axis=1), scatter_add(x, j, u, axis=-2), take(m, j)

def loss(E: f32[9, 4], idx: i32[3, 5]) -> f32:
  h = E[idx]
  return sum(h * h * h)

def ints(x: i32[5, 3], i: i32[4], u: i32[4, 3]) -> i32[5, 3]:
  return scatter_add(x, i, u)

def rows(x: f32[5, 3], i: i32[4], u: f32[4, 3]) -> f32[5, 3]:
  return scatter_add(x, i, u)

def none(x: f32[0, 3], i: i32[2]) -> f32[2, 3]:
  return x[i]
"""


def gather_args(rng) -> list[np.ndarray]:
    """f's arguments: repeated and negative indices, a row no index names."""
    return [rng.standard_normal((7, 3)), rng.standard_normal((2, 5, 4)).astype(np.float32),
            np.array([0, 6, -1, 3, 3, -7], np.int32), np.array([[1, -1], [1, 4], [-1, 1]], np.int64),
            rng.standard_normal((2, 3, 2, 4)).astype(np.float32), rng.random((5, 2)) < 0.5]


@pytest.mark.parametrize("driver", ["fake", "emulated"])
def test_gathers_and_scatters_run_on_the_gpu_and_only_indices_come_back(request, driver):
    drv = request.getfixturevalue(driver)
    rng = np.random.default_rng(3)
    args = gather_args(rng)
    gpu, cpu = dsl.loads(GATHERS, device="cuda"), dsl.loads(GATHERS, device="cpu")
    E, idx = rng.standard_normal((9, 4)).astype(np.float32), rng.integers(-9, 9, (3, 5)).astype(np.int32)
    for call, inputs in ((gpu.f, args), (gpu.value_and_grad("loss", wrt="E"), (E, idx))):
        drv.downloaded.clear()
        got = call(*inputs)
        assert drv.downloaded and all(t.kind == "i" for t in drv.downloaded), "float data came to the host"
        assert all(isinstance(r, cuda.DeviceArray) for r in got)
    assert_same(got, cpu.value_and_grad("loss", wrt="E")(E, idx))
    assert_same(gpu.f(*args), cpu.f(*args))


def test_a_scatter_add_of_integers_stays_a_host_step(fake):
    x, i, u = np.arange(15, dtype=np.int32).reshape(5, 3), np.array([1, 1, -1, 0], np.int32), \
        np.ones((4, 3), np.int32)
    got = dsl.loads(GATHERS, device="cuda").ints(x, i, u)
    assert fake.launches == 0
    assert_same(got, dsl.loads(GATHERS, device="cpu").ints(x, i, u))


def errors(name: str, args: list) -> list[str]:
    """The messages of the errors GATHERS's `name` raises on the GPU and on the CPU."""
    messages = []
    for device in ("cuda", "cpu"):
        with pytest.raises(DslError) as e:
            getattr(dsl.loads(GATHERS, device=device), name)(*args)
        messages.append(str(e.value))
    return messages


@pytest.mark.parametrize("name, position, bad", [("f", 2, 7), ("f", 2, -8), ("f", 3, 5), ("f", 3, -6),
                                                 ("rows", 1, 5), ("rows", 1, -6)])
def test_an_index_out_of_range_is_the_cpus_error(fake, name, position, bad):
    """E[i] with i outside [-7, 7), take(x, j, axis=1) with j outside [-5, 5), scatter_add
    with i outside [-5, 5): the first bad index, in the interpreter's (the CPU's) words."""
    rng = np.random.default_rng(4)
    args = gather_args(rng) if name == "f" else \
        [np.ones((5, 3), np.float32), np.array([0, 1, 2, 3], np.int32), np.ones((4, 3), np.float32)]
    args[position].reshape(-1)[1:3] = [bad, 2 * bad]
    messages = errors(name, args)
    prim = "scatter_add" if name == "rows" else "take"
    assert messages[0] == messages[1] and f"'{prim}' failed at run time: index {bad} is out of bounds" in messages[0]


def test_a_take_from_an_empty_axis_is_the_cpus_error(fake):
    messages = errors("none", [np.zeros((0, 3), np.float32), np.zeros(2, np.int32)])
    assert messages[0] == messages[1] and "empty" in messages[0]


# ---------------------------------------------------------------- the cuda.bindings driver


class MockBindings:
    """The part of cuda.bindings.driver the runtime calls, recording each call: every
    function returns (CUresult, *values) as the real module does."""

    class CUresult:
        CUDA_SUCCESS, CUDA_ERROR_NOT_READY, CUDA_ERROR_OUT_OF_MEMORY = 0, 600, 2

    class CUdevice_attribute:
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76

    class CUstreamCaptureMode:
        CU_STREAM_CAPTURE_MODE_RELAXED = 2

    def __init__(self):
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args):
            self.calls.append((name, args))
            return getattr(self, "_" + name, lambda *a: (0,))(*args)
        return call

    def _cuDeviceGetCount(self):
        return 0, 1

    def _cuDeviceGetAttribute(self, attr, dev):
        return 0, 9 if attr == 75 else 0

    def _cuDeviceGetName(self, length, dev):
        return 0, b"Mock H200\0\0"

    def _cuDeviceGet(self, i):
        return 0, "device"

    def _cuDevicePrimaryCtxRetain(self, dev):
        return 0, "context"

    def _cuMemAlloc(self, n):
        return (2, None) if n > 1 << 40 else (0, 0x7000)

    def _cuModuleLoadData(self, image):
        self.ptx = ctypes.string_at(image)
        return 0, "module"

    def _cuModuleGetFunction(self, module, name):
        return 0, ("function", name)

    def _cuEventCreate(self, flags):
        return 0, "event"

    def _cuStreamCreate(self, flags):
        return 0, "stream"

    def _cuStreamEndCapture(self, stream):
        return 0, "graph"

    def _cuGraphInstantiate(self, graph, flags):
        return 0, "graph exec"

    def _cuEventQuery(self, event):
        return (0,)

    def _cuGetErrorString(self, err):
        return 0, b"out of memory"


def bindings_driver() -> tuple[cuda.BindingsDriver, MockBindings]:
    mock = MockBindings()
    drv = cuda.BindingsDriver.__new__(cuda.BindingsDriver)
    drv.cu = mock
    return drv, mock


def test_the_bindings_driver_opens_the_device_and_reads_its_capability(monkeypatch):
    mock = MockBindings()
    package, bindings = type(sys)("cuda"), type(sys)("cuda.bindings")
    package.bindings, bindings.driver = bindings, mock
    for name, module in (("cuda", package), ("cuda.bindings", bindings), ("cuda.bindings.driver", mock)):
        monkeypatch.setitem(sys.modules, name, module)
    drv = cuda.BindingsDriver()
    assert drv.capability == (9, 0) and drv.device_name == "Mock H200" and cuda.arch(drv) == "sm_90"
    assert ("cuCtxSetCurrent", ("context",)) in mock.calls


def test_the_bindings_driver_passes_each_kernel_parameter_by_address():
    drv, mock = bindings_driver()
    seen = {}

    def launch(fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        slots = (ctypes.c_void_p * 4).from_address(params)
        seen["args"] = [ctypes.c_uint64.from_address(slots[i]).value for i in range(2)] + \
                       [ctypes.c_int64.from_address(slots[i]).value for i in range(2, 4)]
        seen["shape"] = (fn, gx, gy, gz, bx, by, bz, shared, stream, extra)
        return (0,)
    mock._cuLaunchKernel = launch
    drv.launch("f", (3, 2, 1), 256, [0x1000, 0x2000], [7, -1])
    assert seen["args"] == [0x1000, 0x2000, 7, -1]
    assert seen["shape"] == ("f", 3, 2, 1, 256, 1, 1, 0, 0, 0)


def test_the_bindings_driver_loads_ptx_null_terminated_and_reports_errors():
    drv, mock = bindings_driver()
    assert drv.function(drv.load(".version 8.0"), "k_gpu") == ("function", b"k_gpu")
    assert mock.ptx == b".version 8.0"                 # string_at stops at the terminator
    assert drv.alloc(64) == 0x7000
    with pytest.raises(cuda.DriverError, match="cuMemAlloc: out of memory"):
        drv.alloc(1 << 41)
    array = np.arange(4, dtype=np.float32)
    drv.upload(0x7000, array)
    assert mock.calls[-1] == ("cuMemcpyHtoD", (0x7000, array.ctypes.data, 16))
    assert drv.done(drv.record())


def test_the_bindings_driver_captures_launches_on_its_own_stream_and_replays_them():
    """CUDA cannot capture the legacy stream: a capture begins on a stream of the driver's
    (relaxed, so that an allocation may happen meanwhile), the launches go there, and the
    graph is instantiated, its template destroyed, and launched on that stream."""
    drv, mock = bindings_driver()
    drv.begin_capture()
    drv.launch("f", (1, 1, 1), 256, [], [])
    graph = drv.end_capture()
    drv.launch("f", (1, 1, 1), 256, [], [])
    drv.replay(graph)
    drv.free_graph(graph)
    assert [(name, args if name != "cuLaunchKernel" else args[8]) for name, args in mock.calls] == [
        ("cuStreamCreate", (0,)), ("cuStreamBeginCapture", ("stream", 2)), ("cuLaunchKernel", "stream"),
        ("cuStreamEndCapture", ("stream",)), ("cuGraphInstantiate", ("graph", 0)), ("cuGraphDestroy", ("graph",)),
        ("cuLaunchKernel", 0), ("cuGraphLaunch", ("graph exec", "stream")), ("cuGraphExecDestroy", ("graph exec",))]


def test_debug_and_assert_finite_on_the_gpu_are_the_cpus(fake, capsys):
    """Effects run on the host on the GPU too: the same lines, the same located error."""
    source = ('def f(x: f32[N]) -> f32[N]:\n  h = debug(x * 2.0, "h")\n'
              '  return assert_finite(log(h), "log h")\n')
    x = np.array([0.5, 2.0, 0.0], np.float32)
    outputs = []
    for device in ("cuda", "cpu"):
        with pytest.raises(DslError) as e:
            dsl.loads(source, name="e.bend", device=device).f(x)
        outputs.append((capsys.readouterr().err, str(e.value)))
    assert outputs[0] == outputs[1]
    assert outputs[0][0] == "e.bend:2:7: h: f32[3] min=0.0 max=4.0 mean=1.6666666 nan=0\n"
    assert outputs[0][1].startswith("e.bend:3:10: error: while running 'f': assert_finite failed")


# ---------------------------------------------------------------- other frameworks' device memory
# The fake driver's device memory is host memory, so a CPU tensor's own DLPack capsule, its
# device retagged kDLCUDA, is what a CUDA producer hands over; and a DeviceArray's capsule,
# retagged kDLCPU, is read by torch itself. What a real GPU adds (torch's CUDA capsules, the
# stream handshake) is tests/gpu/test_gpu.py's.

import gc  # noqa: E402
import weakref  # noqa: E402

import torch  # noqa: E402

from conftest import raises  # noqa: E402

_capsule_pointer = ctypes.pythonapi["PyCapsule_GetPointer"]
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


def retag(capsule, device: tuple[int, int]):
    """The capsule with its DLTensor.device (dlpack.h: after the 8-byte data pointer) replaced."""
    address = _capsule_pointer(capsule, b"dltensor")
    (ctypes.c_int32 * 2).from_address(address + 8)[:] = device
    return capsule


class OnGpu:
    """A CUDA tensor as its framework exports it by DLPack (torch's capsule, retagged)."""

    def __init__(self, tensor: torch.Tensor, device=(2, 0), byte_offset=0):
        self.tensor, self.device, self.streams, self.offset = tensor, device, [], byte_offset

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        capsule = retag(self.tensor.__dlpack__(), self.device)
        address = _capsule_pointer(capsule, b"dltensor")     # data and byte_offset (dlpack.h)
        ctypes.c_uint64.from_address(address).value -= self.offset
        ctypes.c_uint64.from_address(address + 40).value += self.offset
        return capsule


class Interface:
    """A CUDA array exporting only the CUDA array interface (as Numba's do)."""

    def __init__(self, a: np.ndarray, stream=None, strides=None):
        self.a = a
        self.__cuda_array_interface__ = {"shape": a.shape, "typestr": a.dtype.str, "strides": strides,
                                         "data": (a.ctypes.data, False), "version": 3, "stream": stream}


SCALE = "def scale(x: f32[N, M], k: f32) -> f32[N, M]:\n  return x * k\n"


def test_a_dlpack_cuda_tensor_reaches_the_kernel_in_place(fake):
    prog = dsl.loads(SCALE, device="cuda")
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)[1:]
    producer = OnGpu(x, byte_offset=16)              # its start as a base and an offset
    out = prog.scale(producer, np.float32(2.0))
    assert producer.streams == [1]                  # the legacy default stream dslc launches on
    assert fake.pointers[0][0] == x.data_ptr()
    assert fake.uploads == 1                        # k only
    assert out.numpy().tolist() == (x * 2).tolist()


def test_a_bfloat16_cuda_tensor_is_used_in_place_and_its_result_shared_as_bfloat16(fake):
    prog = dsl.loads("def twice(x: bf16[N]) -> bf16[N]:\n  return x + x\n", device="cuda")
    x = torch.tensor([1.5, -2.0, 3.0e38], dtype=torch.bfloat16)
    out = prog.twice(OnGpu(x))
    got = torch.from_dlpack(retag(out.__dlpack__(stream=1), (1, 0)))
    assert got.dtype == torch.bfloat16 and torch.equal(got, x + x)     # 3e38 + 3e38 is inf in bf16


@pytest.mark.parametrize("stream, waits", [(None, 0), (1, 0), (2, 1), (0x7f00, 1)])
def test_a_cuda_array_interface_reaches_the_kernel_in_place(fake, stream, waits):
    prog = dsl.loads(SCALE, device="cuda")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = prog.scale(Interface(x, stream), np.float32(3.0))
    assert fake.pointers[0][0] == x.ctypes.data and fake.uploads == 1
    assert fake.synchronized == waits               # work on another stream is waited for
    assert np.array_equal(out.numpy(), x * 3)


def test_a_cpu_array_is_still_copied_to_the_gpu(fake):
    out = dsl.loads(SCALE, device="cuda").scale(torch.ones(2, 2), 1.0)
    assert fake.uploads == 2 and np.array_equal(out.numpy(), np.ones((2, 2), np.float32))


def test_a_borrowed_tensor_is_given_back_when_dslc_is_done_with_it(fake):
    prog = dsl.loads(SCALE, device="cuda")
    first = prog.scale(np.ones((2, 3), np.float32), 1.0)
    alive = weakref.ref(first)

    class Producer:                                  # first, shared through its own capsule
        __dlpack_device__ = first.__dlpack_device__
        __dlpack__ = first.__dlpack__
    out = prog.scale(Producer(), 2.0)
    assert fake.pointers[-1][0] == first.ptr
    del first, Producer
    prog.scale(np.ones((1, 1), np.float32), 1.0)    # (the program keeps its last inputs)
    gc.collect()
    assert alive() is None and np.array_equal(out.numpy(), np.full((2, 3), 2, np.float32))


@pytest.mark.parametrize("x, message", [
    (OnGpu(torch.zeros(2, 3), (2, 1)), "'x' is in the memory of cuda:1, and dslc runs on cuda:0: "
                                       "copy it there first (.to('cuda:0') in PyTorch)"),
    (OnGpu(torch.zeros(3, 2).T), "'x' is not contiguous (strides of [4, 8] bytes for shape [2, 3]), "
                                 "and dslc uses GPU tensors in place"),
    (Interface(np.zeros((3, 2), np.float32).T, strides=(4, 8)), "'x' is not contiguous"),
    (OnGpu(torch.zeros(2, 3, dtype=torch.bfloat16)), "argument 'x' of 'scale': expected f32[N, M], got bf16[2, 3]"),
    (OnGpu(torch.zeros(2, 3, dtype=torch.int8)), "'x' must be an array of a dslc dtype"),
    (OnGpu(torch.zeros(2, 3, dtype=torch.float64)), "f64[2, 3]"),
])
def test_a_cuda_tensor_that_cannot_be_used_in_place_is_refused(fake, x, message):
    raises(lambda: dsl.loads(SCALE, device="cuda").scale(x, 1.0), message)


def test_a_cuda_tensor_that_requires_grad_is_refused(fake):
    w = OnGpu(torch.zeros(2, 3))
    w.requires_grad = True
    raises(lambda: dsl.loads(SCALE, device="cuda").scale(w, 1.0), "'x' is a tensor that requires grad")


def test_a_cuda_tensor_given_to_a_cpu_program_is_refused():
    raises(lambda: dsl.loads(SCALE, device="cpu").scale(OnGpu(torch.zeros(2, 3)), 1.0),
           "'x' is in the memory of cuda:0", "x.cpu()")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.uint32,
                                   torch.bool, torch.float16])
def test_a_results_capsule_is_its_device_memory(fake, dtype):
    prog = dsl.loads("def f(x: f32[2, 3]) -> f32[2, 3]:\n  return x\n", device="cuda")
    want = torch.arange(6).reshape(2, 3).to(dtype)
    out = cuda.DeviceArray(cuda._Buffer(cuda._memory(fake), 6 * want.element_size(), "a test"),
                           (2, 3), want.numpy().dtype)
    fake.upload(out.ptr, want.numpy())
    assert prog.device == "cuda" and out.__dlpack_device__() == (2, 0)
    got = torch.from_dlpack(retag(out.__dlpack__(stream=1), (1, 0)))   # torch reads our DLTensor
    assert (got.data_ptr(), got.shape, got.stride(), got.dtype) == (out.ptr, (2, 3), (3, 1), dtype)
    assert torch.equal(got, want)
    assert out.__cuda_array_interface__ == {"shape": (2, 3), "typestr": want.numpy().dtype.str,
                                            "data": (out.ptr, False), "strides": None,
                                            "version": 3, "stream": None}


def test_a_result_stays_alive_while_a_consumer_holds_its_capsule(fake):
    prog = dsl.loads(SCALE, device="cuda")
    out = prog.scale(np.ones((2, 3), np.float32), 5.0)
    ptr, alive = out.ptr, weakref.ref(out)
    shared = torch.from_dlpack(retag(out.__dlpack__(), (1, 0)))
    unconsumed = out.__dlpack__()
    del out
    gc.collect()
    assert alive() is not None and ptr not in cuda._memory(fake).free_lists.get(24, [])
    del shared
    gc.collect()
    assert alive() is not None                       # the capsule never consumed holds it too
    del unconsumed
    gc.collect()
    assert alive() is None and ptr in cuda._memory(fake).free_lists[24]


# ---------------------------------------------------------------- the command line on a fake GPU

from conftest import dslc, quick, user_error  # noqa: E402
from dsl import cli, values  # noqa: E402
from dsl.safetensors import read_with_metadata  # noqa: E402

EXAMPLES = ROOT / "examples"


def test_dslc_run_on_the_gpu_writes_the_cpus_bits(fake, tmp_path):
    inputs = programs.mlp_inputs(0)
    np.savez(tmp_path / "in.npz", **{k: a for name, v in inputs.items()
                                     for k, a in values.flatten_python(v, name).items()})
    for device in ("cuda", "cpu"):
        assert cli.main(["run", str(programs.PROGRAMS / "mlp.bend"), "--entry", "loss", "--inputs",
                         str(tmp_path / "in.npz"), "--device", device, "-o", str(tmp_path / f"{device}.npz")]) == 0
    assert fake.launches > 0
    with np.load(tmp_path / "cuda.npz") as got, np.load(tmp_path / "cpu.npz") as want:
        assert_same(dict(got), dict(want))


@pytest.mark.parametrize("example", ["xor", "names_mlp"])
def test_dslc_train_on_the_gpu_writes_the_cpus_checkpoint(fake, tmp_path, capsys, example):
    """Three steps, an evaluation between them and the final report, on the GPU and on the
    CPU: the same weights, optimizer state and losses, bit for bit, in the checkpoint."""
    model = quick(tmp_path, EXAMPLES / f"{example}.bend", eval_every=2, batch_size=16)
    small = ["--dims", "H=16"] if example == "names_mlp" else []
    for device in ("cuda", "cpu"):
        assert cli.main(["train", str(model), "--steps", "3", "--device", device, *small,
                         "--checkpoint-dir", str(tmp_path / device)]) == 0
    reports = capsys.readouterr().out.split(f"trained {model}")
    assert fake.launches > 0 and reports[1].split("  time")[0] == reports[2].split("  time")[0]
    got, got_meta = read_with_metadata(str(tmp_path / "cuda" / "step0000003.safetensors"))
    want, want_meta = read_with_metadata(str(tmp_path / "cpu" / "step0000003.safetensors"))
    assert got_meta == want_meta and list(got) == list(want)
    assert_same(got, want)


def test_training_keeps_parameters_and_optimizer_state_on_the_gpu(fake, tmp_path):
    """After the first step, a step uploads its batch (x, y), its learning rate and the int64
    indices of its gathers only: the parameters and AdamW's state go from step to step as
    DeviceArrays."""
    counts = []
    result = dsl.train(str(quick(tmp_path, EXAMPLES / "names_mlp.bend")), steps=4, device="cuda",
                       checkpoint_dir=None, progress=None, final_eval=False,
                       on_step=lambda t, batch, loss: counts.append(fake.uploads))
    for first, last in zip(counts[1:], counts[2:]):
        step = fake.uploaded[first:last]
        assert step[:3] == [("int32", (64, 3)), ("int32", (64,)), ("float32", ())]
        assert step[3:] and all(dtype == "int64" for dtype, _ in step[3:]), step
    state = {**values.flatten_python(result.params, "p", lambda a: a),
             **values.flatten_python(result.opt_state, "opt", lambda a: a)}
    assert len(state) == 16 and all(isinstance(a, cuda.DeviceArray) for a in state.values())


@pytest.mark.skipif(cuda.usable(), reason="this machine has a usable GPU")
@pytest.mark.parametrize("command", ["run", "train"])
def test_dslc_on_a_missing_gpu_says_what_is_missing(tmp_path, command):
    np.savez(tmp_path / "in.npz", x=np.ones(3, np.float32))
    (tmp_path / "f.bend").write_text("def f(x: f32[N]) -> f32[N]:\n  return exp(x)\n")
    args = (["run", str(tmp_path / "f.bend"), "--entry", "f", "--inputs", str(tmp_path / "in.npz")]
            if command == "run" else ["train", str(EXAMPLES / "xor.bend"), "--checkpoint-dir", ""])
    r = dslc(*args, "--device", "cuda", env={"DSLC_CUDA_LOADER": ""})
    user_error(r, "error: device 'cuda' is not usable: ")
    assert r.stdout == ""
    if "pycuda is not installed; cuda.bindings is not installed" in r.stderr:    # (here, neither is)
        assert r.stderr.endswith(" (pip install cuda-bindings, or 'dslc[cuda]' for pycuda)\n")
