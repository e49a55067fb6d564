"""The native step (runtime/step.py, backend/step.py): a plan's runs, products and scatters
between two host steps are one native call, with the bits of the step-by-step walk and of the
interpreter, at degenerate sizes and on any number of threads; and the fast path of calls
(dsl/fastcall.py) reuses a lowering only for arguments of the same signature."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import dsl
from dsl.train import DEFAULTS, Model, batch_indices, step_key
from backend import contract
from backend.step import ScatterCall, TakeCall
from conftest import contents, full_range, isolated, lowerings, raises, written
from runtime import cpu
from runtime.cpu import Executable
from runtime.step import Native
from test_rows import reference

EXAMPLES = Path(__file__).parent.parent.parent / "examples"
PROGRAMS = Path(__file__).parent.parent / "programs"          # (lstm.bend)

SOURCE = """
from nn import softmax
from lstm import Lstm, lstm_loss
def mlp(x: f32[B, D], W: f32[D, H], b: f32[H], V2: f32[H, N]) -> f32[B, N]:
  return tanh(x @ W + b) @ V2

def attention(q: f32[B, T, D], k: f32[B, T, D]) -> (f32[B, T, T], f32[D, T]):
  return softmax(q @ transpose(k, [0, 2, 1]), axis=-1), transpose(k[0], [1, 0])

def heads(qkv: f32[B, T, 3, H, D]) -> (f32[B, H, T, D], f32[B, H, T, T]):
  q = transpose(qkv[:, :, 0], [0, 2, 1, 3])
  k = transpose(qkv[:, :, 1], [0, 2, 1, 3])
  v = transpose(qkv[:, :, 2], [0, 2, 1, 3])
  a = q @ transpose(k, [0, 1, 3, 2])
  return a @ v, a

def grouped_heads(qkv: f32[G, B, T, 3, H, D]) -> f32[G, B, H, T, T]:
  q = transpose(qkv[:, :, :, 0], [0, 1, 3, 2, 4])
  k = transpose(qkv[:, :, :, 1], [0, 1, 3, 4, 2])
  return q @ k

def heads_grad(qkv: f32[B, T, 3, H, D]) -> f32[B, T, 3, H, D]:
  return grad(heads_loss, wrt=qkv)(qkv)

def heads_loss(qkv):
  y, a = heads(qkv)
  return sum(tanh(y)) + sum(a * a)

def row(x: f32[A, D], W: f32[D, H]) -> (f32[H], f32[D]):
  return x[2] @ W, x[1]

def embedded(C: f32[V, E]) -> f32:
  return sum(tanh(C) * C)

def embedding_grad(C: f32[V, E], x: i32[B, T]) -> (f32, f32[V, E]):
  l, g = value_and_grad(lookup, wrt=C)(C, x)
  return l, g

def lookup(C, x):
  return sum(tanh(C[x]))

def scattered(x: f32[V, E], i: i32[B], u: f32[B, E]) -> f32[V, E]:
  return scatter_add(x * 2.0, i, u)

def lstm_grad(p: Lstm, xs: f32[T, B, D], h0: f32[B, H], c0: f32[B, H]) -> (f32, Lstm):
  l, g = value_and_grad(lstm_loss, wrt=p)(p, xs, h0, c0)
  return l, g

def stacked(x: f32[A, N], y: f32[A, N]) -> (f32[3, A, N], f32[A, 2, N], f32[A, N, 2]):
  return stack([x, y * 2.0, x + y]), stack([tanh(x), y], axis=1), stack([x, exp(y)], axis=-1)

def halves(x: f32[A, 6], y: f32[6, A]) -> (f32[A, 6], f32[2, A, 3], f32[A, 9]):
  return concat([x[:, 3:], -x[:, :3]], axis=1), stack([x[:, 3:], x[:, :3]]), concat([x, transpose(y)[:, 3:]], axis=-1)

def columns(x: f32[A, 3], y: f64[3, A], b: bool[A, 2]) -> (f32[3, 2 * A], f64[A, 6], bool[2, 2 * A]):
  return (concat([transpose(x), transpose(x * 2.0)], axis=1), concat([transpose(y), transpose(y)], axis=1),
          concat([transpose(b), transpose(b)], axis=1))

def scattered_steps(x: f32[V, E], i: i32[B, T], u: f32[T, B, E]) -> f32[V, E]:
  return scatter_add(x, i, transpose(u, [1, 0, 2]))

def gathered(C: f32[V, 2, E], i: i32[B]) -> f32[B, E]:
  return C[:, 1][i]

def heads_concat(x: f32[B, T, H, D]) -> f32[B, H, T, 2 * D]:
  q = transpose(x, [0, 2, 1, 3])
  return concat([q, -q], axis=-1)

def extremes(x: f32[A, 5], y: f64[5, A], i: i32[A, 3], l: i64[A, 4], u: u32[A, 2], b: bool[A, 2]
             ) -> (i32[A], i32[A], i32[A, 1], i32[A], i32[A], i32[A], i32[A]):
  return (argmax(x, axis=-1), argmin(y, axis=0), argmax(transpose(y), axis=1, keepdims=True),
          argmax(i, axis=1), argmin(l, axis=-1), argmin(u, axis=1), argmax(b, axis=1))

def extreme_all(x: f32[A, 3]) -> (i32, i32):
  return argmax(x), argmin(x * 2.0)

def drawn(k: Key, p: f32, q: f64, i: i32, x: f32[A, 3]
          ) -> (f32[A, 3], f64[A], bool[A, 3], bool[A], f32[A, 2], Key, f32[A, 3]):
  ks = split(k, 3)
  j = fold_in(ks[2], i)
  return (uniform(ks[0], [A, 3], -1.0, 2.0) * x, uniform(ks[1], [A], 0.5, 0.5, f64),
          bernoulli(j, p, [A, 3]), bernoulli(ks[0], q, [A]), normal(j, [A, 2]),
          fold_in(j, cast(i, i64)), x * 2.0)

def counted(x: i32[A, 5], l: i64[5, A], u: u32[A, 3], b: bool[A, 4], c: bool[4, 8 * A]
            ) -> (i32[5], i32[A], i32, i64[5], i64[1, A], u32[3], u32[A], bool[A], bool[8 * A], i32[A, 5]):
  return (sum(x, axis=0), sum(x * 3, axis=1), prod(x), prod(l, axis=1), max(l, axis=0, keepdims=True),
          sum(u, axis=0), min(u, axis=1), max(b, axis=1), min(c, axis=0),
          x - max(x, axis=-1, keepdims=True) + sum(x, axis=-1, keepdims=True))

def logical(x: f32[A, 5], i: i64[5, A], b: bool[A, 40]
            ) -> (bool[5], bool[A], bool[], bool[1, A], bool[40], bool[]):
  return any(x, axis=0), all(x, axis=1), any(i), all(i, axis=0, keepdims=True), any(b, axis=0), all(b)

def spread(x: f32[A, 3, 4, 5], i: i32[A, 3, 4, 5]
           ) -> (f32[3, 5], f32[1, 3, 1, 1], f32[A, 4], i32[3], bool[3, 5], f32[A, 3, 4, 5]):
  return (sum(x, axis=(0, 2)), mean(x, axis=(0, 2, 3), keepdims=True), max(x, axis=(3, 1)),
          sum(i, axis=(0, 2, 3)), any(x, axis=(0, 2)),
          grad(lambda y: sum(mean(y, axis=(0, 2, 3), keepdims=True) * y))(x))

def divided(x: f32[A, 5], y: f32[5], d: f64[A], e: f64[A], h: f16[A, 3]
            ) -> (f32[A, 5], f32[A, 5], f64[A], f64[A], f16[A, 3], f16[A, 3], f32[A, 5]):
  return (x // y, x % y, d // e, d % e, h % 1.5, h // -0.75,
          grad(lambda z: sum((z % y) * z))(x))

def int_products(a: i32[A, 5], b: i32[5, 3], c: i64[2, 1, A, 4], d: i64[3, 4, 2], u: u32[A],
                 w: u32[A, 3]) -> (i32[A, 3], i64[2, 3, A, 2], u32[3], i32[A], i32[3, A]):
  return a @ b, c @ d, u @ w, a @ b[:, 1], einsum("ij,jk->ki", a, b)

def empty_int_product(e: i32[A, 0], f: i32[0, 2]) -> i32[A, 2]:
  return e @ f

def viewed_then_copied(x: f32[A, 3], a: f64[N]) -> (f32[3, A], f32, f64[3, 2, N], f64):
  t = transpose(x)
  b = broadcast_to(expand_dims(a * 2.0, 0), [3, N])
  s = stack([b, b], axis=1)
  return sort(t, axis=-1), max(t), s - max(s, axis=-1, keepdims=True), min(b, axis=(-2, 1))

def running(xs: f32[T, N], w: f32[N]) -> (f32[N], f32[N], f32[N], f32[T, 2 * N], f32[T]):
  stacked, means = fold x in xs with total = 0.0, top = zeros([N]) - 1e9, kept = w:
    total = total + x * w
    top = maximum(top, x)
    return concat([x, total], axis=0), mean(x)
  return total, top, kept, stacked, means
"""


def program() -> dsl.Program:
    """SOURCE compiled anew (its imports from tests/programs)."""
    return dsl.loads(SOURCE, name=str(PROGRAMS / "native_step.bend"), device="cpu")


PROGRAM = program()
rng = np.random.default_rng(5)


def floats(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def sprinkled(x: np.ndarray, specials: tuple) -> np.ndarray:
    """x with each (start, step, value) of specials written at x.flat[start::step]."""
    for start, step, value in specials:
        x.reshape(-1)[start::step] = value
    return x


def awkward(*shape: int) -> np.ndarray:
    """Floats among few values, so that extremes tie: with signed zeros, NaNs and infinities."""
    return sprinkled(rng.integers(-2, 3, shape).astype(np.float32),
                     ((0, 7, -0.0), (3, 11, np.nan), (5, 13, np.inf), (6, 17, -np.inf)))


def summable(*shape: int) -> np.ndarray:
    """Floats whose sums depend on their order, with signed zeros, NaNs and +inf (a sum that
    meets inf and -inf makes a NaN whose sign docs/numerics.md leaves open)."""
    return sprinkled(floats(*shape), ((0, 7, -0.0), (3, 23, np.nan), (5, 29, np.inf)))


def dividends(n: int) -> np.ndarray:
    """f64 of every magnitude (quotients up to 2^2000), with zeros, infinities and NaNs."""
    x = rng.standard_normal(n) * np.exp2(rng.integers(-1070, 1020, n).astype(np.float64))
    return sprinkled(x, ((0, 5, -0.0), (1, 7, 0.0), (2, 11, np.inf), (4, 13, np.nan)))


def int_operands(n: int) -> list[np.ndarray]:
    """int_products' operands, of the whole range of each dtype (their sums wrap)."""
    return [full_range(rng, "int32", n, 5), full_range(rng, "int32", 5, 3),
            full_range(rng, "int64", 2, 1, n, 4), full_range(rng, "int64", 3, 4, 2),
            full_range(rng, "uint32", n), full_range(rng, "uint32", n, 3)]


def indices(high: int, *shape: int) -> np.ndarray:
    return rng.integers(0, max(high, 1), shape).astype(np.int32)


# (entry, its arguments at sizes 0, 1 and primes)
CASES = [("mlp", lambda n: [floats(n, 7), floats(7, 13), floats(13), floats(13, n)]),
         ("mlp", lambda n: [floats(3, n), floats(n, 5), floats(5), floats(5, 2)]),
         ("attention", lambda n: [floats(2, n, 5), floats(2, n, 5)]),
         ("heads", lambda n: [floats(2, n, 3, 2, 5)]),
         ("heads_grad", lambda n: [floats(3, 4, 3, 2, n)]),
         ("grouped_heads", lambda n: [floats(3, 2, 4, 3, n, 5)]),
         ("row", lambda n: [floats(3, n), floats(n, 5)]),
         ("embedding_grad", lambda n: [floats(11, 3), indices(11, n, 2)]),
         ("scattered", lambda n: [floats(7, n), indices(7, 5), floats(5, n)]),
         ("running", lambda n: [floats(n, 6), floats(6)]),
         ("stacked", lambda n: [floats(n, 5), floats(n, 5)]),
         ("stacked", lambda n: [floats(3, n), floats(3, n)]),
         ("halves", lambda n: [floats(n, 6), floats(6, n)]),
         ("heads_concat", lambda n: [floats(2, n, 3, 4)]),
         ("columns", lambda n: [floats(n, 3), floats(3, n).astype(np.float64), indices(2, n, 2) > 0]),
         ("scattered_steps", lambda n: [floats(7, n), indices(7, 3, 2), floats(2, 3, n)]),
         ("gathered", lambda n: [floats(5, 2, n), indices(5, 4)]),
         ("extremes", lambda n: [awkward(n, 5), awkward(5, n).astype(np.float64),
                                 indices(3, n, 3), indices(4, n, 4).astype(np.int64),
                                 rng.integers(0, 2 ** 32, (n, 2), dtype=np.uint32),
                                 rng.random((n, 2)) < 0.5]),
         ("extreme_all", lambda n: [awkward(n + 1, 3)]),
         ("counted", lambda n: [full_range(rng, "int32", n, 5), full_range(rng, "int64", 5, n),
                                full_range(rng, "uint32", n, 3),
                                rng.random((n, 4)) < 0.3, rng.random((4, 8 * n)) < 0.7]),
         ("logical", lambda n: [awkward(n, 5), indices(3, 5, n).astype(np.int64), rng.random((n, 40)) < 0.9]),
         ("spread", lambda n: [summable(n, 3, 4, 5), full_range(rng, "int32", n, 3, 4, 5)]),
         ("divided", lambda n: [awkward(n, 5) * 1.75, awkward(5), dividends(n), dividends(n),
                                awkward(n, 3).astype(np.float16) * np.float16(2.5)]),
         ("int_products", lambda n: int_operands(n)),
         ("empty_int_product", lambda n: [full_range(rng, "int32", n, 0),
                                          full_range(rng, "int32", 0, 2)]),
         ("viewed_then_copied", lambda n: [awkward(n, 3), awkward(n).astype(np.float64)]),
         ("drawn", lambda n: [dsl.key(n), np.array(0.3, np.float32), np.array(0.6), np.array(-n, np.int32),
                              floats(n, 3)])]
# folds whose compiled gradients are not the interpreter's bits: checked against the walk's
# (a Python loop calling the compiled body)
LOOPS = [("lstm_grad", lambda n: [cell(3, 5), floats(n, 2, 3), floats(2, 5), floats(2, 5)]),
         ("lstm_grad", lambda n: [cell(n, 2), floats(4, 3, n), floats(3, 2), floats(3, 2)])]


def cell(D: int, H: int) -> dict[str, np.ndarray]:
    return {"Wx": floats(D, 4 * H), "Wh": floats(H, 4 * H), "b": floats(4 * H)}


def lowered(name: str, args: list[np.ndarray]):
    low, inputs = PROGRAM.lower(name, tuple(args), {})
    return low.function, inputs.arrays


def three_ways(case: tuple[int, int, int], cases: list = CASES) -> list[str]:
    """In a child: where the native step's results' bytes differ from the walk's and the
    interpreter's (its math functions the compiled ones: tests/backend/test_rows.py), every
    run shared by the threads and cut as finely as it goes."""
    (name, make), n, threads = cases[case[0]], case[1], case[2]
    os.environ["DSLC_THREADS"] = str(threads)
    cpu.MIN_RUN_WORK, cpu.MIN_CHUNK_WORK = 0, 1
    contract.MIN_MULTIPLY_ADDS_PER_THREAD = contract.IN_STEP_MULTIPLY_ADDS_PER_THREAD = 1
    fn, arrays = lowered(name, make(n))
    given = contents(arrays)
    exe = Executable(fn)
    native = exe.run(arrays)
    touched = written(arrays, given)
    walked = exe.walk(arrays)
    wanted = reference(fn, arrays) if cases is CASES else walked
    return touched + [
        f"result {i}: {how}" for i, (a, b, c) in enumerate(zip(native, walked, wanted))
        for how, other in (("walk", b), ("interpreter", c))
        if a.shape != other.shape or a.dtype != other.dtype or a.tobytes() != other.tobytes()]


def two_ways(case: tuple[int, int, int]) -> list[str]:
    """three_ways for a case of LOOPS, against the walk alone."""
    return three_ways(case, LOOPS)


@pytest.mark.parametrize("check, cases", [(three_ways, CASES), (two_ways, LOOPS)])
def test_the_native_step_has_the_bits_of_the_walk_and_the_interpreter(check, cases):
    every = [(c, n, t) for c in range(len(cases)) for n in (0, 1, 7, 13) for t in (1, 2, 3)]
    outcomes = {case: (how, value) for case, how, value in isolated(check, every, 300, jobs=2)}
    assert {case: o for case, o in outcomes.items() if o != ("ok", [])} == {}
    assert len(outcomes) == len(every)


def segments(exe: Executable) -> list[str]:
    """The plan's items: the native calls of each segment, and the steps Python runs."""
    return [" ".join(type(c).__name__ for c in x.calls) if isinstance(x, Native) else
            exe.plan.steps[x].op.primitive.name for x in exe.native.items]


def test_a_step_without_host_steps_is_one_native_call():
    fn, _ = lowered("mlp", [floats(4, 7), floats(7, 13), floats(13), floats(13, 4)])
    exe = Executable(fn)
    assert segments(exe) == ["ProductCall ProductCall"]
    assert exe.native.items[0].function is not None


@pytest.mark.parametrize("entry, args", [
    ("counted", [full_range(rng, "int32", 4, 5), full_range(rng, "int64", 5, 4),
                 full_range(rng, "uint32", 4, 3),
                 rng.random((4, 4)) < 0.5, rng.random((4, 32)) < 0.5]),
    ("logical", [awkward(4, 5), indices(3, 5, 4).astype(np.int64), rng.random((4, 40)) < 0.5]),
    ("spread", [summable(4, 3, 4, 5), full_range(rng, "int32", 4, 3, 4, 5)]),
    ("divided", [awkward(4, 5), awkward(5), dividends(4), dividends(4),
                 awkward(4, 3).astype(np.float16)]),
    ("int_products", int_operands(4))])
def test_integer_and_bool_reductions_float_division_and_integer_products_are_in_the_native_call(
        entry, args):
    fn, _ = lowered(entry, args)
    assert segments(Executable(fn)) == ["RunCall"]


@pytest.mark.parametrize("entry, qkv", [("heads", (2, 8, 3, 4, 16)), ("heads_grad", (2, 8, 3, 4, 16)),
                                        ("grouped_heads", (2, 2, 8, 3, 4, 16))])
def test_products_of_heads_sliced_from_one_array_are_in_the_native_call(entry, qkv):
    fn, _ = lowered(entry, [floats(*qkv)])
    assert [x for x in segments(Executable(fn)) if "ProductCall" not in x] == []


def test_stacks_and_concats_of_views_are_copies_in_the_native_call():
    fn, _ = lowered("stacked", [floats(4, 5), floats(4, 5)])
    assert segments(Executable(fn)) == ["RunCall CopyCall CopyCall CopyCall RunCall CopyCall "
                                        "CopyCall RunCall CopyCall CopyCall"]
    fn, _ = lowered("halves", [floats(4, 6), floats(6, 4)])       # (a transpose's columns too)
    assert segments(Executable(fn)) == ["RunCall CopyCall CopyCall CopyCall CopyCall CopyCall CopyCall"]
    fn, _ = lowered("columns", [floats(4, 3), floats(3, 4).astype(np.float64), indices(2, 4, 2) > 0])
    assert segments(Executable(fn)) == ["RunCall CopyCall CopyCall CopyCall CopyCall CopyCall CopyCall"]
    fn, _ = lowered("heads_concat", [floats(2, 5, 3, 4)])     # heads' rows of a transpose
    assert segments(Executable(fn)) == ["RunCall CopyCall CopyCall"]


@pytest.mark.parametrize("entry, args, want", [
    ("scattered_steps", [floats(7, 5), indices(7, 3, 2), floats(2, 3, 5)], "CopyCall ScatterCall"),
    ("gathered", [floats(5, 2, 6), indices(5, 4)], "CopyCall TakeCall")])
def test_a_strided_operand_of_a_scatter_or_a_gather_is_copied_in_the_native_call(entry, args, want):
    assert segments(Executable(lowered(entry, args)[0])) == [want]


@pytest.mark.parametrize("entry, args, want", [
    ("lstm_grad", [cell(3, 5), floats(6, 2, 3), floats(2, 5), floats(2, 5)],
     ["ProductCall ScanCall RunCall ScanCall"]),          # (every step's x @ Wx first)
    ("running", [floats(5, 6), floats(6)], ["ScanCall"]),
    ("running", [floats(0, 6), floats(6)], ["scan"])])
def test_a_fold_whose_body_is_native_is_a_loop_in_the_native_call(entry, args, want):
    assert segments(Executable(lowered(entry, args)[0])) == want


def test_a_names_mlp_steps_calls_are_the_ones_it_needs():
    prog = dsl.load(str(EXAMPLES / "names_mlp.bend"), device="cpu")
    B, T, E, H, V = 32, 3, 10, 200, 27
    p = {"C": floats(V, E), "W1": floats(T * E, H), "b1": floats(H), "W2": floats(H, V),
         "b2": floats(V)}
    s = (np.zeros((), np.int32), {k: np.zeros_like(v) for k, v in p.items()},
         {k: np.zeros_like(v) for k, v in p.items()})
    low, _ = prog.lower("step", (p, s, indices(V, B, T), indices(V, B), np.float32(0.01)), {})
    exe = prog.executable(low.function)
    assert segments(exe) == ["TakeCall ProductCall ProductCall RunCall TakeCall RunCall ProductCall "
                             "ProductCall RunCall ProductCall ProductCall ScatterCall RunCall"]
    assert exe.native.items[0].function is not None


@pytest.mark.parametrize("example", ["xor", "names_mlp", "lstm_chars", "cnn_digits", "resnet_digits",
                                     "bert", "gpt"])
def test_every_examples_training_step_is_one_native_call(example):
    """dslc train's step of each example, at its batch size: argmaxes, draws, keys, folds,
    gathers, scatters, concats of views, all in the one call."""
    model = Model(str(EXAMPLES / f"{example}.bend"), device="cpu")
    p, s = model.init(0)
    split = model.split("train")
    size = {**DEFAULTS, **model.loader.settings}["batch_size"]
    batch = split.fetch(batch_indices(0, 0, split.size, size))
    args = model.bind("step", (p, s) if model.has["init_opt"] else (p,), batch, model.hyper(0),
                      step_key(0, 0))
    low, _ = model.prog.lower("step", (), args)
    exe = model.prog.executable(low.function)
    assert len(exe.native.items) == 1 and isinstance(exe.native.items[0], Native), segments(exe)


@pytest.mark.parametrize("entry, args, call, message", [
    ("scattered", (floats(7, 3), np.array([1, 99, 2], np.int32), floats(3, 3)), ScatterCall,
     "index 99 is out of bounds for axis 0 with size 7"),
    ("embedding_grad", (floats(7, 3), np.array([[1, 2], [99, 0]], np.int32)), TakeCall,
     "index 99 is out of bounds for axis 0 with size 7")])
def test_an_index_out_of_range_in_a_native_call_is_reported_as_the_walk_reports_it(
        entry, args, call, message):
    fn, _ = lowered(entry, list(args))
    assert any(isinstance(c, call) for x in Executable(fn).native.items
               if isinstance(x, Native) for c in x.calls)
    raises(lambda: getattr(PROGRAM, entry)(*args), message)


def test_a_second_call_of_the_same_signature_is_not_lowered_again(monkeypatch):
    prog = program()
    made = lowerings(prog, monkeypatch)
    x, W, b, V2 = floats(4, 7), floats(7, 13), floats(13), floats(13, 4)
    first = prog.mlp(x, W, b, V2)
    second = prog.mlp(x + 1, W, b, V2)
    assert made == ["mlp"]
    assert second.tobytes() == PROGRAM.mlp(x + 1, W, b, V2).tobytes() != first.tobytes()
    prog.mlp(floats(5, 7), W, b, V2)                # a new shape
    assert made == ["mlp"] * 2


def test_a_wrong_input_after_a_fast_call_gets_the_full_paths_diagnostic():
    prog = program()
    C = floats(5, 3)
    prog.embedded(C)
    raises(lambda: prog.embedded(C[0]), "'C'")
    raises(lambda: prog.embedded([C]), "'C'")
    raises(lambda: prog.embedded(C.astype(np.float64)), "expected f32[V, E], got f64[5, 3]")


def test_an_array_passed_twice_then_two_arrays_are_not_mixed_up():
    prog = program()
    q = floats(2, 3, 5)
    prog.attention(q, q)
    k = floats(2, 3, 5)
    got = prog.attention(q, k)
    want = PROGRAM.attention(q, k)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want))


def test_a_python_number_for_a_tensor_is_its_value_at_each_call():
    prog = dsl.loads("def f(x: f32[N], s: f32) -> f32[N]:\n  return x * s\n", device="cpu")
    x = floats(4)
    assert prog.f(x, 2.0).tobytes() == (x * 2).tobytes()
    assert prog.f(x, 3.0).tobytes() == (x * 3).tobytes()
    assert prog.f(x, -0.0).tobytes() == (x * -0.0).tobytes()
