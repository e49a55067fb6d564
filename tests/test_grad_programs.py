"""The gradient programs of the whole-program tests (tests/programs) as users see them: the
.bend source `dslc grad` prints checks and computes exactly grad(f), and the optimised
gradient is at most 3x the size of the program it differentiates."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dsl
from frontend.check import check_file
from ir.ad import grad_function
from ir.passes import optimize

sys.path.insert(0, str(Path(__file__).parent))
import test_programs as programs  # noqa: E402

CASES = {
    "mlp": (programs.mlp_inputs, "p"),
    "layer_norm": (programs.layer_norm_inputs, "p"),
    "attention": (programs.attention_inputs, ("q", "k", "v")),
    "lstm": (programs.lstm_inputs, "p"),
    "conv2d": (programs.conv_inputs, ("x", "w", "b")),
}


def leaves(v) -> list[np.ndarray]:
    if isinstance(v, dict):
        return [x for k in sorted(v) for x in leaves(v[k])]
    if isinstance(v, (tuple, list)):
        return [x for i in v for x in leaves(i)]
    return [v]


def ops(fn) -> int:
    return sum(1 + (ops(op.body) if op.body else 0) for op in fn.ops)


@pytest.mark.parametrize("name", CASES)
def test_printed_gradient_checks_and_computes_the_same_bits(name, tmp_path):
    make, wrt = CASES[name]
    prog, args = programs.load(name), make(0)
    want = prog.grad("loss", wrt=wrt)(**args)
    text = prog.source("loss", grad=wrt)
    path = tmp_path / f"{name}_grad.bend"
    path.write_text(text)
    check_file(str(path))
    printed = dsl.load(str(path))
    runtime = {k: v for k, v in args.items() if not isinstance(v, (int, float))}
    got = printed.loss_grad(**runtime)
    for a, b in zip(leaves(want), leaves(got), strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)


@pytest.mark.parametrize("name", CASES)
def test_gradient_is_at_most_three_times_the_primal(name):
    make, wrt = CASES[name]
    prog = programs.load(name)
    low, _ = prog.lower("loss", (), make(0))
    names = [p.name for p in prog._def("loss").params]
    wanted = (wrt,) if isinstance(wrt, str) else wrt
    positions = [i for w in wanted for i in low.arg_leaves[names.index(w)]]
    grad = optimize(grad_function(low.function, positions))
    assert ops(grad) <= 3 * ops(low.function), f"{ops(grad)} ops vs {ops(low.function)}"


def test_dslc_grad_command_prints_a_program_that_checks(tmp_path):
    src = Path(programs.PROGRAMS) / "mlp.bend"
    r = subprocess.run([sys.executable, "-m", "dsl", "grad", str(src), "--entry", "loss", "--wrt", "p",
                        "--dims", "B=4,D=3,H=5,C=2"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "g.bend"
    out.write_text(r.stdout)
    check_file(str(out))
    assert "def loss_grad(p: Params, x: f32[4, 3], y: i32[4]) -> Params:" in r.stdout
