"""bf16 programs at the sizes that break things (0, 1, primes, 10^5), with special values, on
the reference interpreter, the CPU backend on 1, 2 and 3 threads and the GPU runtime on the fake
driver, each run in a child process; casts to and from every dtype; bf16 state in checkpoints;
bf16 inputs of the wrong kind from the API and the command line."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import dsl
from conftest import bits, dslc, on_every_thread_count, raises, user_error

sys.path.insert(0, str(Path(__file__).parent / "runtime"))
from test_cuda import FakeDriver, install  # noqa: E402

BF16 = ml_dtypes.bfloat16
DTYPES = {"f32": np.float32, "f16": np.float16, "f64": np.float64, "i32": np.int32, "i64": np.int64,
          "u32": np.uint32, "bool": np.bool_}
SOURCE = "from nn import softmax\n" + """
def total(x: bf16[N]) -> bf16:
  return sum(x)
def average(x: bf16[N]) -> bf16:
  return mean(x)
def largest(x: bf16[N]) -> bf16:
  return max(x)
def rows(x: bf16[B, N]) -> bf16[B]:
  return sum(x, axis=1)
def probabilities(x: bf16[B, N]) -> bf16[B, N]:
  return softmax(x, axis=1)
def product(a: bf16[M, K], b: bf16[K, P]) -> bf16[M, P]:
  return a @ b
def energy(x: bf16[B, N]) -> bf16:
  return sum(softmax(x, axis=1) * x) + mean(x * x) + max(x)
""" + "".join(f"""
def to_{d}(x: bf16[N]) -> {d}[N]:
  return cast(x, {d})
def from_{d}(x: {d}[N]) -> bf16[N]:
  return cast(x, bf16)
""" for d in DTYPES)
LARGE = 100_003                        # a prime past the reductions' 4096-element chunks
rng = np.random.default_rng(19)
# NaN, ±inf, the largest bf16, -0, a subnormal, values out of every integer's range, a tie
SPECIAL = np.array([np.nan, np.inf, -np.inf, 3.3895e38, -0.0, 1e-40, 1e10, -1e10, 3e9, -1.5, 2.5],
                   np.float32).astype(BF16)


def program(device: str):
    if device == "cuda":
        install(pytest.MonkeyPatch(), FakeDriver())          # (in the child: undone by its exit)
    return dsl.loads(SOURCE, device=device)


def same_bits_everywhere(run):
    """run(program) on the reference interpreter, then on the CPU on every thread count and on
    the fake GPU driver, each in a child process: all must give the reference's bits."""
    want = run(program("reference"))
    assert bits(on_every_thread_count(lambda: run(program("cpu")))) == bits(want)
    assert bits(on_every_thread_count(lambda: run(program("cuda")))) == bits(want)
    return want


def matrix(b: int, n: int) -> np.ndarray:
    return rng.standard_normal((b, n)).astype(BF16)


def test_reductions_give_the_same_bits_everywhere_at_every_size():
    xs = [matrix(1, n)[0] for n in (0, 1, 7, 13, LARGE)]
    values = same_bits_everywhere(lambda p: [(p.total(x), p.average(x), p.largest(x)) for x in xs])
    empty, *others = values
    # the empty reductions' identities: -0, NaN, -inf (docs/numerics.md)
    assert empty[0] == 0 and np.signbit(empty[0]) and np.isnan(empty[1]) and empty[2] == -np.inf
    for x, (total, average, largest) in zip(xs[1:], others):     # within bf16's rounding
        wide = x.astype(np.float64)
        assert float(total) == pytest.approx(wide.sum(), abs=2 ** -7 * np.abs(wide).sum())
        assert float(average) == pytest.approx(wide.mean(), abs=2 ** -7 * np.abs(wide).mean())
        assert float(largest) == wide.max()


def test_row_reductions_and_softmax_give_the_same_bits_everywhere():
    xs = [matrix(b, n) for b, n in [(0, 5), (3, 0), (1, 1), (2, 13), (7, 11)]]
    values = same_bits_everywhere(lambda p: [(p.rows(x), p.probabilities(x)) for x in xs])
    for x, (rows, probabilities) in zip(xs, values):
        assert rows.shape == x.shape[:1] and probabilities.shape == x.shape
        if x.shape[1]:
            np.testing.assert_allclose(probabilities.astype(np.float32).sum(axis=1), 1, atol=x.shape[1] * 2 ** -8)


def test_products_give_the_same_bits_everywhere():
    shapes = [(3, 0, 2), (0, 4, 3), (1, 1, 1), (5, 7, 3), (2, 13, 11)]
    operands = [(matrix(m, k), matrix(k, n)) for m, k, n in shapes]
    values = same_bits_everywhere(lambda p: [p.product(a, b) for a, b in operands])
    assert [v.shape for v in values] == [(m, n) for m, _, n in shapes]
    assert all(v.dtype == BF16 for v in values)
    assert not values[0].astype(np.float32).any() and np.signbit(values[0].astype(np.float32)).all()


def test_gradients_give_the_same_bits_everywhere():
    xs = [matrix(b, n) for b, n in [(1, 0), (1, 1), (3, 7), (2, 13)]] + [SPECIAL.reshape(1, -1)]
    grads = same_bits_everywhere(lambda p: [p.grad("energy", wrt="x")(x) for x in xs])
    assert [(g.shape, g.dtype) for g in grads] == [(x.shape, BF16) for x in xs]


def test_special_values_give_the_same_bits_everywhere():
    x = SPECIAL.reshape(1, -1)
    value = same_bits_everywhere(lambda p: (p.total(x[0]), p.largest(x[0]), p.probabilities(x)))
    assert np.isnan(float(value[0])) and np.isnan(float(value[1]))


def values_of(dtype: str) -> np.ndarray:
    """Values of dtype that test a conversion to bf16: specials, ties, extremes."""
    if dtype == "bool":
        return np.array([True, False])
    if np.dtype(DTYPES[dtype]).kind == "f":
        with np.errstate(over="ignore"):
            return SPECIAL.astype(np.float32).astype(DTYPES[dtype])
    info = np.iinfo(DTYPES[dtype])       # 2**24 + 2**16 + 1 rounds up only if rounded once
    return np.array([info.min, info.max, 0, 1, 257, 2 ** 24 + 2 ** 16 + 1, 2 ** 31 - 1], DTYPES[dtype])


def test_casts_to_and_from_every_dtype_give_the_same_bits_everywhere():
    x = np.concatenate([SPECIAL, matrix(1, 13)[0] * BF16(1000)])
    values = same_bits_everywhere(lambda p: {d: (getattr(p, f"to_{d}")(x), getattr(p, f"from_{d}")(values_of(d)))
                                             for d in DTYPES})
    for d, (to, back) in values.items():
        assert to.dtype == DTYPES[d] and back.dtype == BF16
        assert bits(back) == bits(values_of(d).astype(np.float64).astype(BF16))   # rounded once


@pytest.mark.parametrize("dtype", ["i32", "i64", "u32", "bool"])
def test_a_bf16_cast_to_an_integer_is_the_cast_of_its_f32(dtype):
    """Every bf16 is an f32, so their casts agree, NaN, inf and out-of-range values included
    (ml_dtypes' own conversion made them all 0)."""
    f32 = dsl.loads(f"def f(x: f32[N]) -> {dtype}[N]:\n  return cast(x, {dtype})\n")
    with np.errstate(invalid="ignore", over="ignore"):
        want = f32.f(SPECIAL.astype(np.float32))
        assert bits(getattr(program("reference"), f"to_{dtype}")(SPECIAL)) == bits(want)


# ---------------------------------------------------------------- bf16 state in checkpoints

MODEL = """
object Params { W: bf16[2, H], b: f32[H] }

def init(key: Key, H: int) -> Params:
  return Params { W: cast(normal(key, [2, H]), bf16), b: zeros([H]) }

def loss(p: Params, x: f32[B, 2], y: f32[B]) -> f32:
  h = cast(cast(x, bf16) @ p.W, f32) + p.b
  return mean((sum(h, axis=1) - y) ** 2)

def step(p: Params, x: f32[B, 2], y: f32[B], lr: f32) -> (Params, f32):
  l, g = value_and_grad(loss, wrt=p)(p, x, y)
  return map(lambda w, d: w - cast(lr, w.dtype) * d, p, g), l
"""
LOADER = """
import numpy as np
DIMS = {"H": 3}
SETTINGS = {"steps": 4, "batch_size": 0, "eval_every": 0, "samples": False}
HYPER = {"lr": 0.1}
def load(split):
    return {"x": np.eye(2, dtype=np.float32), "y": np.array([1, 0], np.float32)} if split == "train" else None
"""


def test_a_run_with_bf16_parameters_resumes_from_its_checkpoint_to_the_same_bits(tmp_path):
    """The checkpoint holds BF16 and reads back as bf16 (it was widened to f32, and the resume
    refused the file as damaged)."""
    (tmp_path / "m.bend").write_text(MODEL)
    (tmp_path / "m.py").write_text(LOADER)
    path = str(tmp_path / "m.bend")
    straight = dsl.train(path, steps=4, progress=None, final_eval=False, device="reference")
    dsl.train(path, steps=2, progress=None, final_eval=False, device="reference",
              checkpoint_dir=str(tmp_path / "ck"))
    resumed = dsl.train(path, steps=4, resume=str(tmp_path / "ck" / "step0000002.safetensors"),
                        progress=None, final_eval=False, device="reference")
    assert resumed.params["W"].dtype == BF16
    assert bits(resumed.params) == bits(straight.params) and resumed.losses == straight.losses


# ---------------------------------------------------------------- wrong inputs

@pytest.mark.parametrize("given, fragment", [
    (np.ones(3, np.float32), "expected bf16[N], got f32[3]"),
    (np.ones((2, 2), BF16), "expected bf16[N], got bf16[2, 2]"),
    (np.ones(3, np.int32), "expected bf16[N], got i32[3]")])
def test_a_wrong_bf16_argument_is_a_located_diagnostic(given, fragment):
    assert raises(lambda: program("cpu").total(given), fragment).span is not None


def test_a_bf16_array_in_an_npz_is_a_diagnostic(tmp_path):
    (tmp_path / "m.bend").write_text(SOURCE)
    np.savez(tmp_path / "in.npz", x=np.ones(3, BF16))
    user_error(dslc("run", str(tmp_path / "m.bend"), "--entry", "total", "--inputs", str(tmp_path / "in.npz")),
               "cannot read inputs from", "'x.npy'")
