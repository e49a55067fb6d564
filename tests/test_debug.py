"""debug and assert_finite inside a program, and run-time errors at the expression that
failed, on the reference interpreter and the CPU backend."""
import numpy as np
import pytest

import dsl
from conftest import raises

SOURCE = """from nn import cross_entropy

def f(x: f32[N]) -> f32:
  h = x * 2.0
  debug(h, "h")
  g = debug(h + 1.0, "g") * 3.0
  return sum(g)

def steps(xs: f32[T, N]) -> f32[N]:
  fold x in xs with acc = zeros([N]):
    acc = debug(acc + x, "acc")
  return acc

def df(x: f32[N]) -> f32[N]:
  return grad(f)(x)

def ints(i: i32[N]) -> i32[N]:
  return debug(i, "i") + 1

def finite(x: f32[N]) -> f32[N]:
  return assert_finite(log(x), "log x") * 2.0

def pick(x: f32[N], i: i32[K]) -> f32[K]:
  return x[i] * 2.0

def loss(logits: f32[B, V], y: i32[B]) -> f32:
  return cross_entropy(logits, y)
"""

DEVICES = ("reference", "cpu")
X = np.array([0.5, -1.0, np.nan], np.float32)


@pytest.fixture(scope="module", params=DEVICES)
def prog(request):
    return dsl.loads(SOURCE, name="dbg.bend", device=request.param)


def test_debug_prints_in_program_order_and_keeps_the_result(prog, capsys):
    assert np.isnan(prog.f(X))
    assert prog.f(np.array([1.0, 2.0], np.float32)) == np.float32(24.0)
    assert capsys.readouterr().err == (
        "dbg.bend:5:3: h: f32[3] min=-2.0 max=1.0 mean=-0.5 nan=1\n"
        "dbg.bend:6:7: g: f32[3] min=-1.0 max=2.0 mean=0.5 nan=1\n"
        "dbg.bend:5:3: h: f32[2] min=2.0 max=4.0 mean=3.0 nan=0\n"
        "dbg.bend:6:7: g: f32[2] min=3.0 max=5.0 mean=4.0 nan=0\n")


def test_debug_in_a_scan_prints_once_per_step(prog, capsys):
    np.testing.assert_array_equal(prog.steps(np.ones((3, 2), np.float32)), [3.0, 3.0])
    assert capsys.readouterr().err == "".join(
        f"dbg.bend:11:11: acc: f32[2] min={n}.0 max={n}.0 mean={n}.0 nan=0\n" for n in (1, 2, 3))


def test_debug_in_a_gradient_prints_its_forward_pass_once(prog, capsys):
    np.testing.assert_array_equal(prog.df(np.array([1.0, 2.0], np.float32)), [6.0, 6.0])
    assert capsys.readouterr().err == (
        "dbg.bend:5:3: h: f32[2] min=2.0 max=4.0 mean=3.0 nan=0\n"
        "dbg.bend:6:7: g: f32[2] min=3.0 max=5.0 mean=4.0 nan=0\n")


def test_debug_of_integers(prog, capsys):
    np.testing.assert_array_equal(prog.ints(np.array([3, -1], np.int32)), [4, 0])
    assert capsys.readouterr().err == "dbg.bend:18:10: i: i32[2] min=-1 max=3 mean=1.0 nan=0\n"


def test_assert_finite_passes_finite_values_and_stops_at_the_call(prog):
    np.testing.assert_array_equal(prog.finite(np.ones(2, np.float32)), [0.0, 0.0])
    raises(lambda: prog.finite(np.array([0.0, -1.0, 1.0], np.float32)),
           "dbg.bend:21:10: error: while running 'finite': assert_finite failed: 'log x' has "
           "1 NaN and 1 infinity among its 3 values\n"
           '   21 |   return assert_finite(log(x), "log x") * 2.0\n'
           "      |          ^~~~~~~~~~~~~~~~~~~~~~~~~~~~~~")


def test_an_index_out_of_range_points_at_the_index(prog):
    raises(lambda: prog.pick(np.ones(3, np.float32), np.array([0, 5], np.int32)),
           "dbg.bend:24:10: error: while running 'pick': 'take' failed at run time: index 5 "
           "is out of bounds for axis 0 with size 3\n"
           "   24 |   return x[i] * 2.0\n"
           "      |          ^~~~")


def test_a_failed_check_in_the_library_names_the_call_that_led_there(prog):
    e = raises(lambda: prog.loss(np.ones((2, 3), np.float32), np.array([0, 7], np.int32)),
               "while running 'loss': 'take' failed at run time: index 7 is out of bounds")
    assert str(e.span).endswith("dsl/lib/nn.bend:137:13")
    assert [n.message for n in e.diagnostics[0].notes] == ["in 'cross_entropy' called from dbg.bend:27:10"]


def test_a_run_time_error_is_exit_1_from_dslc_run(tmp_path, capsys):
    from dsl.cli import main
    (tmp_path / "dbg.bend").write_text(SOURCE)
    np.savez(tmp_path / "in.npz", x=np.array([0.0], np.float32))
    assert main(["run", str(tmp_path / "dbg.bend"), "--entry", "finite", "--inputs",
                 str(tmp_path / "in.npz"), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "dbg.bend:21:10: error: while running 'finite': assert_finite failed" in err
    assert "Traceback" not in err


def test_debug_does_not_cut_the_kernel_it_meets():
    prog = dsl.loads(SOURCE, name="dbg.bend", device="cpu")
    plain = dsl.loads(SOURCE.replace('debug(h, "h")', "h").replace('debug(h + 1.0, "g")', "(h + 1.0)"),
                      name="dbg.bend", device="cpu")
    loops = prog.ir("f", dims={"N": 4}, level="loops")
    # one map kernel more, which stores the two values printed; the sum still computes its
    # input itself, and both prints follow the kernel
    assert loops.count("kernel ") == plain.ir("f", dims={"N": 4}, level="loops").count("kernel ") + 1
    assert loops.count("store ") == 2
    assert loops.endswith("host debug\nhost debug\n")


def test_a_label_must_be_a_string():
    raises(lambda: dsl.loads("def f(x: f32[N]) -> f32[N]:\n  return debug(x, 3)\n", name="l.bend").f(X),
           "l.bend:2:19: error: 'label' of 'debug' must be a string, got int")


def test_a_moved_expression_is_reported_where_it_now_is():
    # the CPU plan of the same IR is cached; its copy of the IR must not keep old positions
    bad = (np.ones(3, np.float32), np.array([5], np.int32))
    for source, line in ((SOURCE, 24), ("# moved down\n" + SOURCE, 25)):
        prog = dsl.loads(source, name="dbg.bend", device="cpu")
        raises(lambda: prog.pick(*bad), f"dbg.bend:{line}:10: error: while running 'pick'")


def test_a_scatter_out_of_range_points_at_the_call(prog):
    # on the CPU, the scatter kernel finds the bad index, not the interpreter
    prog = dsl.loads("def f(x: f32[N], i: i32[K], u: f32[K]) -> f32[N]:\n"
                     "  return scatter_add(x, i, u) * 2.0\n", name="s.bend", device=prog.device)
    raises(lambda: prog.f(np.zeros(3, np.float32), np.array([1, 9], np.int32), np.ones(2, np.float32)),
           "s.bend:2:10: error: while running 'f': 'scatter_add' failed at run time: index 9 is out "
           "of bounds for axis 0 with size 3")
