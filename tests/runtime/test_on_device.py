"""Work that once ran on the host with a copy each way, now on the device: integer division
and remainder, shifts, concatenation, random numbers, reductions over axes that are not
adjacent and `fold` bodies. Each runs through the GPU runtime on the fake driver and on the
emulated kernels (tests/runtime/test_cuda.py), gives the CPU backend's bits (the
interpreter's, where the CPU runs it on the host) at degenerate sizes too, and sends no tensor
to the host and back."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import backend.persistent
import dsl

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))
from conftest import EXAMPLES, example_case, example_step_case, slow  # noqa: E402
from test_cuda import assert_same, bindings_driver, emulated, fake  # noqa: E402,F401  (the fixtures)
from test_shifts import SHIFTS, numpy_shifts, operands  # noqa: E402

SIZES = [0, 1, 13]                     # nothing, one element, a prime


def on_device(drv, src: str, entry: str, args: list):
    """entry's results on the GPU, checked to be the CPU backend's bits; nothing but the inputs
    crossed between host and device during a call (after the first, which makes constants)."""
    call = getattr(dsl.loads(src, device="cuda"), entry)
    call(*args)
    drv.uploaded.clear()
    drv.downloaded.clear()
    got = call(*args)
    assert drv.downloaded == [], "a value came to the host"
    assert len(drv.uploaded) <= len(args), "a value went back to the device"
    assert_same(got, getattr(dsl.loads(src, device="cpu"), entry)(*args))
    return got


# ---------------------------------------------------------------- integer division

DIVISION = """
def f(a: i32[N], b: i32[N], c: i64[N], d: i64[N], e: u32[N], g: u32[N]
      ) -> (i32[N], i32[N], i64[N], i64[N], u32[N], u32[N]):
  return a // b, a % b, c // d, c % d, e // g, e % g
"""


def pairs(values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n pairs of dividends and divisors: each of values with each, repeated to n."""
    a, b = (g.reshape(-1) for g in np.meshgrid(values, values, indexing="ij"))
    return np.resize(a, n), np.resize(b, n)


def extremes(dtype, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n pairs of dividends and divisors: each sign, 0, ±1 and the extremes of the dtype."""
    info = np.iinfo(dtype)
    return pairs(np.array(sorted({0, 1, 7, info.max, info.min,
                                  *(() if info.min == 0 else (-1, -7))}), dtype), n)


@pytest.mark.parametrize("driver", ["fake", "emulated"])
@pytest.mark.parametrize("n", SIZES + [49])
def test_integer_division_and_remainder_run_on_the_device(request, driver, n):
    """Rounded toward minus infinity, 0 for a divisor of 0, the least value // -1 itself:
    NumPy's (the interpreter's) answers, by a map kernel."""
    args = [x for dtype in (np.int32, np.int64, np.uint32) for x in extremes(dtype, n)]
    on_device(request.getfixturevalue(driver), DIVISION, "f", args)


FLOAT_DIVISION = """
def f(a: f32[N], b: f32[N], c: f64[N], d: f64[N]) -> (f32[N], f32[N], f64[N], f64[N]):
  return a // b, a % b, c // d, c % d

def reduced(a: f32[N], b: f32[N]) -> (f32, f32[N]):
  return sum(where(b == 0.0, 0.0, a % b)), grad(lambda x: sum((x % b) * x))(a)
"""


def float_extremes(dtype, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n pairs of dividends and divisors: signed zeros, ±1, a half, the largest value and the
    least subnormal (exponents the widest apart), infinities and NaN."""
    info = np.finfo(dtype)
    return pairs(np.array([0.0, -0.0, 1.0, -1.0, 7.5, -3.0, info.max, info.smallest_subnormal,
                           np.inf, -np.inf, np.nan], dtype), n)


@pytest.mark.parametrize("driver", ["fake", "emulated"])
@pytest.mark.parametrize("n", SIZES + [121])
def test_float_division_and_remainder_run_on_the_device(request, driver, n):
    """NumPy's floor division and remainder of floats, from the math library's exact fmod,
    by a map kernel: NumPy's bits, NaNs included."""
    args = [x for dtype in (np.float32, np.float64) for x in float_extremes(dtype, n)]
    got = on_device(request.getfixturevalue(driver), FLOAT_DIVISION, "f", args)
    with np.errstate(all="ignore"):
        want = [f(*args[i:i + 2]) for i in (0, 2) for f in (np.floor_divide, np.mod)]
    for g, w in zip(got, want, strict=True):
        assert np.asarray(g).tobytes() == w.tobytes()
    # in a reduction (a warp's shuffles after each thread's loop of fmod steps) and a gradient,
    # of finite operands (a sum that meets NaNs of both signs keeps either: docs/numerics.md)
    finite = [np.where(np.isfinite(x), x, np.float32(1.5)) for x in args[:2]]
    on_device(request.getfixturevalue(driver), FLOAT_DIVISION, "reduced", finite)


# ---------------------------------------------------------------- shifts

@pytest.mark.parametrize("driver", ["fake", "emulated"])
@pytest.mark.parametrize("n", SIZES + [1031])
def test_shifts_run_on_the_device(request, driver, n):
    """By every count, negative and out of range too: NumPy's bits, by a map kernel."""
    args = operands(n)
    got = on_device(request.getfixturevalue(driver), SHIFTS, "f", args)
    for g, w in zip(got, numpy_shifts(*args), strict=True):
        assert np.asarray(g).tobytes() == w.tobytes()


# ---------------------------------------------------------------- concatenation

CONCAT = """
def f(a: f32[2, N, 3], b: f32[2, 1, 3], c: f32[2, M, 3]) -> (f32[2, N + M + 1, 3], f32[N + 1, 2, 3]):
  return concat([a, b, c], axis=1), concat([transpose(a, [1, 0, 2]), transpose(b, [1, 0, 2])])

def ints(i: i64[N], j: i64[M], m: bool[N], k: bool[M]) -> (i64[M + N], bool[N + M]):
  return concat([j, i]), concat([m, k], axis=-1)

def loss(a: f32[N, 4], b: f32[M, 4]) -> f32:
  x = concat([a, b * b])
  return sum(x * x * x)
"""


def signed_zeros(rng, *shape) -> np.ndarray:
    """Normal values, with -0.0 among them (a sum would lose its sign)."""
    x = rng.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[::3] = -0.0
    return x


@pytest.mark.parametrize("driver", ["fake", "emulated"])
@pytest.mark.parametrize("n, m", [(0, 0), (1, 0), (0, 13), (13, 1)])
def test_concatenation_runs_on_the_device(request, driver, n, m):
    """Along an inner and the first axis, of strided inputs (a transpose), of integers and
    bools, and in a gradient: each element copied, -0.0 kept."""
    drv = request.getfixturevalue(driver)
    rng = np.random.default_rng(n + m)
    a, b, c = signed_zeros(rng, 2, n, 3), signed_zeros(rng, 2, 1, 3), signed_zeros(rng, 2, m, 3)
    on_device(drv, CONCAT, "f", [a, b, c])
    i, j = rng.integers(-2 ** 62, 2 ** 62, n), rng.integers(-2 ** 62, 2 ** 62, m)
    on_device(drv, CONCAT, "ints", [i, j, rng.random(n) < 0.5, rng.random(m) < 0.5])
    x, y = signed_zeros(rng, n, 4), signed_zeros(rng, m, 4)
    got = dsl.loads(CONCAT, device="cuda").value_and_grad("loss", wrt=("a", "b"))(x, y)
    assert_same(got, dsl.loads(CONCAT, device="cpu").value_and_grad("loss", wrt=("a", "b"))(x, y))


# ---------------------------------------------------------------- reductions over spread axes

SPREAD = """
def f(x: f32[N, 3, 4, 5]) -> (f32[3, 5], f32[1, 3, 1, 1], f32[N, 4]):
  return sum(x, axis=(0, 2)), mean(x, axis=(0, 2, 3), keepdims=True), max(x, axis=(3, 1))

def norm(x: f32[N, 3, 4, 5], g: f32[1, 3, 1, 1]) -> f32:
  m = mean(x, axis=(0, 2, 3), keepdims=True)
  return sum((x - m) * g * x)
"""


@pytest.mark.parametrize("driver", ["fake", "emulated"])
@pytest.mark.parametrize("n", SIZES)
def test_reductions_over_axes_that_are_not_adjacent_run_on_the_device(request, driver, n):
    """A batch norm's axes (0, 2, 3): a transposed copy and one reduction kernel, the CPU's
    bits, and its gradient."""
    drv = request.getfixturevalue(driver)
    rng = np.random.default_rng(n)
    x, g = signed_zeros(rng, n, 3, 4, 5), signed_zeros(rng, 1, 3, 1, 1)
    on_device(drv, SPREAD, "f", [x])
    got = dsl.loads(SPREAD, device="cuda").value_and_grad("norm", wrt=("x", "g"))(x, g)
    assert_same(got, dsl.loads(SPREAD, device="cpu").value_and_grad("norm", wrt=("x", "g"))(x, g))


# ---------------------------------------------------------------- random numbers

DRAWS = """
def f(k: Key, p: f32, q: f64) -> (f32[N], f64[N], f32[N, 3], f32[N], bool[N], bool[3, N]):
  a = split(k, 4)
  return (uniform(a[0], [N]), uniform(a[1], [N], -1.0, 1.0, dtype=f64), uniform(a[2], [N, 3], 2.0, 2.0),
          uniform(a[3], [N], 0.0, 1e-45), bernoulli(a[0], p, [N]), bernoulli(a[1], q, [3, N]))
"""


@pytest.mark.parametrize("driver", ["fake", "emulated"])
@pytest.mark.parametrize("n", SIZES + [1031])
def test_uniform_and_bernoulli_draw_on_the_device(request, driver, n):
    """docs/random.md's bits, from keys split on the device: words of several Philox blocks
    (more than 4 × 256 at n = 1031), f32 and f64, an empty range (no clamp), one whose draws
    round up to high (clamped), and p in f32 and f64."""
    drv = request.getfixturevalue(driver)
    on_device(drv, DRAWS.replace("N", str(n)), "f", [dsl.key(7), np.float32(0.3), np.float64(0.7)])
    assert drv.launches >= 1 + 6 * (n > 0)


SPLITS = """
def f(k: Key) -> (Key, Key, Key, f32[2]):
  a = split(k, 3)
  b = split(a[2], 1)
  return a[0], a[2], b[0], uniform(a[1], [2])
"""


@pytest.mark.parametrize("driver", ["fake", "emulated"])
def test_keys_split_on_the_device_are_the_references(request, driver):
    """Each key of a split, one split of a split's key, and a draw from one: docs/random.md's
    words (split(key(0), 2) is its worked example)."""
    drv = request.getfixturevalue(driver)
    for seed in (0, 2 ** 64 - 1):
        got = dsl.loads(SPLITS, device="cuda").f(dsl.key(seed))
        want = dsl.loads(SPLITS, device="reference").f(dsl.key(seed))
        assert [np.asarray(g.words if isinstance(g, dsl.Key) else g).tobytes() for g in got] == \
            [np.asarray(w.words if isinstance(w, dsl.Key) else w).tobytes() for w in want]
    assert [int(w) for w in dsl.loads(SPLITS, device="cuda").f(dsl.key(0))[0].words] == [0x2DCE73E5, 0x1348E23F]


KEYS_AND_NORMALS = """
def f(k: Key, i: i32, j: i64, u: u32) -> (f32[N], f32[N, 2], Key, Key, Key, Key, Key):
  a = fold_in(k, i)
  return (normal(a, [N]), normal(fold_in(k, 3), [N, 2]), a, fold_in(k, j), fold_in(a, u), key(0),
          key(18446744073709551615))
"""


@pytest.mark.parametrize("driver", ["fake", "emulated"])
@pytest.mark.parametrize("n", SIZES + [10 ** 5])
def test_normal_fold_in_and_key_run_on_the_device(request, driver, n):
    """docs/random.md's bits: f32 normal draws (an odd count keeps a last cosine) from keys
    folded on the device with an i32, an i64 and a u32 (-1 sign-extended, 2**32 - 1 not), and
    keys of the smallest and largest seeds, made on the device once."""
    drv = request.getfixturevalue(driver)
    args = [dsl.key(n), np.int32(-1), np.int64(-1), np.uint32(2 ** 32 - 1)]
    src = KEYS_AND_NORMALS.replace("N", str(n))
    got = on_device(drv, src, "f", args)
    assert np.asarray(got[2].words).tolist() != np.asarray(got[4].words).tolist()
    assert [np.asarray(k.words).tolist() for k in got[5:]] == [[0, 0], [2 ** 32 - 1] * 2]
    if n:
        assert_same(got[:2], dsl.loads(src, device="reference").f(*args)[:2])


# ---------------------------------------------------------------- fold

# (h @ w: a product of a step's x by w would be made for every step before the fold)
FOLD = """
def f(xs: f32[T, 3, 2], w: f32[2, 2], h0: f32[3, 2]) -> (f32[3, 2], f32[T, 3, 2], f32[T]):
  hs, ss = fold x in xs with h = h0:
    h = tanh(h @ w + x)
    return h, sum(h)
  return h, hs, ss

def loss(xs: f32[T, 3, 2], w: f32[2, 2], h0: f32[3, 2]) -> f32:
  hs = fold x in xs with h = h0:
    h = tanh(h @ w + x)
    return h
  return sum(hs * hs)
"""


@pytest.mark.parametrize("driver", ["fake", "emulated"])
@pytest.mark.parametrize("t", [0, 1, pytest.param(13, marks=slow)])     # (13 steps: 25 s each)
@pytest.mark.parametrize("persistent", [True, False])
def test_a_fold_runs_its_body_on_the_device(request, monkeypatch, driver, t, persistent):
    """State, scanned slices and the stacked emits (a tensor and a scalar per step) stay on
    the device; its gradient (a reverse scan) gives the CPU's bits. The body is small: one
    launch of its persistent kernel, or, with the rule's WORK at 0, its kernels at each step."""
    drv = request.getfixturevalue(driver)
    if not persistent:
        monkeypatch.setattr(backend.persistent, "WORK", 0)
    rng = np.random.default_rng(t)
    args = [signed_zeros(rng, t, 3, 2), rng.standard_normal((2, 2)).astype(np.float32),
            signed_zeros(rng, 3, 2)]
    on_device(drv, FOLD, "f", args)
    del drv.entries[:]
    dsl.loads(FOLD, device="cuda").f(*args)
    assert (drv.entries == ["f_b0_fold"]) if persistent else len(drv.entries) >= 2 * t
    got = dsl.loads(FOLD, device="cuda").value_and_grad("loss", wrt=("w", "h0"))(*args)
    assert_same(got, dsl.loads(FOLD, device="cpu").value_and_grad("loss", wrt=("w", "h0"))(*args))


RNN = """
def loss(xs: f32[T, 4, 3], w: f32[3, 5], u: f32[5, 5], h0: f32[4, 5]) -> f32:
  hs, ss, ms = fold x in xs with h = h0, c = h0:
    h, c = tanh(x @ w + h @ u - c), c * 0.5 + h
    return h, sum(h * c), max(c)
  return sum(hs * hs) + sum(ss) - sum(ms)
"""


@pytest.mark.parametrize("t", [1, 11])
def test_an_rnns_persistent_folds_give_the_cpus_bits(emulated, t):
    """Two states (each a function of both), two products a step, reductions, a constant made
    once and three emitted values: the loss and its gradient (a reverse fold) by one launch
    of the emulated persistent kernel each."""
    drv = emulated
    rng = np.random.default_rng(t)
    args = [signed_zeros(rng, t, 4, 3)] + [rng.standard_normal(s).astype(np.float32) for s in ((3, 5), (5, 5), (4, 5))]
    wrt = ("w", "u", "h0")
    got = dsl.loads(RNN, device="cuda").value_and_grad("loss", wrt=wrt)(*args)
    assert_same(got, dsl.loads(RNN, device="cpu").value_and_grad("loss", wrt=wrt)(*args))
    assert len([e for e in drv.entries if e.endswith("_fold")]) == 2


def test_the_bindings_driver_copies_device_to_device():
    drv, mock = bindings_driver()
    drv.copy(0x7000, 0x9000, 24)
    assert mock.calls == [("cuMemcpyDtoD", (0x7000, 0x9000, 24))]


SPLIT = """
def f(x: f32[2, N, 3], i: i64[N]) -> (f32[2, 1, 3], f32[2, N - 1, 3], f32[2, N, 1], f32[2, N, 2], i64[0], i64[N]):
  a, b = split(x, [1, N - 1], axis=1)
  c, d = split(x, [1, 2], axis=-1)
  e, g = split(i, [0, N])
  return a, b, c, d, e, g
"""


@pytest.mark.parametrize("driver", ["fake", "emulated"])
@pytest.mark.parametrize("n", [1, 13])
def test_a_split_runs_on_the_device(request, driver, n):
    """Along an inner and the last axis, into parts of one element, of none and of all."""
    rng = np.random.default_rng(n)
    on_device(request.getfixturevalue(driver), SPLIT, "f",
              [signed_zeros(rng, 2, n, 3), rng.integers(-2 ** 62, 2 ** 62, n)])



# ---------------------------------------------------------------- every example's manifest

def every_step(steps: list[dict]):
    """The steps of a manifest, a fold's body's after the fold's."""
    for s in steps:
        yield s
        if "fold" in s:
            yield from every_step(s["body"]["steps"])


@pytest.mark.parametrize("entry", ["loss", "step"])
@pytest.mark.parametrize("name", EXAMPLES)
def test_an_examples_manifest_lists_no_host_step(tmp_path, name, entry):
    """`dslc compile --target ptx` of each example's forward pass and training step: every
    step (a fold's body's too) a kernel, a contraction, a gather, a view, a value made once or
    a fold; every kernel in the PTX."""
    prog, args = example_case(name, "cpu")[:2] if entry == "loss" else example_step_case(name, "cpu")
    prog.lower(entry, (), args)
    manifest = prog.compile_to(entry, "ptx", str(tmp_path))
    steps = list(every_step(manifest["steps"]))
    assert [s["host"] for s in steps if "host" in s] == []
    assert {next(iter(s)) for s in steps} <= {"kernel", "matmul", "gather", "view", "once", "fold"}
    ptx = (tmp_path / "kernels.ptx").read_text()
    entries = {k["name"]: k["launch"]["entry"] for k in manifest["kernels"]}
    assert all(f".entry {entries[s['kernel']]}(" in ptx for s in steps if "kernel" in s)


# ---------------------------------------------------------------- pad

PAD = """
def f(x: f32[N, 3], i: i32[N], b: bool[N]) -> (f32[N + 3, 5], i32[N + 2], bool[N + 1], f32, f32[N + 2, 3]):
  y = pad(x, [1, 2, 0, 2])
  return y, pad(i, [2, 0]), pad(b, [0, 1]), sum(y * y), pad(x, [1, 1, 0, 0], 0) * 2.0 + 1.0

def others(x: f32[N, 3]) -> (f32[N + 2, 3], f32[N, 4]):
  return pad(x, [1, 1, 0, 0], -0.0), pad(x, [0, 0, 0, 1], 1.5)

def loss(x: f32[N, 3]) -> f32:
  y = pad(x, [2, 1, 1, 1])
  return sum(y * y * y)
"""


@pytest.mark.parametrize("driver", ["fake", "emulated"])
@pytest.mark.parametrize("n", SIZES)
def test_a_pad_with_zeros_is_read_in_place_on_the_device(request, driver, n):
    """A window around its input (a map reads it in place, a reduction and a result from a
    copy kernel), of floats, integers and bools, and in a gradient; padding with -0.0 or
    another value, or padding nothing (n = 0), is NumPy's; the CPU backend gives the
    interpreter's bits for all."""
    drv = request.getfixturevalue(driver)
    rng = np.random.default_rng(n)
    x = signed_zeros(rng, n, 3)
    args = [x, rng.integers(-9, 9, n).astype(np.int32), rng.random(n) < 0.5]
    if n:
        on_device(drv, PAD, "f", args)
    for entry, inputs in (("f", args), ("others", [x])):
        assert_same(getattr(dsl.loads(PAD, device="cuda"), entry)(*inputs),
                    getattr(dsl.loads(PAD, device="reference"), entry)(*inputs))
        assert_same(getattr(dsl.loads(PAD, device="cpu"), entry)(*inputs),
                    getattr(dsl.loads(PAD, device="reference"), entry)(*inputs))
    got = dsl.loads(PAD, device="cuda").value_and_grad("loss", wrt="x")(x)
    assert_same(got, dsl.loads(PAD, device="cpu").value_and_grad("loss", wrt="x")(x))


@pytest.mark.parametrize("target", ["ptx", "cpu"])
def test_a_folds_manifest_step_holds_its_bodys_steps(tmp_path, target):
    """The fold's length, direction and operands, and its body's parameters, results and
    steps, whose kernels are in the manifest's kernels (and kernels.ptx)."""
    manifest = dsl.loads(FOLD).compile_to("f", target, str(tmp_path), dims={"T": 5})
    (fold,) = manifest["steps"]
    assert (fold["fold"], fold["reverse"], fold["state"], fold["scanned"]) == (5, False, 1, 1)
    assert fold["inputs"] == [2, 0, 1] and len(fold["outputs"]) == 3
    body = fold["body"]
    assert len(body["params"]) == 3 and len(body["results"]) == 3
    kernels = {s["kernel"] for s in every_step(body["steps"]) if "kernel" in s} | \
        {s["epilogue"]["kernel"] for s in body["steps"] if "epilogue" in s}
    assert kernels and kernels <= {k["name"] for k in manifest["kernels"]}
    if target == "ptx":
        ptx = (tmp_path / "kernels.ptx").read_text()
        assert all(f".entry {k['launch']['entry']}(" in ptx for k in manifest["kernels"])
        assert f".entry {fold['persistent']}(" in ptx          # the body is small


# ---------------------------------------------------------------- argmax, argmin

EXTREMES = """
def f(x: f32[N, 5], y: f64[N], i: i32[N, 2], u: u32[N], b: bool[N, 3]
      ) -> (i32[N], i32[5], i32, i32[N, 1], i32, i32[2], i32, i32[N]):
  return (argmax(x, axis=-1), argmin(x, axis=0), argmax(y), argmin(i, axis=1, keepdims=True),
          argmax(u), argmax(i, axis=0), argmin(b), argmax(b, axis=1))
"""


def extreme_args(rng, n: int) -> list[np.ndarray]:
    """Ties, signed zeros, NaNs and infinities among small values."""
    x = rng.integers(-2, 3, (n, 5)).astype(np.float32)
    x.reshape(-1)[::7] = -0.0
    x.reshape(-1)[3::11] = np.nan
    x.reshape(-1)[5::13] = np.inf
    return [x, np.where(rng.random(n) < 0.2, np.nan, rng.standard_normal(n)),
            rng.integers(-3, 3, (n, 2)).astype(np.int32), rng.integers(0, 2 ** 32, n, dtype=np.uint32),
            rng.random((n, 3)) < 0.5]


@pytest.mark.parametrize("driver", ["fake", "emulated"])
@pytest.mark.parametrize("n", [1, 13, 300])
def test_argmax_and_argmin_run_on_the_device(request, driver, n):
    """NumPy's index: the first of tied extremes, the first NaN; along an axis, the last
    one, the flattened tensor; floats, integers, unsigned and bools."""
    on_device(request.getfixturevalue(driver), EXTREMES, "f", extreme_args(np.random.default_rng(n), n))


def test_argmax_of_an_empty_axis_is_the_cpus_error(fake):
    messages = []
    for device in ("cuda", "cpu"):
        with pytest.raises(dsl.DslError) as e:
            dsl.loads(EXTREMES, device=device).f(*extreme_args(np.random.default_rng(0), 0))
        messages.append(str(e.value))
    assert messages[0] == messages[1] and "empty" in messages[0]


# ---------------------------------------------------------------- casts from floats to integers

CASTS = """
def f(x: f32[N], y: f64[N], h: f16[N]) -> (i32[N], i64[N], i32[N], i64[N], i32[N], i64[N]):
  return cast(x, i32), cast(x, i64), cast(y, i32), cast(y, i64), cast(floor(x * 3.0), i32), cast(h, i64)
"""


@pytest.mark.parametrize("driver", ["fake", "emulated"])
@pytest.mark.parametrize("n", SIZES + [40])
def test_casts_from_floats_to_integers_run_on_the_device(request, driver, n):
    """Truncated toward zero; NaN, infinities and values out of range the least value (the
    CPU backend's kernels; tests/backend/test_primitives.py checks them against NumPy)."""
    values = np.array([0.0, -0.0, 1.5, -1.5, 2.0 ** 31 - 128, -2.0 ** 31, 2.0 ** 31, 3e9, -3e9, 2.0 ** 63,
                       -2.0 ** 63, 1e30, np.inf, -np.inf, np.nan, 65504.0, -7.9, 0.4, 1e-40, 123456.7])
    x = np.resize(values, n)
    on_device(request.getfixturevalue(driver), CASTS, "f",
              [x.astype(np.float32), x, x.astype(np.float16)])
