"""Fast numerics (numerics="fast", --numerics fast) without a GPU: a program's products go to
the tensor-core kernel (backend/tensorcore.py), run by the emulator through the runtime, and
give its results (exact on integer inputs, within docs/numerics.md's bound on random ones);
exact mode keeps its bits, and no compile of one mode serves the other; the CLI's option, on
a fake driver that models the tensor-core kernel in NumPy."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import dsl
from dsl import cli, values
from dsl.safetensors import read_with_metadata
from runtime import cuda

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "gpu"))
from test_cuda import EXAMPLES, EmulatedDriver, FakeDriver, assert_same, device_array, install  # noqa: E402
from test_tensorcore import NUMPY, bound  # noqa: E402

from conftest import dslc, quick  # noqa: E402

PRODUCT = "def f(a: {t}[B, M, K], b: {t}[K, N]) -> {t}[B, M, N]:\n  return a @ b\n"


@pytest.fixture
def emulated(monkeypatch):
    return install(monkeypatch, EmulatedDriver())          # (its entries: each launch run's)


def product_program(dtype: str, device: str = "cuda"):
    return dsl.loads(PRODUCT.format(t=dtype), device=device)


def integers(rng, shape, dtype: str) -> np.ndarray:
    return rng.integers(-3, 4, shape).astype(NUMPY[dtype])


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_fast_products_are_the_tensor_cores_exact_on_integers(emulated, dtype):
    """A batch of two 20 × 24 @ 24 × 12 (B shared, K across two shared tiles): each partial sum
    is a small integer, so the tensor cores' result is the exact product, bit for bit."""
    rng = np.random.default_rng(1)
    a, b = integers(rng, (2, 20, 24), dtype), integers(rng, (24, 12), dtype)
    got = np.asarray(product_program(dtype).compile("f", numerics="fast")(a, b))
    want = (a.astype(np.float64) @ b.astype(np.float64)).astype(NUMPY[dtype])
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    assert emulated.entries == [f"dslc_mma_{dtype}"]


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_fast_products_are_within_the_documented_bound(emulated, dtype):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((1, 20, 40)).astype(NUMPY[dtype])
    b = rng.standard_normal((40, 12)).astype(NUMPY[dtype])
    got = np.asarray(product_program(dtype).compile("f", numerics="fast")(a, b)).astype(np.float64)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert np.all(np.abs(got - exact) <= bound(dtype, a, b[None]))
    if dtype == "f32":                 # TF32 inputs, not the exact kernel's f32 products
        assert np.abs(got - exact).max() > 1e-5


def test_exact_and_fast_compiles_never_serve_each_other(emulated):
    """The same program, input signature and driver in both modes, called in turns: exact
    keeps the CPU's bits, fast its TF32 result, whichever ran first."""
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((1, 20, 24)).astype(np.float32), rng.standard_normal((24, 12)).astype(np.float32)
    prog = product_program("f32")
    exact, fast = prog.compile("f"), prog.compile("f", numerics="fast")
    want_exact = product_program("f32", "cpu").f(a, b)
    want_fast = np.asarray(fast(a, b))
    assert not np.array_equal(want_fast, want_exact)
    for _ in range(2):
        assert_same(np.asarray(exact(a, b)), want_exact)
        assert_same(np.asarray(fast(a, b)), want_fast)
    assert prog.compile("f", numerics="fast") is fast and prog.compile("f") is exact is prog.f


def test_the_ptx_cache_keys_on_the_numerics(monkeypatch, tmp_path):
    """compile_ptx's on-disk cache, for a program whose only product is in bf16 (on the host
    in exact mode, on tensor cores in fast mode), called in turns: each mode's PTX comes
    back as it was stored."""
    monkeypatch.setenv("DSLC_CACHE_DIR", str(tmp_path))
    for _ in range(2):
        exact = cuda.compile_ptx([], (), (), "sm_80")
        fast = cuda.compile_ptx([], (), (), "sm_80", ("bf16",))
        assert ".entry" not in exact
        assert ".entry dslc_mma_bf16(" in fast


@pytest.mark.parametrize("dtype, numerics, entry", [
    ("f32", "exact", "dslc_matmul_f32_small"), ("f32", "fast", "dslc_mma_f32"),
    ("bf16", "fast", "dslc_mma_bf16"), ("f16", "fast", "dslc_mma_f16"),
])
def test_the_manifest_names_each_products_kernel(tmp_path, dtype, numerics, entry):
    manifest = product_program(dtype, "cpu").compile_to("f", "ptx", str(tmp_path), {"B": 2, "M": 20, "K": 24, "N": 12},
                                                        numerics=numerics)
    (step,) = manifest["steps"]
    assert (manifest["numerics"], step["matmul"], step["entry"]) == (numerics, dtype, entry)
    assert manifest["mma_entries"] == ([entry] if numerics == "fast" else [])
    assert f".entry {entry}(" in (tmp_path / "kernels.ptx").read_text()
    assert json.loads((tmp_path / "manifest.json").read_text()) == manifest


def test_exact_mode_runs_bf16_products_on_the_host(tmp_path):
    manifest = product_program("bf16", "cpu").compile_to("f", "ptx", str(tmp_path), {"B": 1, "M": 2, "K": 3, "N": 4})
    assert manifest["steps"] == [{"host": "matmul", "inputs": [0, 1], "outputs": [2]}]
    assert manifest["numerics"] == "exact" and manifest["mma_entries"] == []


def test_fast_numerics_is_exact_off_the_gpu():
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((2, 5, 7)).astype(np.float32), rng.standard_normal((7, 3)).astype(np.float32)
    for device in ("cpu", "reference"):
        prog = product_program("f32", device)
        assert_same(prog.compile("f", numerics="fast")(a, b), prog.f(a, b))


def test_a_program_loaded_fast_compiles_fast():
    prog = dsl.loads(PRODUCT.format(t="f32"), device="cpu", numerics="fast")
    assert prog.numerics == prog.f.numerics == "fast"
    assert prog.compile("f", numerics="exact").numerics == "exact"
    assert repr(prog.f).endswith(" on cpu, fast numerics>")


@pytest.mark.parametrize("numerics", ["quick", None, 1])
def test_bad_numerics_is_a_dsl_error(numerics):
    with pytest.raises(dsl.DslError) as info:
        dsl.loads(PRODUCT.format(t="f32"), device="cpu", numerics=numerics)
    assert str(info.value) == f"error: numerics= is one of exact, fast, got {numerics!r}"


# ---------------------------------------------------------------- the command line


class FakeTensorCores(FakeDriver):
    """The fake driver, with the tensor-core kernel's contract in NumPy: f32 inputs rounded to
    TF32 (to nearest, ties away), the products summed in float64, rounded to f32 and then to
    the result's dtype. It is not the hardware's order: what it tests is the plumbing."""

    def run(self, fn, grid, block, pointers, integers):
        (_, entry) = fn
        if not entry.startswith("dslc_mma_"):
            return super().run(fn, grid, block, pointers, integers)
        self.entries.append(entry)
        dtype = NUMPY[entry.removeprefix("dslc_mma_")]
        m, n, k, sa, sb, _, batch = integers
        a = device_array(pointers[0], (batch if sa else 1) * m * k, dtype).reshape(-1, m, k)
        b = device_array(pointers[1], (batch if sb else 1) * k * n, dtype).reshape(-1, k, n)
        c = tf32(a).astype(np.float64) @ tf32(b).astype(np.float64)
        device_array(pointers[2], batch * m * n, dtype)[:] = c.astype(np.float32).astype(dtype).reshape(-1)


def tf32(x: np.ndarray) -> np.ndarray:
    if x.dtype != np.float32:
        return x
    bits = x.view(np.uint32)
    return np.where(np.isfinite(x), ((bits + 0x1000) & 0xFFFFE000).astype(np.uint32), bits).view(np.float32)


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeTensorCores())


def test_dslc_run_with_fast_numerics_uses_the_tensor_cores(fake, tmp_path):
    rng = np.random.default_rng(5)
    (tmp_path / "f.bend").write_text(PRODUCT.format(t="f16"))
    a, b = integers(rng, (1, 20, 24), "f16"), integers(rng, (24, 12), "f16")
    np.savez(tmp_path / "in.npz", a=a, b=b)
    for numerics in ("exact", "fast"):
        assert cli.main(["run", str(tmp_path / "f.bend"), "--entry", "f", "--inputs", str(tmp_path / "in.npz"),
                         "--device", "cuda", "--numerics", numerics, "-o", str(tmp_path / f"{numerics}.npz")]) == 0
    assert fake.entries == ["dslc_mma_f16"]                # exact: f16 products on the host
    want = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float16)
    for numerics in ("exact", "fast"):
        with np.load(tmp_path / f"{numerics}.npz") as got:
            assert got["out"].tobytes() == want.tobytes()


def test_dslc_train_with_fast_numerics_runs_its_products_on_tensor_cores(fake, tmp_path, capsys):
    """xor's three steps in fast numerics: every product and its gradients on the tensor
    cores, its loss near exact mode's (TF32), its parameters on the device."""
    model = quick(tmp_path, EXAMPLES / "xor.bend", eval_every=2, batch_size=16)
    products = {}
    for numerics in ("fast", "exact"):
        fake.entries = []
        assert cli.main(["train", str(model), "--steps", "3", "--device", "cuda", "--numerics", numerics,
                         "--checkpoint-dir", str(tmp_path / numerics)]) == 0
        products[numerics] = {e for e in fake.entries if e.startswith(("dslc_mma", "dslc_matmul"))}
    assert products == {"fast": {"dslc_mma_f32"}, "exact": {"dslc_matmul_f32_small"}}
    got, _ = read_with_metadata(str(tmp_path / "fast" / "step0000003.safetensors"))
    want, _ = read_with_metadata(str(tmp_path / "exact" / "step0000003.safetensors"))
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-2, atol=1e-3, err_msg=name)
    assert not np.array_equal(got["loss"], want["loss"])


@pytest.mark.parametrize("args", [
    ["run", "f.bend", "--entry", "f", "--inputs", "in.npz"],
    ["train", "xor.bend"],
    ["compile", "f.bend", "--entry", "f", "--dims", "B=1", "-o", "out"],
    ["ir", "f.bend", "--entry", "f", "--dims", "B=1", "--level", "ptx"],
])
def test_a_bad_numerics_is_a_usage_error(args):
    r = dslc(*args, "--numerics", "quick")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "argument --numerics: invalid choice: 'quick' (choose from" in r.stderr
    assert "exact" in r.stderr and "fast" in r.stderr
