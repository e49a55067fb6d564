"""The fast path of calls (dsl/fastcall.py): a signature's compiled check accepts exactly the
arguments whose signature is the one it was made for, and hands back their arrays; a training
loop that passes a step's results back in (records, keys) and a gradient called from Python
take it, with the bits of the full path."""
from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

import dsl
from conftest import lowerings, raises
from dsl.fastcall import Signatures, _signature, compile_check
from dsl.values import Key, Record

rng = np.random.default_rng(11)
A = rng.standard_normal((3, 4)).astype(np.float32)
B = rng.standard_normal((4,)).astype(np.float32)

# argument lists a call may be given, every pair compared: containers of each kind, arrays of
# other shapes, dtypes and layouts, one array in two places, numbers that differ only in type
# or in the sign of zero, and leaves the fast path does not know
VALUES = [
    ((A, B), {}),
    ((A.copy(), B.copy()), {}),
    ((A, A), {}),
    ((A, B.copy()), {}),
    ((B, A), {}),
    ((A.T, B), {}),
    ((A.astype(np.float64), B), {}),
    ((A[:2], B), {}),
    ((A, [B]), {}),
    ((A, (B,)), {}),
    ((A, B), {"n": 3}),
    ((A, B), {"n": 3.0}),
    ((A, B), {"n": True}),
    ((A, B), {"n": -0.0}),
    ((A, B), {"n": 0.0}),
    ((A, B), {"n": float("nan")}),
    ((A, B), {"n": np.float32(3)}),
    ((A, B), {"n": "3"}),
    (({"W": A, "b": B},), {}),
    (({"b": B, "W": A},), {}),
    ((Record("P", {"W": A, "b": B}),), {}),
    ((Record("P", {"W": A.copy(), "b": B}),), {}),
    (({"W": A, "b": B, "c": B},), {}),
    ((Key(np.array([1, 2], np.uint32)),), {}),
    ((Key(np.array([3, 4], np.uint32)),), {}),
    ((Key(np.array([1, 2], np.int64)),), {}),
    ((object(),), {}),
    ((), {}),
]


def signed(args: tuple, kwargs: dict) -> tuple:
    """The signature of a call's arguments, its arrays and its float numbers."""
    leaves: list[np.ndarray] = []
    numbers: list = []
    return _signature((args, kwargs), leaves, {}, numbers), leaves, numbers


@pytest.mark.parametrize("made, given", list(itertools.product(range(len(VALUES)), repeat=2)))
def test_a_check_accepts_exactly_its_signature(made, given):
    key, leaves, numbers = signed(*VALUES[made])
    if key is None:                     # never remembered: no check is made
        return
    statics = tuple((i, repr(n)) for i, n in enumerate(numbers))      # every number by value
    check = compile_check(VALUES[made], list(range(len(leaves))), statics)
    got = check(*VALUES[given])
    other, leaves, numbers = signed(*VALUES[given])
    if other != key or tuple((i, repr(n)) for i, n in enumerate(numbers)) != statics:
        assert got is None
    else:
        assert [id(a) for a in got] == [id(a) for a in leaves]


def test_a_check_hands_back_the_arrays_in_the_lowerings_order_with_its_constants():
    constant = np.array(2.5, np.float32)
    args = ((A, B), {"n": 2.5})
    check = compile_check(args, [1, constant, 0], ((0, "2.5"),))
    C, D = A + 1, B + 1
    assert [id(a) for a in check((C, D), {"n": 2.5})] == [id(D), id(constant), id(C)]
    assert check((C, D), {"n": 2.0}) is None


@pytest.mark.parametrize("number_type", [float, np.float16, np.float32, np.float64, np.longdouble])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_check_makes_the_array_of_a_float_it_holds_by_type(dtype, number_type):
    """As from_python makes it: rounded to the dtype, NaN and infinities kept; a float beyond
    the dtype's finite range (from_python's error) takes the full path; and without a warning
    of NumPy's, whatever the float's type."""
    check = compile_check(((A,), {"lr": number_type(0.5)}), [0, (0, np.dtype(dtype))], ())
    with np.errstate(over="ignore"):
        lrs = [number_type(v) for v in (0.1, -0.0, 1e-40, "nan", "inf", 3.4028235e38, 3.4028236e38, 1e300)]
        if number_type is np.longdouble:
            lrs += [np.longdouble("1.797693134862315807e308"), np.longdouble("1.797693134862315808e308"),
                    np.longdouble("1e4000")]
    for lr in lrs:
        with np.errstate(over="ignore"):
            want = np.asarray(lr).astype(dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = check((A,), {"lr": lr})
        if np.isinf(want) and not np.isinf(lr):
            assert got is None
            continue
        assert got[0] is A and got[1].shape == () and got[1].dtype == dtype
        assert got[1].tobytes() == want.tobytes()
    assert check((A,), {"lr": 1}) is None
    assert check((A,), {"lr": np.float32(0.1) if number_type is not np.float32 else 0.1}) is None


def test_the_signature_last_met_is_checked_first_and_another_is_still_found():
    signatures = Signatures()
    small, large = (A[:2].copy(), B), (A, B)
    signatures.remember(small, {}, "small", list(small), {})
    signatures.remember(large, {}, "large", list(large), {})
    assert signatures.get((A + 1, B), {})[0] == "large"
    assert signatures.get(small, {})[0] == "small"
    assert signatures.get((A, B.astype(np.float64)), {}) is None


def test_a_float_that_made_an_array_is_held_by_type_and_one_that_did_not_by_value():
    signatures = Signatures()
    lr, scale, twice = 0.1, 2.0, 0.5
    made = np.array(lr, np.float32)
    # lr made the call's second array; scale made none (a static); twice made the third, but
    # is also passed in a second place, where it made the fourth: which made which is unknown
    args = (A, lr, scale, twice, twice)
    signatures.remember(args, {}, "step", [A, made, np.array(twice), np.array(twice)],
                        {1: lr, 2: twice, 3: twice})
    lowered, arrays = signatures.get((A, 0.25, 2.0, twice, twice), {})
    assert lowered == "step" and arrays[0] is A and arrays[1].tobytes() == np.float32(0.25).tobytes()
    assert float(arrays[2]) == float(arrays[3]) == twice
    assert signatures.get((A, 0.25, 3.0, twice, twice), {}) is None     # a static's new value
    assert signatures.get((A, 0.25, 2.0, 0.75, 0.75), {}) is None       # held by value


LOOP = """
object P { W: f32[D, H], b: f32[H] }

def init(k: Key, D: int, H: int) -> P:
  return P { W: normal(k, [D, H]) * 0.1, b: zeros([H]) }

def loss(p: P, x: f32[B, D], y: f32[B, H]) -> f32:
  return mean((tanh(x @ p.W + p.b) - y) * (tanh(x @ p.W + p.b) - y))

def step(p: P, k: Key, x: f32[B, D], y: f32[B, H]) -> (P, Key, f32):
  l, g = value_and_grad(loss, wrt=p)(p, x + 0.01 * normal(k, [B, D]), y)
  return P { W: p.W - 0.1 * g.W, b: p.b - 0.1 * g.b }, split(k, 2)[1], l
"""


def test_a_loop_that_passes_a_steps_records_and_keys_back_takes_the_fast_path(monkeypatch):
    prog = dsl.loads(LOOP, device="cpu")
    reference = dsl.loads(LOOP, device="cpu")
    made = lowerings(prog, monkeypatch)
    x, y = rng.standard_normal((8, 5)).astype(np.float32), rng.standard_normal((8, 3)).astype(np.float32)
    p, k = prog.init(dsl.key(0), 5, 3), dsl.key(1)
    q, j = p, k
    for _ in range(4):
        p, k, loss = prog.step(p, k, x, y)
        q, j, want = reference.step(dict(q), Key(j.words.copy()), x, y)   # plain dicts' bits
        assert type(p) is Record and type(k) is Key
        assert loss.tobytes() == want.tobytes() and p.W.tobytes() == q["W"].tobytes()
    assert made == ["init", "step"]


def test_a_gradient_from_python_takes_the_fast_path_with_the_full_paths_bits(monkeypatch):
    prog = dsl.loads(LOOP, device="cpu")
    made = lowerings(prog, monkeypatch)
    x, y = rng.standard_normal((8, 5)).astype(np.float32), rng.standard_normal((8, 3)).astype(np.float32)
    p = dict(prog.init(dsl.key(0), 5, 3))
    value_and_grad = prog.value_and_grad("loss", "p")
    first = value_and_grad(p, x, y)
    again = value_and_grad(p, x, y)
    other = prog.grad("loss", ("p", "x"))(p, x, y)
    assert made == ["init", "loss", "loss"]      # one lowering for each gradient
    assert type(again[1]) is Record and again[1].keys() == {"W", "b"}
    assert all(first[1][f].tobytes() == again[1][f].tobytes() == other[0][f].tobytes() for f in "Wb")
    assert first[0].tobytes() == again[0].tobytes() and other[1].shape == x.shape
    value_and_grad(p, x[:4], y[:4])                   # a new batch size
    assert made[-1:] == ["loss"] and len(made) == 4
    raises(lambda: value_and_grad(p, x.astype(np.float64), y), "argument 'x' of 'loss'", "got f64[8, 5]")


SCHEDULED = LOOP + """
def sgd(p: P, x: f32[B, D], y: f32[B, H], lr: f32, decay: float) -> P:
  g = grad(loss, wrt=p)(p, x, y)
  return P { W: p.W * decay - lr * g.W, b: p.b - lr * g.b }
"""


def test_a_learning_rate_schedule_of_python_floats_is_lowered_once(monkeypatch):
    """lr, a float for an f32 tensor, is held by type: each call's value reaches the step,
    with the bits of a 0-d array; decay, a static float, is held by value."""
    prog = dsl.loads(SCHEDULED, device="cpu")
    reference = dsl.loads(SCHEDULED, device="cpu")
    made = lowerings(prog, monkeypatch)
    x, y = rng.standard_normal((8, 5)).astype(np.float32), rng.standard_normal((8, 3)).astype(np.float32)
    p = q = prog.init(dsl.key(0), 5, 3)
    for t in range(5):
        lr = 0.1 / (t + 1)
        p = prog.sgd(p, x, y, lr, 0.99)
        q = reference.sgd(q, x, y, np.array(lr, np.float32), 0.99)
        assert p.W.tobytes() == q.W.tobytes() and p.b.tobytes() == q.b.tobytes()
    assert made == ["init", "sgd"]
    prog.sgd(p, x, y, 0.1, 0.98)
    assert made == ["init", "sgd", "sgd"]
    raises(lambda: prog.sgd(p, x, y, 1e300, 0.99), "'lr' must be f32: a number too large for f32")
