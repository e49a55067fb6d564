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

def shifted(ps: List(Params), k: Key) -> List(Params):
  return map(lambda p, kp: p with { b: p.b + normal(kp, [D]) }, zip(ps, split(k, len(ps))))

def ranked(xs: List(f32[N])) -> List(f32[N]):
  return map(lambda i, x: x * cast(i, f32), enumerate(xs))

def mixed(xs: List(f32[N]), ys: List(f32[N])) -> List(f32[N]):
  return map(lambda i, xy: xy[0] - xy[1] * cast(i, f32), enumerate(zip(xs, ys)))
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


def test_map_over_zip_passes_whole_items_at_each_position(prog):
    """A record and a key per position: map does not walk into the pair's leaves."""
    p = {"W": np.eye(2, dtype=np.float32), "b": np.zeros(2, np.float32)}
    got = prog.shifted([p, p, p], dsl.key(3))
    keys = [dsl.loads("def f(k: Key) -> Key:\n  return split(k, 3)[%d]\n" % i).f(dsl.key(3)) for i in range(3)]
    noise = [dsl.loads("def f(k: Key) -> f32[2]:\n  return normal(k, [2])\n").f(k) for k in keys]
    assert len(got) == 3
    for q, n in zip(got, noise):
        np.testing.assert_array_equal(q["W"], p["W"])
        np.testing.assert_array_equal(q["b"], n)
    assert not np.array_equal(got[0]["b"], got[1]["b"])


def test_map_over_enumerate_passes_the_position_and_the_item(prog):
    got = prog.ranked([X, X, X])
    assert [g.tolist() for g in got] == [(X * i).tolist() for i in range(3)]
    got = prog.mixed([X, 2 * X], [3 * X, 5 * X])
    assert [g.tolist() for g in got] == [X.tolist(), (2 * X - 5 * X).tolist()]


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
    ("return map(lambda a, b: a * b, zip([x, x], [x]))[0]",
     "2:46: error: zip needs lists of one length: the first has 2 items, this one 1"),
    ("return map(lambda i, r: r, enumerate(x))[0]", "2:40: error: enumerate needs lists or tuples, got f32[3]"),
    ("return map(lambda a: a, zip([x, x]), [x])[0]",
     "2:27: error: map over a zip or an enumerate takes no other structures: zip them all together"),
    ("return map(lambda a: a, zip([x, x], [x, x]))[0]", "2:10: error: the lambda takes 1 argument"),
    ("return [x, x][0, 1]", "2:10: error: a list or tuple is indexed by one static int or a slice"),
])
def test_bad_list_uses_are_located_errors(body, message):
    source = f"def f(x: f32[N]) -> f32[N]:\n  {body}\nobject Params {{ W: f32[N], b: f32[N] }}\n"
    raises(lambda: dsl.loads(source, name="bad.bend").f(X), f"bad.bend:{message}")
