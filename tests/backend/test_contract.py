"""The compiled matmul kernel (backend/contract.py) computes the bits of the reference
contraction (ir.numerics.contract) for every shape, with special values, at every thread count.

float64 caveat: the reference rounds a*b + acc twice, the kernel's fma once. f64 inputs whose
products are exact make the two agree, so those are compared with the reference bit for bit;
general f64 inputs are compared with an exact fma written with fractions."""
from __future__ import annotations

import ctypes
import itertools
import dataclasses
import math
import mmap
import threading
import time
from fractions import Fraction

import numpy as np
import pytest

from backend.contract import (JOBS_PER_THREAD, NUMPY, PARTS, SIZE, Matmul, Tiles, host_tiles,
                              llvm_ir, numpy_layout_holds)
from conftest import isolated
from ir.ops import REGISTRY

rng = np.random.default_rng(2024)
HOST = {dtype: host_tiles(dtype) for dtype in ("f32", "f64")}


def small_tiles(dtype: str, in_place: bool = False) -> Tiles:
    """Tiny blocks, so that small shapes cross every block and tile edge many times; B and A
    packed, or read in place wherever their rows are contiguous."""
    width, everywhere = HOST[dtype].width, 1 << 30
    return Tiles(mr=3, nv=2, width=width, kc=5, mc=6, nc=4 * width,
                 in_place_bytes=everywhere if in_place else 0,
                 in_place_rows=everywhere if in_place else 0, in_place_row_bytes=everywhere,
                 in_place_a_columns=everywhere if in_place else 0)


TILES = {"host": HOST.get, "small": small_tiles,
         "small, in place": lambda dtype: small_tiles(dtype, in_place=True)}


@pytest.fixture(scope="module", params=list(TILES))
def kernels(request):
    return {dtype: Matmul(dtype, TILES[request.param](dtype)) for dtype in ("f32", "f64")}


def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):                     # inf and NaN are what some tests want
        return REGISTRY["matmul"].evaluate(a, b)


def bits(x: np.ndarray) -> bytes:
    """The bytes of x with every NaN made the default one: the payload and sign of a NaN depend
    on which fma operand the instruction takes it from, which the definition leaves open."""
    return np.where(np.isnan(x), np.array(np.nan, dtype=x.dtype), x).tobytes()


def per_thread(kernel: Matmul, a: np.ndarray, b: np.ndarray, threads: int,
               concurrent: bool, next_job: np.ndarray | None = None) -> np.ndarray:
    """a @ b by calling the kernel once per thread index, all sharing one job counter (a fresh
    one, or `next_job`, which then shows how far the calls took it): from Python threads, or
    one after another (the last index first: it takes every job, in its own part of the
    scratch)."""
    a3, b3 = (x.reshape((math.prod(x.shape[:-2]),) + x.shape[-2:]) for x in (a, b))
    c = np.full((max(len(a3), len(b3)), a.shape[-2], b.shape[-1]), np.nan, dtype=a.dtype)
    scratch = np.empty(kernel.tiles.scratch_size(threads), a.dtype)
    next_job = np.zeros(1, dtype=np.int64) if next_job is None else next_job
    calls = [lambda t=t: kernel.call(a3, b3, c, scratch, next_job, t, threads)
             for t in range(threads)]
    if concurrent:
        workers = [threading.Thread(target=call) for call in calls]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    else:
        for call in reversed(calls):
            call()
    return c.reshape(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + c.shape[1:])


def check_threads(kernel: Matmul, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The result with 1 thread, after checking that 2 and 3 threads (in order and concurrent)
    give the same bits, NaNs included."""
    one = kernel(a, b, threads=1)
    for threads in (2, 3):
        for concurrent in (False, True):
            got = per_thread(kernel, a, b, threads, concurrent)
            assert got.tobytes() == one.tobytes(), f"{threads} threads, concurrent={concurrent}"
    return one


def shapes(t: Tiles) -> list[tuple[int, ...]]:
    """(M, N, K) or (batch, M, N, K): degenerate, prime, tile and block edges, tall, wide."""
    return [
        (1, 1, 1), (7, 13, 29), (2, 3, 1), (1, 1, 1024), (5, 3, 1024),
        (t.mr, t.nr, t.kc), (t.mr + 1, t.nr + 1, t.kc + 1), (t.mr - 1, t.nr - 1, t.kc - 1),
        (2 * t.mr, 3 * t.nr, 2 * t.kc), (t.mc + 1, t.nc + 1, 3),
        (300, 1, 17), (1, 300, 17), (257, 2, 33), (2, 257, 33),
        (4, 7, 5, 6), (3, 1, 1, 9), (9, t.mr + 2, t.nr + 3, t.kc + 4),
        # either side of where B starts to be packed: the rows of a job, how far apart B's are
        (min(HOST["f32"].in_place_rows, 64), 500, t.kc + 7),
        (min(HOST["f32"].in_place_rows + 1, 65), 500, 40),
        (7, HOST["f32"].in_place_row_bytes // 4, 20), (7, HOST["f32"].in_place_row_bytes // 4 + 1, 20),
    ]


def random_f32(shape: tuple[int, ...]) -> np.ndarray:
    scale = 2.0 ** rng.integers(-8, 9, shape)
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def operands(shape: tuple[int, ...], make) -> tuple[np.ndarray, np.ndarray]:
    *batch, m, n, k = shape
    return make((*batch, m, k)), make((*batch, k, n))


@pytest.mark.parametrize("index", range(len(shapes(HOST["f32"]))))
def test_f32_matches_the_reference_bit_for_bit(kernels, index):
    kernel = kernels["f32"]
    a, b = operands(shapes(kernel.tiles)[index], random_f32)
    assert bits(check_threads(kernel, a, b)) == bits(reference(a, b))


SPECIAL = {
    "f32": [np.inf, -np.inf, np.nan, -0.0, 0.0, 1e-45, -1e-45, 1.2e-38, -3e-39, 3.4e38, -3.4e38,
            1e-20, 1e20],
    "f64": [np.inf, -np.inf, np.nan, -0.0, 0.0, 5e-324, -5e-324, 2.2e-308, -1e-310, 1.7e308,
            -1.7e308, 1e-160, 1e160],
}


def with_specials(x: np.ndarray, dtype: str, fraction: float) -> np.ndarray:
    """x with about `fraction` of its entries replaced by inf, NaN, ±0, subnormals, huge and
    tiny values (whose products overflow or underflow)."""
    x = x.copy()
    hit = rng.random(x.shape) < fraction
    x[hit] = rng.choice(np.array(SPECIAL[dtype], dtype=x.dtype), hit.sum())
    return x


@pytest.mark.parametrize("shape", [(5, 7, 9), (13, 33, 40), (2, 40, 17, 11)])
@pytest.mark.parametrize("fraction", [0.02, 0.3])
def test_f32_special_values(kernels, shape, fraction):
    kernel = kernels["f32"]
    a, b = (with_specials(x, "f32", fraction) for x in operands(shape, random_f32))
    assert bits(check_threads(kernel, a, b)) == bits(reference(a, b))


def test_f32_sign_of_zero_sums(kernels):
    """-0.0 is the start of every sum: products of -0.0 keep it, one +0.0 product loses it."""
    kernel = kernels["f32"]
    a = np.array([[-0.0, 0.0, -0.0], [0.0, 0.0, 0.0]], dtype=np.float32)
    b = np.array([[1.0, -1.0], [-1.0, 1.0], [1.0, -1.0]], dtype=np.float32)
    got = check_threads(kernel, a, b)
    assert got.tobytes() == reference(a, b).tobytes()
    assert np.signbit(kernel(np.zeros((2, 0), np.float32), np.zeros((0, 3), np.float32))).all()


@pytest.mark.parametrize("m, k, n", [(1, 21, 40), (5, 7, 33), (6, 40, 17), (2, 16, 3),
                                     (3, 600, 700), (4, 9, 1100)])
def test_few_rows_read_b_in_place_with_the_reference_bits(kernels, m, k, n):
    """At most mr rows read B in place, by rows where they are contiguous (streamed for one
    row, by the tiles for more, B's rows near or far apart, K in one block or more) and by
    transposed blocks of columns where B is transposed: K tails, special values, and sums of
    -0.0 products that a k past the end (a +0.0) would turn into +0.0."""
    kernel = kernels["f32"]
    a = with_specials(random_f32((m, k)), "f32", 0.1)
    b_t = with_specials(random_f32((n, k)), "f32", 0.1)
    for b in (np.ascontiguousarray(b_t.T), b_t.T):
        assert bits(check_threads(kernel, a, b)) == bits(reference(a, np.ascontiguousarray(b)))
    minus_zero = np.full((n, k), -0.0, np.float32)
    for b in (np.ascontiguousarray(minus_zero.T), minus_zero.T):
        assert np.signbit(check_threads(kernel, np.ones((m, k), np.float32), b)).all()


@pytest.mark.parametrize("m, k", [(2, 1), (7, 3), (130, 1000), (300, 17)])
def test_a_product_of_one_column_has_the_reference_bits(kernels, m, k):
    """A matrix times a vector, computed as the transposed product of one row: the same bits
    with A's rows or its columns contiguous, the vector's elements next to each other or
    not, in a batch, and with special values."""
    kernel = kernels["f32"]
    a = with_specials(random_f32((2, m, k)), "f32", 0.1)
    b = with_specials(random_f32((2, 2 * k, 1)), "f32", 0.1)[:, ::2]
    a_columns = np.ascontiguousarray(a.transpose(0, 2, 1)).transpose(0, 2, 1)
    for a_, b_ in itertools.product((a, a_columns), (b, np.ascontiguousarray(b))):
        assert bits(check_threads(kernel, a_, b_)) == bits(reference(a, b))
        assert bits(check_threads(kernel, a_[0], b_[0])) == bits(reference(a[0], b[0]))


def test_a_b_of_one_row_broadcast_is_packed_again_for_each_k_block(kernels):
    """Its K blocks share one address (a row stride of 0), not their length: the last one,
    shorter, is packed anew, not read from a panel of the length before."""
    kernel = kernels["f32"]
    k = 2 * kernel.tiles.kc + 3
    a, row = random_f32((50, k)), random_f32((37,))
    b = np.broadcast_to(row, (k, 37))
    assert b.strides[0] == 0
    assert bits(check_threads(kernel, a, b)) == bits(reference(a, np.ascontiguousarray(b)))


def short_f64(shape: tuple[int, ...]) -> np.ndarray:
    """f64 values of at most 21 significant bits: their products are exact, so fma and the
    reference's rounded a*b + acc agree."""
    return rng.integers(-2 ** 20, 2 ** 20, shape) * 2.0 ** rng.integers(-60, 40, shape)


@pytest.mark.parametrize("index", range(len(shapes(HOST["f32"]))))
def test_f64_matches_the_reference_where_products_are_exact(kernels, index):
    kernel = kernels["f64"]
    a, b = operands(shapes(kernel.tiles)[index], short_f64)
    assert bits(check_threads(kernel, a, b)) == bits(reference(a, b))


def exact_fma(a: float, b: float, c: float) -> float:
    """a * b + c rounded once (to nearest even), IEEE 754 special cases included."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return a * b + c                 # the product is inf or NaN, exactly
    if not math.isfinite(c):
        return c                         # inf or NaN plus a finite product
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:
        product_sign = math.copysign(1.0, a) * math.copysign(1.0, b)
        both_negative_zeros = (a == 0 or b == 0) and c == 0 and product_sign < 0 \
            and math.copysign(1.0, c) < 0
        return -0.0 if both_negative_zeros else 0.0
    try:
        return exact.numerator / exact.denominator
    except OverflowError:
        return -math.inf if exact < 0 else math.inf


def exact_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """acc = exact_fma(a[…, i, k], b[…, k, j], acc) for k = 0, 1, …, one element at a time."""
    out = np.empty(a.shape[:-1] + b.shape[-1:])
    for index in np.ndindex(out.shape):
        *batch, i, j = index
        acc = -0.0
        for k in range(a.shape[-1]):
            acc = exact_fma(float(a[(*batch, i, k)]), float(b[(*batch, k, j)]), acc)
        out[index] = acc
    return out


def test_exact_fma_is_an_fma():
    """fma(a, b, -fl(a·b)) is the rounding error of the product, which Dekker's two-product
    finds by another road; and the single rounding is visible where two would lose it."""
    a, b = rng.standard_normal(500) * 1e3, rng.standard_normal(500) * 1e-3
    p = a * b
    def split(x):                                       # Veltkamp: x = hi + lo, 26 bits each
        hi = x * 134217729.0 - (x * 134217729.0 - x)
        return hi, x - hi

    (ah, al), (bh, bl) = split(a), split(b)
    error = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    got = np.array([exact_fma(x, y, -z) for x, y, z in zip(a.tolist(), b.tolist(), p.tolist())])
    assert got.tobytes() == error.tobytes()
    x = 1 + 2.0 ** -52
    assert x * x - x * x == 0.0 and exact_fma(x, x, -(x * x)) == 2.0 ** -104


@pytest.mark.parametrize("shape", [(5, 7, 9), (11, 19, 23), (2, 9, 17, 12), (3, 2, 40)])
@pytest.mark.parametrize("fraction", [0.0, 0.05, 0.3])
def test_f64_is_an_exact_fma_chain(kernels, shape, fraction):
    kernel = kernels["f64"]
    a, b = operands(shape, lambda s: rng.standard_normal(s) * 2.0 ** rng.integers(-30, 31, s))
    a, b = with_specials(a, "f64", fraction), with_specials(b, "f64", fraction)
    assert bits(check_threads(kernel, a, b)) == bits(exact_matmul(a, b))


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_broadcast_batch_and_large_k(kernels, dtype):
    """A batch stride of 0 reuses one operand for every batch entry."""
    kernel = kernels[dtype]
    make = random_f32 if dtype == "f32" else short_f64
    a, b = make((3, 17, 1024)), make((1024, 21))
    got = check_threads(kernel, a, b)
    assert got.shape == (3, 17, 21)
    assert bits(got) == bits(reference(a, b))
    a, b = make((17, 1024)), make((3, 1024, 21))
    assert bits(check_threads(kernel, a, b)) == bits(reference(a, b))


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_empty_shapes(kernels, dtype):
    """An empty sum is -0.0, the start of every sum."""
    kernel = kernels[dtype]
    np_dtype = np.float32 if dtype == "f32" else np.float64
    for m, n, k in [(0, 3, 4), (3, 0, 4), (0, 0, 0), (3, 4, 0)]:
        a, b = np.ones((m, k), np_dtype), np.ones((k, n), np_dtype)
        got = check_threads(kernel, a, b)        # (the reference cannot reshape empty arrays)
        assert bits(got) == bits(np.full((m, n), -0.0, np_dtype))


def test_more_threads_than_work(kernels):
    """Threads beyond the number of jobs have nothing to do and write nothing."""
    kernel = kernels["f32"]
    a, b = random_f32((2, 3)), random_f32((3, 4))
    assert bits(per_thread(kernel, a, b, 7, concurrent=True)) == bits(reference(a, b))


@pytest.mark.parametrize("width, nv", [(4, 2), (8, 2), (8, 3)])
def test_narrower_vectors(width, nv):
    """The tiles of hosts without AVX-512 (4 and 8 lanes) give the same bits."""
    kernel = Matmul("f32", Tiles(mr=6, nv=nv, width=width, kc=64, mc=12, nc=4 * nv * width))
    a, b = operands((2, 29, 3 * nv * width + 5, 150), random_f32)
    assert bits(check_threads(kernel, a, b)) == bits(reference(a, b))
    b_t = np.ascontiguousarray(b.transpose(0, 2, 1)).transpose(0, 2, 1)     # blocks transposed
    assert bits(check_threads(kernel, a, b_t)) == bits(reference(a, b))


def test_no_fast_math_in_the_ir(kernels):
    """No flag lets LLVM reassociate or fuse: the only fmas are the explicit ones."""
    for kernel in kernels.values():
        for part in range(PARTS):
            text = llvm_ir(kernel.dtype, part, kernel.tiles)
            for flag in ("fast", "contract", "reassoc", "afn", "nnan", "ninf", "nsz", "arcp"):
                assert f" {flag} " not in text
            assert "llvm.fma.v" in text


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_transposed_and_sliced_operands_are_read_in_place(kernels, dtype):
    """Operands of any strides (a transpose, a slice, a head split) give the bits of their
    contiguous copies, on any number of threads."""
    kernel = kernels[dtype]
    make = random_f32 if dtype == "f32" else short_f64
    for m, n, k in [(7, 13, 29), (70, 130, 33)]:
        a_t, b_t = make((3, k, m)).transpose(0, 2, 1), make((3, n, k)).transpose(0, 2, 1)
        a_s = make((3, m, 2 * k))[:, :, ::2]
        heads = make((m, 3, k)).transpose(1, 0, 2)
        for a, b in [(a_t, make((3, k, n))), (make((3, m, k)), b_t), (a_t, b_t), (a_s, b_t),
                     (heads, b_t), (a_t[0], b_t), (a_t, b_t[1])]:
            want = bits(reference(np.ascontiguousarray(a), np.ascontiguousarray(b)))
            for threads in (1, 2, 3):
                assert bits(kernel(a, b, threads=threads)) == want


@pytest.mark.parametrize("n", [1, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 127, 129])
def test_every_tile_width_and_edge(kernels, n):
    """Each column count runs the narrowest tile that covers its last columns, with masked
    lanes and rows: plain, batched, transposed and strided operands, K of 0, 1 and odd."""
    kernel = kernels["f32"]
    for m, k in [(13, 1), (64, 7), (5, 0), (2, 33)]:
        a, b = operands((3, m, n, k), random_f32)
        b_t = random_f32((3, n, k)).transpose(0, 2, 1)
        a_s = random_f32((3, m, 2 * k))[:, :, ::2]
        for x, y in [(a[0], b[0]), (a, b), (a, b_t), (a_s, b_t[1])]:
            want = bits(reference(np.ascontiguousarray(x), np.ascontiguousarray(y))) if k else \
                bits(np.full(np.broadcast_shapes(x.shape[:-2], y.shape[:-2]) + (m, n), -0.0,
                             np.float32))
            assert bits(check_threads(kernel, x, y)) == want, (m, n, k, x.shape, y.shape)


def test_back_to_back_calls_on_spinning_helpers(kernels):
    """Calls that follow each other while the team's helpers still spin, changing shape and
    thread count each time, each give the reference's bits."""
    kernel = kernels["f32"]
    cases = [operands(shape, random_f32) for shape in
             [(64, 65, 128), (4, 29, 17, 33), (7, 3, 5), (100, 200, 40), (2, 96, 32, 64)]]
    wants = [bits(reference(a, b)) for a, b in cases]
    for i in range(60):
        (a, b), want = cases[i % len(cases)], wants[i % len(cases)]
        assert bits(kernel(a, b, threads=1 + i % 3)) == want, i


def test_a_layout_seen_before_reads_the_new_operands(kernels):
    """A call whose operands have the shapes and dtypes of an earlier one, but other strides,
    other data or another `out`, gives the reference's bits for its own operands."""
    kernel = kernels["f32"]
    a, b = operands((2, 9, 20, 13), random_f32)
    b_t = random_f32((2, 20, 13)).transpose(0, 2, 1)        # b's shape, other strides
    a_new, b_new = operands((2, 9, 20, 13), random_f32)
    a_64 = a.astype(np.float64)                              # a's shape and strides, f64
    for x, y in [(a, b), (a, b_t), (a_new, b_new), (a_new[1], b_t), (a_64, b), (a, b)]:
        want = bits(reference(np.ascontiguousarray(x, np.float32), np.ascontiguousarray(y)))
        assert bits(kernel(x, y)) == want
        out = np.full((2, 9, 20), np.nan, np.float32)
        assert bits(kernel(x, y, out=out)) == want and bits(out) == want


# ---------------------------------------------------------------- small and skinny products
# A job reads B in place (tiles of mr rows) where its K block of B takes at most
# Tiles.in_place_bytes, packs it past that, and streams B's rows at most mr rows: each side
# of each switch gives the reference's bits and the always-packing kernel's.

PROT_NONE = 0                  # (the mmap module names PROT_READ and PROT_WRITE only)
PACKING = {dtype: Matmul(dtype, dataclasses.replace(HOST[dtype], in_place_bytes=0))
           for dtype in ("f32", "f64")}


def switch_shapes(dtype: str) -> list[tuple[int, int, int]]:
    """(M, K, N) on both sides of the in-place bound (a K block of 512 rows × N columns), of
    the K block, of the streamed rows (M = mr), and with K and N 0, 1 and primes."""
    t = HOST[dtype]
    n_bound = t.in_place_bytes // (t.kc * SIZE[dtype])
    return [(13, t.kc, n_bound), (13, t.kc, n_bound + 1), (7, t.kc + 1, 40), (t.mr, 37, 33),
            (t.mr + 1, 37, 33), (1, 97, 2 * t.width + 1), (5, 0, 17), (7, 1, 31), (19, 13, 1),
            (1, 1, 1), (64, 64, 64)]


def switch_operands(dtype: str, m: int, k: int, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """a @ b as the backend passes them: contiguous, A transposed or strided, B a slice of a
    wider array (rows contiguous, read in place), of one whose rows lie farther apart than
    Tiles.in_place_row_bytes (packed: a head's v in attention's qkv), transposed, or of every
    other column."""
    make = random_f32 if dtype == "f32" else short_f64
    a, b = make((m, k)), make((k, n))
    a_t, a_s = make((k, m)).T, make((m, 2 * k))[:, ::2]
    b_wide, b_t, b_s = make((k, n + 3))[:, 2:n + 2], make((n, k)).T, make((k, 2 * n))[:, ::2]
    apart = HOST[dtype].in_place_row_bytes // SIZE[dtype] + 8
    b_far = make((k, max(apart, n + 3)))[:, 3:n + 3]
    return [(a, b), (a_t, b), (a_s, b_wide), (a, b_far), (a, b_t), (a_t, b_s)]


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_each_side_of_each_switch_gives_the_packed_paths_bits(dtype):
    kernel = Matmul(dtype)
    for m, k, n in switch_shapes(dtype):
        for a, b in switch_operands(dtype, m, k, n):
            want = bits(reference(np.ascontiguousarray(a), np.ascontiguousarray(b))) if k else \
                bits(np.full((m, n), -0.0, NUMPY[dtype]))
            got = check_threads(kernel, a, b)
            assert bits(got) == want, (m, k, n, a.strides, b.strides)
            assert bits(PACKING[dtype](a, b)) == want, (m, k, n, a.strides, b.strides)


def at_page_end(x: np.ndarray) -> np.ndarray:
    """A copy of x (C order) whose last byte is followed by an unreadable page: a read past
    its end is a crash, not a stray value."""
    page = mmap.PAGESIZE
    size = -(-max(x.nbytes, 1) // page) * page
    region = mmap.mmap(-1, size + page)
    start = ctypes.addressof(ctypes.c_char.from_buffer(region))
    if ctypes.CDLL(None, use_errno=True).mprotect(ctypes.c_void_p(start + size),
                                                  ctypes.c_size_t(page), PROT_NONE):
        raise OSError(ctypes.get_errno(), "mprotect")
    out = np.frombuffer(region, x.dtype, x.size, size - x.nbytes).reshape(x.shape)
    out[...] = x
    return out


def read_at_page_end(case: tuple[str, int, int, int]) -> list:
    """The shapes (and strides) of case's operands whose product, with A and B each ending at
    an unreadable page, differs from the reference's on 1, 2 or 3 threads."""
    dtype, m, k, n = case
    wrong = []
    for a, b in switch_operands(dtype, m, k, n):
        want = bits(reference(np.ascontiguousarray(a), np.ascontiguousarray(b))) if k else \
            bits(np.full((m, n), -0.0, NUMPY[dtype]))
        a_end, b_end = at_page_end(np.ascontiguousarray(a)), at_page_end(np.ascontiguousarray(b))
        for threads in (1, 2, 3):
            if bits(Matmul(dtype)(a_end, b_end, threads=threads)) != want:
                wrong.append((a.strides, b.strides, threads))
    return wrong


def test_no_path_reads_past_the_operands():
    """Every edge width of the in-place tiles and the streamed rows, B's last row ending at an
    unreadable page (each case in a child process: a stray read is a crash there)."""
    cases = [(dtype, m, k, n) for dtype in ("f32", "f64") for m in (1, HOST[dtype].mr, 7)
             for n in (1, HOST[dtype].width - 1, HOST[dtype].width + 1, 2 * HOST[dtype].width,
                       HOST[dtype].nr + 3) for k in (1, 9)]
    outcomes = {case: (outcome, value)
                for case, outcome, value in isolated(read_at_page_end, cases, timeout=300)}
    assert outcomes == {case: ("ok", []) for case in cases}


# ---------------------------------------------------------------- the direct call from Python
# Matmul.direct reads NumPy's array objects in native code: a call of 2-D operands of the
# kernel's dtype is one native call, with the bits of the checked path; anything else is
# refused untouched, for the checked path to take.

DIRECT_SHAPES = [(0, 3, 4), (3, 0, 4), (4, 3, 0), (1, 1, 1), (7, 13, 29), (31, 37, 41),
                 (64, 64, 64), (1, 768, 2304), (1024, 512, 128), (1024, 128, 512),
                 (512, 1024, 128), (6, 97, 65)]


DIRECT = {dtype: Matmul(dtype) for dtype in ("f32", "f64")}


class Subclass(np.ndarray):
    pass


def test_numpy_arrays_are_laid_out_as_the_direct_call_reads_them():
    assert numpy_layout_holds()


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("m, k, n", DIRECT_SHAPES)
def test_a_direct_call_gives_the_checked_paths_bits(dtype, m, k, n):
    """Contiguous, transposed, strided and reversed operands, on 1, 2 and 3 threads: the bits
    of the checked path (the reference's), within K roundings of float64 NumPy."""
    kernel = DIRECT[dtype]
    make = random_f32 if dtype == "f32" else short_f64
    a, a_t = make((m, k)), make((k, m)).T
    b, b_t, b_s = make((k, n)), make((n, k)).T, make((k, 2 * n))[:, ::2]
    for x, y in [(a, b), (a_t, b), (a, b_t), (a_t, b_s), (a[::-1], b[:, ::-1])]:
        want = kernel(x, y, threads=1)
        exact = x.astype(np.float64) @ y.astype(np.float64)
        # K roundings of at most half an ulp each, and as many in NumPy's float64 sums
        bound = (k + 1) * np.finfo(NUMPY[dtype]).eps * (np.abs(x).astype(np.float64) @ np.abs(y))
        assert np.all(np.abs(want - exact) <= bound)
        for threads in (1, 2, 3):
            out = np.full((m, n), np.nan, NUMPY[dtype])
            assert kernel.direct(x, y, out, threads), (x.strides, y.strides, threads)
            assert bits(out) == bits(want), (x.strides, y.strides, threads)


def jobs(kernel: Matmul, a: np.ndarray, b: np.ndarray, threads: int) -> int:
    """How many jobs the kernel cuts a @ b into for `threads` threads: the last thread index,
    called alone, claims them all and then one more that is not there."""
    c = np.empty((a.shape[0], b.shape[1]), a.dtype)
    scratch = np.empty(kernel.tiles.scratch_size(threads), a.dtype)
    next_job = np.zeros(1, dtype=np.int64)
    kernel.call(a[None], b[None], c[None], scratch, next_job, threads - 1, threads)
    return int(next_job[0]) - 1


@pytest.mark.parametrize("shape", [(96, 96, 256), (100, 64, 64), (200, 512, 64), (256, 256, 256),
                                   (13, 40, 1000), (1024, 128, 512)])
def test_every_thread_has_an_even_share_of_jobs(shape):
    """A product worth several threads is cut into a multiple of them, or into enough jobs
    (JOBS_PER_THREAD each) for an uneven count to cost little: one of 96 rows ran as a single
    job, one of 200 rows as three on two threads."""
    m, k, n = shape
    kernel = DIRECT["f32"]
    a, b = random_f32((m, k)), random_f32((k, n))
    for threads in (2, 3):
        count = jobs(kernel, a, b, threads)
        assert count >= threads and (count % threads == 0 or count >= threads * JOBS_PER_THREAD), \
            (threads, count)


@pytest.mark.parametrize("shape", [(1024, 128, 384), (1000, 64, 64), (200, 512, 64)])
def test_row_blocks_differ_by_at_most_one_panel(shape):
    """The jobs' rows are shared out evenly: cut into blocks of the most a block takes, a
    1024-row product's eighth job had 17 panels against the others' 22."""
    m, k, n = shape
    kernel = DIRECT["f32"]
    a, b = random_f32((m, k)), random_f32((k, n))
    threads = 2
    count = jobs(kernel, a, b, threads)

    def rows_from(job: int) -> int:
        """The rows that jobs job, job + 1, … write (each job covers all of C's columns here)."""
        c = np.full((1, m, n), np.nan, np.float32)
        scratch = np.empty(kernel.tiles.scratch_size(threads), np.float32)
        next_job = np.array([job], np.int64)
        kernel.call(a[None], b[None], c, scratch, next_job, 0, threads)
        return int(np.sum(~np.isnan(c[0, :, 0])))

    written = [rows_from(j) for j in range(count + 1)]
    sizes = [x - y for x, y in zip(written, written[1:])]
    assert sum(sizes) == m and max(sizes) - min(sizes) <= kernel.tiles.mr, sizes


def test_python_threads_calling_one_kernel_at_once_get_their_own_bits():
    """Direct calls on one thread (NAME.direct's own block, holding the GIL) and on two (the
    team's block, under the kernel's lock) and checked calls, from four Python threads at
    once: each product has the bits it has alone."""
    kernel = DIRECT["f32"]
    cases = [operands(shape, random_f32) for shape in [(64, 64, 64), (7, 29, 13), (1, 2304, 768),
                                                       (300, 100, 200)]]
    wants = [kernel(a, b, threads=1) for a, b in cases]
    wrong = []

    def calls(worker: int) -> None:
        for r in range(150):
            (a, b), want = cases[(worker + r) % len(cases)], wants[(worker + r) % len(cases)]
            if r % 3 == 0:
                got = kernel(a, b, threads=2)
            else:
                got = np.full_like(want, np.nan)
                kernel.direct(a, b, got, r % 3)
            if got.tobytes() != want.tobytes():
                wrong.append((worker, r))
    workers = [threading.Thread(target=calls, args=(w,)) for w in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert wrong == []


def test_a_long_direct_product_lets_other_python_threads_run():
    """NAME.direct keeps the GIL only for a product worth one thread: a longer one (2·10^9
    fmas, about 60 ms), even on one thread, runs without it, and another Python thread runs
    meanwhile: it never waits half the call (Python's switch interval is 5 ms)."""
    kernel = DIRECT["f32"]
    a, b = operands((1024, 1024, 2048), random_f32)
    out = np.empty((1024, 1024), np.float32)
    ticks, stop = [], threading.Event()

    def count() -> None:
        while not stop.is_set():
            ticks.append(time.perf_counter())
    counter = threading.Thread(target=count)
    counter.start()
    time.sleep(0.01)
    start = time.perf_counter()
    assert kernel.direct(a, b, out, 1)
    end = time.perf_counter()
    stop.set()
    counter.join()
    waits = np.diff([start, *(tick for tick in ticks if start < tick < end), end])
    assert waits.max() < (end - start) / 2, (waits.max(), end - start)
    assert out.tobytes() == kernel(a, b, threads=1).tobytes()


def test_a_direct_call_refuses_what_it_does_not_read():
    """Other dtypes, ranks, a non-contiguous or read-only `out`, misfit shapes, subclasses,
    lists and scalars: refused, `out` untouched (the checked path takes them)."""
    kernel = DIRECT["f32"]
    a, b = random_f32((4, 5)), random_f32((5, 3))
    out = np.full((4, 3), np.nan, np.float32)
    read_only = np.full((4, 3), np.nan, np.float32)
    read_only.flags.writeable = False
    misaligned = np.frombuffer(bytearray(4 * 5 * 4 + 1), np.float32, 20, 1).reshape(4, 5)
    for x, y, z in [(a.astype(np.float64), b, out), (a, b, out.astype(np.float64)),
                    (a[None], b, out[None]), (a, b[:, 0], out[:, 0]), (a, b[:4], out),
                    (a, b, np.full((3, 4), np.nan, np.float32).T), (a, b, read_only),
                    (a, b, np.full((4, 4), np.nan, np.float32)), (a.view(Subclass), b, out),
                    (a.tolist(), b, out), (np.float32(1), b, out), (misaligned, b, out),
                    (a, b.view(np.dtype(np.float32).newbyteorder(">")), out)]:
        assert not kernel.direct(x, y, z, 2)
        assert np.isnan(z).all()


@pytest.mark.parametrize("batch, m, k, n, several", [(301, 8, 16, 8, True), (64, 64, 32, 64, False)])
def test_small_jobs_are_taken_several_at_a_time(batch, m, k, n, several):
    """Each take of jobs is an atomic add on a line the threads share: 301 products of
    8×16×8, a job each, are taken several at a time (each thread's last, failed take then
    passes the last job by a take's worth); an attention's heads of 64×64×32, worth a take
    each, one at a time. Every job is run exactly once either way: the definition's bits on 1
    to 3 threads."""
    kernel = DIRECT["f32"]
    a, b = random_f32((batch, m, k)), random_f32((batch, k, n))
    want = np.stack([reference(x, y) for x, y in zip(a, b)])
    for threads in (1, 2, 3):
        next_job = np.zeros(1, dtype=np.int64)
        c = per_thread(kernel, a, b, threads, concurrent=False, next_job=next_job)
        assert bits(c) == bits(want), threads
        if threads > 1:
            assert (next_job[0] > batch + threads) == several, (threads, next_job[0])
