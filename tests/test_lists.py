"""Lists, tuples and records as a user walks them: len, slices, concatenation, zip, enumerate
and leaves, in folds and in results, on the reference interpreter and the CPU backend."""
import numpy as np
import pytest

import dsl
from conftest import raises

SOURCE = """
object Params { W: f32[D, D], b: f32[D] }

def global_norm(p: Params) -> f32:
  fold g in leaves(p) with total = 0.0:
    total = total + sum(g * g)
  return sqrt(total)

def count(p: Params, xs: List(f32[N])) -> (int, int, int):
  return len(leaves(p)), len(xs), len(xs[1:] + xs)

def weighted(xs: List(f32[N]), ys: List(f32[N])) -> f32[N]:
  fold i, (x, y) in enumerate(zip(xs, ys)) with acc = zeros([N]):
    acc = acc + x * y * cast(i, f32)
  return acc

def pieces(x: f32[N]) -> (f32[N], f32[N], f32[N], f32[N]):
  xs = [x, x * 2.0, x * 3.0, x * 4.0]
  evens = xs[::2]
  rest = xs[1:] + [x * 10.0]
  pair = (x,) + (x * 5.0,)
  return evens[1], rest[-1], xs[-1], pair[1]

def tail_sum(xs: List(f32[N])) -> f32[N]:
  fold x in xs[1:] with acc = xs[0] * 0.0:
    acc = acc + x
  return acc
"""

DEVICES = ("reference", "cpu")
X = np.array([1.0, -2.0, 0.5], np.float32)


@pytest.fixture(scope="module", params=DEVICES)
def prog(request):
    return dsl.loads(SOURCE, name="lists.bend", device=request.param)


def test_leaves_fold_over_any_record(prog):
    p = {"W": np.full((2, 2), 2.0, np.float32), "b": np.array([3.0, 4.0], np.float32)}
    assert prog.global_norm(p) == np.float32(np.sqrt(16.0 + 25.0))


def test_len_is_static(prog):
    p = {"W": np.zeros((2, 2), np.float32), "b": np.zeros(2, np.float32)}
    assert prog.count(p, [X, X, X]) == (2, 3, 5)


def test_enumerate_and_zip_in_a_fold(prog):
    got = prog.weighted([X, X, X], [X, 2 * X, 3 * X])
    np.testing.assert_array_equal(got, X * X * 2 + X * X * 3 * 2)


def test_slices_and_concatenation(prog):
    evens, last, end, pair = prog.pieces(X)
    np.testing.assert_array_equal(evens, X * 3)
    np.testing.assert_array_equal(last, X * 10)
    np.testing.assert_array_equal(end, X * 4)
    np.testing.assert_array_equal(pair, X * 5)


def test_fold_over_a_slice_of_a_list_parameter(prog):
    np.testing.assert_array_equal(prog.tail_sum([X, 2 * X, 4 * X]), 6 * X)


def test_two_number_lists_add_as_tensors():
    prog = dsl.loads("def f(x: f32) -> f32[2]:\n  return x + ([1.0, 2.0] + [3.0, 5.0])\n")
    np.testing.assert_array_equal(prog.f(np.float32(1)), [5.0, 8.0])


@pytest.mark.parametrize("body, message", [
    ("fold a, b in zip([x, x], [x]) with acc = x:\n    acc = acc + a * b\n  return acc",
     "2:28: error: zip needs lists of one length: the first has 2 items, this one 1"),
    ("return x * len(Params { W: x, b: x })",
     "2:18: error: len needs a list, a tuple or a tensor with an axis, got Params; "
     "len(leaves(r)) counts a record's tensors"),
    ("fold g in Params { W: x, b: x }:\n    x = x + g\n  return x",
     "2:13: error: fold walks a tensor's leading axis or a static list; got Params; "
     "fold over leaves(r) walks a record's tensors"),
    ("return [x, x][::0][0]", "2:17: error: a slice step cannot be 0"),
    ("return [x, x][0, 1]", "2:10: error: a list or tuple is indexed by one static int or a slice"),
])
def test_bad_list_uses_are_located_errors(body, message):
    source = f"def f(x: f32[N]) -> f32[N]:\n  {body}\nobject Params {{ W: f32[N], b: f32[N] }}\n"
    raises(lambda: dsl.loads(source, name="bad.bend").f(X), f"bad.bend:{message}")
