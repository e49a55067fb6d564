"""The optimisation passes (ir/passes.py) keep what a program means."""
from __future__ import annotations

import numpy as np
import pytest

import dsl
from conftest import dslc
from ir.core import Builder, tensor_type
from ir.ops.elementwise import Sub
from ir import interp, passes
from ir.ad import grad_function
from ir.ops.base import Role
from ir.ops.contract import MatMul
from ir.ops.control import Scan
from ir.ops.shape import Transpose
from ir.passes import SIMPLIFY, dce, for_backends, hoist, rematerialize, simplify
from runtime.cpu import Executable, plan
from ir.patterns import X, pat, rewrite, rules


@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_an_empty_tensor_keeps_its_shape(device):
    """Constant folding must not turn zeros([0, 3]) into a literal: a nested tuple of numbers
    cannot say it has 3 columns, and the result came back as f32[0] (a model's empty table of
    learned positions, with RoPE, then no longer fitted its record)."""
    prog = dsl.loads("""
object P { z: f32[N, D], w: f32[D] }
def init(N: int, D: int) -> P:
  return P { z: zeros([N, D]), w: ones([D]) }
def loss(p: P, x: f32[D]) -> f32:
  return sum(p.w * x) + sum(p.z)
""", name="empty.bend", device=device)
    p = prog.init(N=0, D=3)
    assert p["z"].shape == (0, 3)
    g = prog.grad("loss", wrt="p")(p, np.ones(3, np.float32))
    assert g["z"].shape == (0, 3) and np.array_equal(g["w"], np.ones(3, np.float32))


@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_a_fold_body_without_ops_is_kept(device):
    """A fold whose new state is the element (s = x) has a body of no ops; the passes took a
    Function of no ops for false (its __len__) and dropped it, and both devices crashed."""
    prog = dsl.loads("""
def last(xs: f32[T, 2]) -> f32[2]:
  fold x in xs with s = zeros([2]):
    s = x
  return s
def each(xs: f32[T, 2]) -> f32[T, 2]:
  ys = fold x in xs with s = zeros([2]):
    s = x
    return s
  return ys
def loss(xs: f32[T, 2]) -> f32:
  return sum(last(xs) * 3.0)
""", name="fold.bend", device=device)
    xs = np.arange(8, dtype=np.float32).reshape(4, 2)
    np.testing.assert_array_equal(prog.last(xs), xs[-1])
    np.testing.assert_array_equal(prog.each(xs), xs)
    want = np.zeros_like(xs)
    want[-1] = 3.0
    np.testing.assert_array_equal(prog.grad("loss", wrt="xs")(xs), want)


# ---------------------------------------------------------------- the rule matcher (ir/patterns.py)

def _ir(build):
    """The ops build(b, x, y) makes from two f32[2, 3] parameters, its result and its producers."""
    b = Builder()
    x, y = b.param(tensor_type("f32", (2, 3))), b.param(tensor_type("f32", (2, 3)))
    out = build(b, x, y)
    producer = {v: op for op in b.ops for v in op.outputs}
    return x, y, producer[out], producer


def _rewrite(table, build):
    x, y, op, producer = _ir(build)
    emitted = Builder()
    return x, y, rewrite(table, op, producer, emitted), emitted.ops


def test_a_rule_fires_on_the_op_its_pattern_names():
    times_one = lambda b, x, y: b.emit("mul", x, b.constant(1.0, "f32"))
    minus_one = lambda b, x, y: b.emit("sub", x, b.constant(1.0, "f32"))
    x, _, value, emitted = _rewrite(SIMPLIFY, times_one)
    assert value is x and emitted == []
    assert _rewrite(SIMPLIFY, minus_one)[2] is None


def test_a_guard_blocks_a_rule():
    """x * ones([4, 2, 3]) is not x: the result is broadcast, so _same's guard refuses."""
    ones = (((1.0,) * 3,) * 2,) * 4
    _, _, value, _ = _rewrite(SIMPLIFY, lambda b, x, y: b.emit("mul", x, b.constant(ones, "f32")))
    assert value is None


@pytest.mark.parametrize("zero, rewritten", [(-0.0, True), (0.0, False)])
def test_const_compares_bits(zero, rewritten):
    """x + (-0.0) is x for every x; x + 0.0 is not (-0.0 + 0.0 is 0.0)."""
    x, _, value, _ = _rewrite(SIMPLIFY, lambda b, x, y: b.emit("add", x, b.constant(zero, "f32")))
    assert (value is x) is rewritten


def test_nested_patterns_match_the_producers_of_inputs():
    x, _, value, _ = _rewrite(SIMPLIFY, lambda b, x, y: b.emit(
        "transpose", b.emit("transpose", x, perm=(1, 0)), perm=(1, 0)))
    assert value is x
    x, _, value, (reshape,) = _rewrite(SIMPLIFY, lambda b, x, y: b.emit(
        "reshape", b.emit("reshape", x, shape=(6,)), shape=(3, 2)))
    assert reshape.inputs == (x,) and reshape.attrs == {"shape": (3, 2)}
    assert value is reshape.outputs[0]


def test_a_variable_bound_twice_must_see_one_value():
    table = rules((pat(Sub, X, X), lambda X: X))
    assert _rewrite(table, lambda b, x, y: b.emit("sub", x, x))[2] is not None
    assert _rewrite(table, lambda b, x, y: b.emit("sub", x, y))[2] is None


def test_simplify_drops_every_broadcast_an_elementwise_op_does_itself():
    """add(broadcast_to(a), broadcast_to(c)) is add(a, c) when a and c broadcast to the same
    shape without help: the rule drops one operand's broadcast_to, and applies again."""
    b = Builder()
    a, c = b.param(tensor_type("f32", (3,))), b.param(tensor_type("f32", (2, 1)))
    wide = [b.emit("broadcast_to", v, shape=(2, 3)) for v in (a, c)]
    out = b.emit("add", *wide)
    fn = dce(simplify(b.finish([out])))
    (add,) = fn.ops
    assert add.inputs == (a, c) and fn.results[0].type == out.type


RNN = """
def loss(W: f32[H, H], U: f32[D, H], xs: f32[T, B, D]) -> f32:
  hs = fold x in xs with h = zeros([B, H]):
    h = tanh(h @ W + x @ U)
    return h
  return sum(hs * hs)

def weights(W: f32[H, H], U: f32[D, H], xs: f32[T, B, D]) -> (f32[H, H], f32[D, H]):
  return grad(loss, wrt=(W, U))(W, U, xs)

def every(W: f32[H, H], U: f32[D, H], xs: f32[T, B, D]) -> (f32[H, H], f32[D, H], f32[T, B, D]):
  return grad(loss, wrt=(W, U, xs))(W, U, xs)
"""


def test_a_folds_gradient_wrt_its_weights_computes_no_cotangent_of_its_inputs(tmp_path):
    """The backward fold emits each step's input cotangent; where nothing asks for it, dce
    drops the emit and the product x's cotangent took (3 products a step, not 4), and the
    weights' gradients keep their bits."""
    (tmp_path / "rnn.bend").write_text(RNN)
    products = {}
    for entry in ("weights", "every"):
        r = dslc("ir", str(tmp_path / "rnn.bend"), "--entry", entry, "--dims", "H=5,D=3,T=4,B=2")
        assert r.returncode == 0, r.stderr
        products[entry] = r.stdout.count("= matmul(")
    assert products == {"weights": 2 + 3, "every": 2 + 4}, products     # forward + backward
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((5, 5), (3, 5), (4, 2, 3))]
    prog = dsl.loads(RNN, device="cpu")
    for got, want in zip(prog.weights(*args), prog.every(*args)):
        assert got.tobytes() == want.tobytes()


def test_what_a_fold_computes_alike_at_every_step_is_computed_once_before_it():
    """The RNN's forward fold multiplies each step's x by U, and its backward fold reads W as
    Wᵀ at every step: hoist makes xs @ U (one product of all the steps' rows) and Wᵀ (on the
    CPU a contiguous copy, which the fold's native loop reads in place) before the folds, and
    the gradients keep their bits on the interpreter and on the CPU."""
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((5, 5), (3, 5), (4, 2, 3))]
    low, _ = dsl.loads(RNN, device="cpu").lower("loss", tuple(args), {})
    raw = dce(grad_function(low.function, [0, 1]))      # (without the cotangent of xs: no Uᵀ)
    fn = hoist(raw)
    W, U, xs = fn.params
    forward, backward = [op for op in fn.ops if isinstance(op.primitive, Scan)]
    before = {op.primitive.name: op for op in fn.ops[:fn.ops.index(backward)]
              if isinstance(op.primitive, (MatMul, Transpose))}
    assert before["matmul"].inputs == (xs, U) and before["transpose"].inputs == (W,)
    assert before["matmul"].outputs[0] in forward.inputs
    assert before["transpose"].outputs[0] in backward.inputs
    for scan in (forward, backward):
        a = scan.attrs
        sequences = set(scan.body.params[a["n_state"]:a["n_state"] + a["n_xs"]])
        constants = set(scan.body.params[a["n_state"] + a["n_xs"]:])
        assert not [op for op in scan.body.ops if isinstance(op.primitive, Transpose)
                    and set(op.inputs) <= constants]
        assert not [op for op in scan.body.ops if isinstance(op.primitive, MatMul)
                    and op.inputs[0] in sequences and op.inputs[1] in constants]
    # (the CPU's tanh is within its documented ulps of NumPy's: each device against itself)
    for run in (lambda f: interp.run(f, args), lambda f: Executable(f).run(args)):
        assert [g.tobytes() for g in run(fn)] == [w.tobytes() for w in run(raw)]


GELU_MLP = """
from nn import gelu

def loss(w1: f32[D, H], b1: f32[H], w2: f32[H, O], x: f32[B, D]) -> f32:
  return sum(gelu(x @ w1 + b1, "tanh") @ w2)
"""


def _read_past_a_product(fn) -> list[str]:
    """The primitives that make the arrays an elementwise op reads with a contraction between
    it and where they are made (what the forward pass keeps for the backward), literals aside."""
    made, products, read = {}, 0, set()
    for op in fn.ops:
        for v in op.inputs:
            if v in made and made[v][1] < products and op.primitive.role is Role.ELEMENTWISE \
                    and made[v][0] != "constant":
                read.add(v)
        products += op.primitive.role is Role.CONTRACTION
        made.update((v, (op.primitive.name, products)) for v in op.outputs)
    return sorted(made[v][0] for v in read)


def test_the_backward_pass_makes_cheap_values_again_rather_than_keep_them(monkeypatch):
    """A tanh GELU's backward reads x, x/2, 0.044715x, 0.044715x², tanh and 1 + tanh of the
    forward's: rematerialize makes all but x and tanh again beside that use, so that the
    forward keeps two arrays (on the CPU, the product's epilogue stores three instead of
    seven, the GELU's result with them); the gradients keep their bits on the interpreter and
    on the CPU."""
    rng = np.random.default_rng(2)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((6, 7), (7,), (7, 3), (5, 6))]
    low, _ = dsl.loads(GELU_MLP, device="cpu").lower("loss", tuple(args), {})
    raw = dce(grad_function(low.function, [0, 1, 2]))
    fn = dce(rematerialize(raw))
    # (the matmul: a cotangent the backward makes, read past its product for w2)
    assert _read_past_a_product(raw) == ["add", "add", "matmul", "mul", "mul", "mul", "tanh"]
    assert _read_past_a_product(fn) == ["add", "matmul", "tanh"]
    assert [g.tobytes() for g in interp.run(fn, args)] == \
           [w.tobytes() for w in interp.run(raw, args)]
    # the CPU plans for_backends' form, which rematerializes: against a plan without it
    remade = plan(raw, "remade")
    monkeypatch.setattr(passes, "REMADE", ())
    kept = plan(raw, "kept")
    assert remade.memory.size < kept.memory.size
    assert [g.tobytes() for g in Executable(raw, planned=remade).run(args)] == \
           [w.tobytes() for w in Executable(raw, planned=kept).run(args)]


def test_a_result_read_past_a_product_is_kept_not_made_again():
    """A value the function returns lives to its end, so an op past a product that reads it
    reads it where it is (rematerialize asked where a result dies, one past the last op, and
    raised IndexError: found by benchmarks/fuzz_campaign.py --mode grad, seed 50022)."""
    source = ("def f(x: f32[N, N], w: f32[N, N]) -> (f32[N, N], f32[N, N]):\n"
              "  a = exp(x)\n  b = a + 1.0\n  return a, b * (x @ w)\n")
    x = np.random.default_rng(3).standard_normal((5, 5)).astype(np.float32)
    low, _ = dsl.loads(source, device="cpu").lower("f", (x, x), {})
    fn = rematerialize(low.function)
    assert [op.primitive.name for op in fn.ops].count("add") == 2      # b made again past @
    assert [g.tobytes() for g in interp.run(fn, [x, x])] == \
           [w.tobytes() for w in interp.run(low.function, [x, x])]
    assert [g.tobytes() for g in dsl.loads(source, device="cpu").f(x, x)] == \
           [w.tobytes() for w in Executable(low.function).run([x, x])]


def test_the_backends_passes_keep_the_ops_they_do_not_change():
    """for_backends' form of a gradient shares every op it leaves as it was with the function it
    came from: the CPU's cache entry holds both (the lowering and the plan), and a copy of each
    op made the GPT step's entry 800 KB instead of 635, its decoding 43 ms instead of 36."""
    rng = np.random.default_rng(2)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((6, 7), (7,), (7, 3), (5, 6))]
    low, _ = dsl.loads(GELU_MLP, device="cpu").lower("loss", tuple(args), {})
    fn = dce(grad_function(low.function, [0, 1, 2]))
    planned = for_backends(fn)
    values = {v for op in fn.ops for v in op.outputs} | set(fn.params)
    ops = set(fn.ops)
    new = [op for op in planned.ops if op not in ops]
    assert new, "the passes changed nothing: the test would not see a copy"
    # an op that is not fn's reads or makes a value that fn has not: none is a copy of one
    assert [op for op in new if values.issuperset(op.inputs + op.outputs)] == []


def test_zeros_stay_zeros_in_the_printed_ir(tmp_path):
    """Folding made zeros([B, H]) a literal of its every element (2,048 zeros in `dslc ir` of
    an LSTM's gradient, and code that differed by batch size)."""
    (tmp_path / "rnn.bend").write_text(RNN)
    r = dslc("ir", str(tmp_path / "rnn.bend"), "--entry", "weights", "--dims", "H=5,D=3,T=4,B=2")
    assert r.returncode == 0, r.stderr
    assert "= zeros(dtype=f32, shape=(2, 5))" in r.stdout and "(0.0, 0.0" not in r.stdout, r.stdout
