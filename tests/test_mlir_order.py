"""sort, argsort, topk and take_along_axis exported as MLIR (ir/ops/order.py) and run on IREE
give the CPU backend's bits: the stable order, NaN after +inf (first descending and in topk),
-0.0 tied with 0.0, signed and unsigned integers and bools, at lengths 0, 1 and a prime, and
their gradients (a scatter of the cotangent back to where each value came from). So do
products over permuted and collapsed batch axes (linalg.batch_matmul). IREE's CUDA backend compiles the
quick files of tests/test_mlir.py; without a GPU, device="iree-cuda" says it has none."""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import dsl
from conftest import dslc, raises, slow, user_error
from test_mlir import QUICK, exported

pytest.importorskip("iree.compiler", reason="IREE is not installed (pip install 'dslc[iree]')")

SOURCE = """
def orders(x: f32[B, N]) -> (f32[B, N], i32[B, N], f32[B, N], i32[B, N]):
  return sort(x), argsort(x), sort(x, descending=True), argsort(x, descending=True)

def columns(x: f32[N, B]) -> (f32[N, B], i32[N, B]):
  return sort(x, axis=0, descending=True), argsort(x, axis=0)

def best(x: f32[B, N]) -> (f32[B, N], i32[B, N], f32[B, 0], i32[B, 0]):
  v, i = topk(x, N, largest=False)
  none, at = topk(x, 0)
  return v, i, none, at

def three(x: f32[B, N]) -> (f32[B, 3], i32[B, 3], f32[3, N], i32[3, N]):
  v, i = topk(x, 3)
  w, j = topk(x, 3, axis=0, largest=False)
  return v, i, w, j

def integers(n: i32[B, N], u: u32[B, N], m: bool[B, N]) -> (i32[B, N], i32[B, N], u32[B, N], i32[B, N], bool[B, N], i32[B, N]):
  return sort(n), argsort(n, descending=True), sort(u, descending=True), argsort(u), sort(m), argsort(m, descending=True)

def gather(x: f32[B, N], i: i32[1, K], j: i64[B, 1], y: f32[1, N]) -> (f32[B, K], f32[B, 1], f32[B, N]):
  return take_along_axis(x, i, 1), take_along_axis(x, j, -1), take_along_axis(y, argsort(x), 1)

def weighted(x: f32[B, N], w: f32[B, N]) -> f32:
  return sum(sort(x, descending=True) * w) + sum(take_along_axis(x, argsort(w), 1)) + sum(topk(x, 2)[0])
"""

# values with many ties, NaNs, infinities and both zeros
FLOATS = np.array([np.nan, -0.0, 0.0, np.inf, -np.inf, 1.0, 1.0, -1.0, 2.5], np.float32)


@functools.cache
def program(device: str) -> dsl.Program:
    return dsl.loads(SOURCE, device=device)


def agree(entry: str, *arrays: np.ndarray) -> None:
    agree_on(program, entry, *arrays)


def agree_on(source: Callable[[str], dsl.Program], entry: str, *arrays: np.ndarray) -> None:
    """entry of source's program on IREE gives each of the CPU backend's results bit for bit."""
    want = getattr(source("cpu"), entry)(*arrays)
    got = getattr(source("iree"), entry)(*arrays)
    tupled = lambda r: r if isinstance(r, tuple) else (r,)
    for k, (g, w) in enumerate(zip(tupled(got), tupled(want), strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, k
        assert g.tobytes() == w.tobytes(), f"result {k}: {g.tolist()} against {w.tolist()}"


def floats(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).choice(FLOATS, shape)


@pytest.mark.parametrize("n", [0, 1, 7])
def test_sort_argsort_and_topk_give_the_cpu_backends_bits(n: int):
    x = floats((3, n))
    agree("orders", x)
    agree("columns", floats((n, 3), 1))
    agree("best", x)


def test_topk_of_a_prime_length_along_either_axis_and_the_stable_order():
    x = floats((5, 7), 2)
    agree("three", x)
    # a sort that kept equal elements out of input order would differ in argsort's indices
    ties = np.array([[1.0, -0.0, 1.0, 0.0, np.nan, 1.0, np.nan]], np.float32)
    agree("orders", ties)
    assert program("iree").orders(ties)[1].tolist() == [[1, 3, 0, 2, 5, 4, 6]]


def test_integers_unsigned_words_and_bools_sort_by_their_own_order():
    rng = np.random.default_rng(3)
    n = rng.integers(-3, 3, (2, 7)).astype(np.int32)
    u = rng.choice(np.array([0, 1, 2 ** 31, 2 ** 32 - 1, 5], np.uint32), (2, 7))
    agree("integers", n, u, rng.integers(0, 2, (2, 7)).astype(bool))


def test_take_along_axis_broadcasts_and_counts_negative_indices_from_the_end():
    x = floats((3, 7), 4)
    i = np.array([[6, -1, 0, -7, 3]], np.int32)
    agree("gather", x, i, np.array([[2], [-3], [0]], np.int64), floats((1, 7), 5))


def test_the_gradients_of_sort_topk_and_take_along_axis_give_the_cpu_backends_bits():
    """Each cotangent goes back to where its value came from (exact additions)."""
    rng = np.random.default_rng(6)
    x = (rng.integers(-2, 3, (2, 7)) / 2).astype(np.float32)     # ties, -0.0 from -0.0 / 2
    w = rng.standard_normal((2, 7)).astype(np.float32)
    want = program("cpu").grad("weighted", wrt="x")(x, w)
    got = program("iree").grad("weighted", wrt="x")(x, w)
    assert got.tobytes() == want.tobytes(), (got, want)


PRODUCTS = """
def attention(q: f32[B, H, T, D], k: f32[B, H, D, S], kt: f32[B, H, S, D]) -> (f32[B, H, T, S], f32[B, H, T, S]):
  return q @ k, einsum("bhtd,bhsd->bhts", q, kt)

def rows(x: f32[B, T, D], w: f32[D, S], n: i32[B, T, D], m: i32[B, D, S]) -> (f32[B, T, S], i32[B, T, S], f32[B, S, T]):
  return x @ w, n @ m, einsum("btd,ds->bst", x, w)

def scores(q: f32[B, H, T, D], k: f32[B, H, D, S]) -> f32:
  s = q @ k
  return sum(s * s)
"""


@functools.cache
def products(device: str) -> dsl.Program:
    return dsl.loads(PRODUCTS, device=device)


def test_a_batched_product_is_a_batch_matmul_over_permuted_and_collapsed_axes():
    text = products("iree").ir("attention", {"B": 2, "H": 3, "T": 5, "D": 7, "S": 4}, level="mlir")
    assert "tensor.collapse_shape %q [[0, 1], [2], [3]] : tensor<2x3x5x7xf32> into tensor<6x5x7xf32>" in text
    assert "linalg.batch_matmul ins(%lhs, %rhs : tensor<6x5x7xf32>, tensor<6x7x4xf32>)" in text
    assert "tensor.expand_shape %matmul [[0, 1], [2], [3]] output_shape [2, 3, 5, 4]" in text
    assert re.search(r"linalg.transpose ins\(%kt : tensor<2x3x4x7xf32>\) outs\(%\w+ : "
                     r"tensor<2x3x7x4xf32>\) permutation = \[0, 1, 3, 2\]", text)   # sd -> ds
    assert text.count("linalg.batch_matmul") == 2 and "linalg.generic" not in text
    text = products("iree").ir("rows", {"B": 2, "T": 5, "D": 7, "S": 4}, level="mlir")
    assert "linalg.matmul ins(%lhs, %w : tensor<10x7xf32>, tensor<7x4xf32>)" in text
    assert "%einsum = linalg.generic" in text           # bst: not rows then columns


@pytest.mark.parametrize("B, H, T, D, S", [(2, 3, 5, 7, 4), (1, 1, 1, 1, 1), (0, 2, 3, 2, 3),
                                           (2, 1, 3, 0, 2)])
def test_products_over_collapsed_axes_give_the_cpu_backends_bits(B, H, T, D, S):
    """Each element's sum runs over k in order with fused multiply-adds from -0.0, on IREE's
    llvm-cpu as in dslc's kernels: the same bits (an empty sum is -0.0)."""
    rng = np.random.default_rng(7)
    normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    integers = lambda *shape: rng.integers(-9, 9, shape).astype(np.int32)
    q, k = normal(B, H, T, D), normal(B, H, D, S)
    agree_on(products, "attention", q, k, normal(B, H, S, D))
    agree_on(products, "rows", normal(B, T, D), normal(D, S), integers(B, T, D), integers(B, D, S))
    want = products("cpu").grad("scores", wrt=("q", "k"))(q, k)
    got = products("iree").grad("scores", wrt=("q", "k"))(q, k)
    for g, w in zip(got, want, strict=True):           # 2 s @ kᵀ and qᵀ @ 2 s: products alone
        assert g.shape == w.shape and g.tobytes() == w.tobytes()


def gpu_present() -> bool:
    from runtime import iree
    try:
        iree.gpu_target()
    except dsl.DslError:
        return False
    return True


def test_device_iree_cuda_without_a_gpu_is_an_error_that_says_so(tmp_path: Path):
    if gpu_present():
        pytest.skip("a GPU is here")
    raises(lambda: dsl.loads(SOURCE, device="iree-cuda"),
           "IREE's runtime has no device for target cuda here (driver 'cuda': ")
    (tmp_path / "f.bend").write_text(SOURCE)
    np.savez(tmp_path / "in.npz", x=floats((2, 3)))
    user_error(dslc("run", str(tmp_path / "f.bend"), "--entry", "orders", "--inputs",
                    str(tmp_path / "in.npz"), "--device", "iree-cuda"),
               "error: IREE's runtime has no device for target cuda here")


# IREE's CUDA backend takes 15 to 30 s a file here for these, up to minutes for others
CUDA_QUICK = {"attention", "conv2d", "exact_ops", "layer_norm", "random"}


@pytest.mark.parametrize("stem", [pytest.param(s, marks=[] if s in CUDA_QUICK else [slow])
                                  for s in sorted(QUICK)])
def test_the_quick_files_of_test_mlir_compile_for_cuda_sm_80(stem: str):
    """What --device iree-cuda compiles: a file's entries and gradients in one module, by
    IREE's CUDA backend (PTX for sm_80, which runs on every newer GPU)."""
    from ir.mlir import module
    from runtime.iree import compile_mlir, cuda_target
    functions = list(exported(stem)[0].values())
    assert functions and compile_mlir(module(functions), cuda_target("sm_80"))


@pytest.mark.skipif(not gpu_present(), reason="no GPU here: running on IREE's CUDA backend is owed")
def test_device_iree_cuda_sorts_as_the_cpu_backend_does():
    x = floats((3, 7), 8)
    want, got = program("cpu").orders(x), dsl.loads(SOURCE, device="iree-cuda").orders(x)
    for g, w in zip(got, want, strict=True):
        assert g.tobytes() == w.tobytes()
