"""An entry point as a Python callable (prog.compile, prog.loss): what inspect, help() and tab
completion show, its cache per input signature, and its inspection methods."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

import dsl
from dsl.program import Program

SOURCE = """
#{ A linear layer's weights. #}
object P { W: f32[D, C], b: f32[C] }

#{
  The mean squared score of x under p, times k.
  Sizes:
    B examples of D features, C classes.
#}
def loss(p: P, x: f32[B, D], k: int = 2) -> f32:
  return mean((x @ p.W + p.b) ** 2) * k

def shift(x: f32[N], s: f32 = 0.5, t: f32):
  return x * s + t

def helper(x):
  return x
"""

P = {"W": np.arange(6, dtype=np.float32).reshape(3, 2) / 4, "b": np.array([1, -1], np.float32)}


def x_of(rows: int) -> np.ndarray:
    return np.linspace(-1, 1, rows * 3, dtype=np.float32).reshape(rows, 3)


def expected_loss(x: np.ndarray, k: int = 2):
    """NumPy's value (it sums in another order than the language's reductions)."""
    return pytest.approx(np.mean((x @ P["W"] + P["b"]) ** 2) * k, rel=1e-6)


@pytest.fixture
def prog() -> Program:
    return dsl.loads(SOURCE, name="m.bend", device="reference")


def test_an_entry_point_has_its_bend_signature(prog):
    sig = inspect.signature(prog.compile("loss"))
    assert str(sig) == "(p: P, x: f32[B, D], k: int = 2) -> f32"
    assert [(n, p.annotation, p.default) for n, p in sig.parameters.items()] == [
        ("p", "P", inspect.Parameter.empty), ("x", "f32[B, D]", inspect.Parameter.empty), ("k", "int", 2)]
    assert sig.return_annotation == "f32"
    # .bend allows a parameter without a default after one with a default; no result type
    assert str(inspect.signature(prog.shift)) == "(x: f32[N], s: f32 = 0.5, t: f32)"


def test_an_entry_point_has_its_name_and_doc_comment(prog):
    loss = prog.loss
    assert (loss.__name__, loss.__qualname__) == ("loss", "loss")
    assert loss.__doc__ == ("The mean squared score of x under p, times k.\nSizes:\n"
                            "  B examples of D features, C classes.")
    assert prog.shift.__doc__ is None
    assert repr(loss) == "<dsl entry point loss(p: P, x: f32[B, D], k: int = 2) -> f32 on reference>"


def test_help_shows_the_signature_and_the_doc_comment(prog, capsys):
    help(prog.loss)
    assert "loss(p: P, x: f32[B, D], k: int = 2) -> f32\n" \
           "    The mean squared score of x under p, times k.\n" \
           "    Sizes:\n" \
           "      B examples of D features, C classes.\n" in capsys.readouterr().out


def test_dir_offers_the_entry_points(prog):
    names = dir(prog)
    assert {"loss", "shift", "compile", "grad", "source"} <= set(names)
    assert "helper" not in names                  # not an entry point: it annotates nothing


def test_the_callable_computes_what_a_call_does(prog):
    x = x_of(4)
    assert prog.loss(P, x) == expected_loss(x)
    assert prog.compile("loss")(P, x=x, k=3) == expected_loss(x, 3)
    assert prog.compile("loss") is prog.loss      # one callable per entry and device


def test_calls_are_lowered_once_per_input_signature(prog, monkeypatch):
    lowerings = []
    lowered = Program._lowered
    monkeypatch.setattr(Program, "_lowered", lambda self, d, b, inputs:
                        lowerings.append(inputs.key) or lowered(self, d, b, inputs))
    loss = prog.compile("loss")
    loss(P, x_of(4))
    loss(P, x_of(4) * 2)                          # new values, the same shapes: no new lowering
    assert len(lowerings) == 1
    loss(P, x_of(5))                              # a new shape
    loss(P, x_of(5), k=3)                         # a new static value
    loss(P, x_of(5), k=3)
    assert len(lowerings) == 3
    assert prog.loss(P, x_of(5), k=3) == expected_loss(x_of(5), 3)


def test_lower_ir_and_source_show_what_the_program_shows(prog):
    loss = prog.loss
    low = loss.lower(P, x_of(4))
    dims = {"B": 4, "D": 3, "C": 2, "k": 2}
    assert str(low) == prog.ir("loss", dims=dims) == loss.ir(dims=dims)
    assert str(low).startswith("def loss(%0: f32[3, 2], %1: f32[2], %2: f32[4, 3]) -> (")
    assert loss.ir() == prog.ir("loss")           # both: the inputs lower() was given
    assert loss.ir(level="loops") == prog.ir("loss", level="loops")
    assert loss.source(grad="p", dims=dims) == prog.source("loss", grad="p", dims=dims)
    assert loss.source(dims=dims).startswith("# loss specialised for p: P {W: f32[3, 2], b: f32[2]}; "
                                             "x: f32[4, 3]; k=2\n")
    # without a dimension's size, the program names it (a static value is always given)
    assert loss.source(dims={"k": 2}).startswith("# loss generic in D, C, B; specialised for k=2\n\n"
                                                 "object P { W: f32[D, C], b: f32[C] }\n\n"
                                                 "def loss(p: P, x: f32[B, D]) -> f32:\n")


def test_compile_for_another_device(prog):
    cpu = prog.compile("loss", device="cpu")
    assert (cpu.device, prog.loss.device) == ("cpu", "reference")
    x = x_of(4)
    assert cpu(P, x) == prog.loss(P, x)
    assert prog.compile("loss", device="cpu") is cpu


@pytest.mark.parametrize("kwargs, message", [
    ({"device": "gpu"}, "device must be one of auto, cpu, cuda, reference, iree, iree-cuda, got 'gpu'"),
    ({"numerics": "bogus"}, "numerics= is one of exact, fast, got 'bogus'"),
    ({"numerics": 1}, "numerics= is one of exact, fast, got 1"),
])
def test_bad_device_or_numerics_is_a_dsl_error(prog, kwargs, message):
    with pytest.raises(dsl.DslError) as info:
        prog.compile("loss", **kwargs)
    assert str(info.value) == f"error: {message}"


def test_doc_lists_every_definition_in_source_order(prog):
    assert prog.doc() == (
        "object P { W: f32[D, C], b: f32[C] }\n"
        "    A linear layer's weights.\n\n"
        "def loss(p: P, x: f32[B, D], k: int = 2) -> f32\n"
        "    The mean squared score of x under p, times k.\n"
        "    Sizes:\n"
        "      B examples of D features, C classes.\n\n"
        "def shift(x: f32[N], s: f32 = 0.5, t: f32)\n\n"
        "def helper(x)\n")


def test_buffers_names_the_leaves_of_buffer_fields_at_any_depth():
    prog = dsl.loads("object Norm { w: f32[2], buffer mean: f32[2] }\n"
                     "object Net { norms: (Norm, Norm), buffer frozen: Norm, b: f32[1] }\n"
                     "def f(net: Net) -> f32:\n  return sum(net.b)\n")
    norm = {"w": np.zeros(2, np.float32), "mean": np.zeros(2, np.float32)}
    net = {"norms": (norm, norm), "frozen": norm, "b": np.zeros(1, np.float32)}
    assert prog.buffers("f", "net", net) == ["net.norms[0].mean", "net.norms[1].mean",
                                             "net.frozen.w", "net.frozen.mean"]
    with pytest.raises(dsl.DslError, match="'f' has no annotated parameter 'p'"):
        prog.buffers("f", "p", net)
