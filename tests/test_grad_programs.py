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
from dsl.inputs import example_inputs
from frontend.check import check_file
from ir.ad import grad_function
from ir.passes import optimize

sys.path.insert(0, str(Path(__file__).parent))
import test_programs as programs  # noqa: E402
from conftest import slow  # noqa: E402

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
    """With dims, as `dslc grad --dims` prints it: specialised for them."""
    make, wrt = CASES[name]
    prog, args = programs.load(name), make(0)
    want = prog.grad("loss", wrt=wrt)(**args)
    dims = DIMS[name]
    text = prog.source("loss", grad=wrt, dims=dims)
    assert text.startswith("# loss, differentiated with respect to ")
    assert " specialised for " in text.splitlines()[0]
    assert_same_gradient(text, tmp_path, want, args)


def assert_same_gradient(text: str, tmp_path: Path, want, args: dict, device: str = "reference"):
    """The printed program checks, and its loss_grad on args gives want's bits."""
    path = tmp_path / "printed_grad.bend"
    path.write_text(text)
    check_file(str(path))
    printed = dsl.load(str(path), device=device)
    runtime = {k: v for k, v in args.items() if not isinstance(v, (int, float, bool))}
    got = printed.loss_grad(**runtime)
    for a, b in zip(leaves(want), leaves(got), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)


DIMS = {"mlp": dict(B=programs.B, D=programs.D, H=programs.H, C=programs.C),
        "layer_norm": dict(B=programs.LN_B, D=programs.LN_D, O=programs.LN_O),
        "attention": dict(B=programs.AT_B, Hq=programs.AT_HQ, Hkv=programs.AT_HKV, T=programs.AT_T,
                          D=programs.AT_D),
        "lstm": dict(T=programs.LS_T, B=programs.LS_B, D=programs.LS_D, H=programs.LS_H),
        "conv2d": dict(B=programs.CV_B, H=programs.CV_H, W=programs.CV_W, C=programs.CV_C,
                       KH=programs.CV_KH, KW=programs.CV_KW, O=programs.CV_O)}


# ---------------------------------------------------------------- generic in the dimensions

ROOT = Path(__file__).resolve().parents[1]
# the examples' transformers take about a minute each
EXAMPLE_BLOCK = {"p.blocks": 2, "H": 2, "G": 1, "K": 4}     # heads divide the width; 1 / sqrt(K)

# file, wrt, the sizes given (what the checks need: Hq % Hkv == 0, a scale 1 / sqrt(D)), and
# the sizes of the open dimensions to run the printed program at: all 1, then primes
GENERIC = {
    "mlp": ("tests/programs/mlp.bend", "p", {}, dict(D=1, H=1, C=1, B=1), dict(D=3, H=5, C=2, B=7)),
    "layer_norm": ("tests/programs/layer_norm.bend", "p", {}, dict(D=1, O=1, B=1), dict(D=7, O=3, B=5)),
    "attention": ("tests/programs/attention.bend", ("q", "k", "v"), dict(Hq=4, Hkv=2, D=8),
                  dict(B=1, T=1), dict(B=3, T=5)),
    "lstm": ("tests/programs/lstm.bend", "p", {}, dict(D=1, H=1, T=1, B=1), dict(D=3, H=5, T=7, B=2)),
    "conv2d": ("tests/programs/conv2d.bend", ("x", "w", "b"), {},
               dict(B=1, H=1, W=1, C=1, KH=1, KW=1, O=1), dict(B=2, H=7, W=5, C=3, KH=3, KW=2, O=3)),
    "xor": ("examples/xor.bend", "p", {}, dict(H=1, B=1), dict(H=5, B=3)),
    "names_mlp": ("examples/names_mlp.bend", "p", {}, dict(V=1, E=1, T=1, H=1, B=1),
                  dict(V=7, E=3, T=5, H=11, B=2)),
    "cnn_digits": ("examples/cnn_digits.bend", "p", {}, dict(C1=1, C2=1, B=1), dict(C1=3, C2=5, B=2)),
    "lstm_chars": ("examples/lstm_chars.bend", "p", {}, dict(V=1, H=1, B=1, L=1), dict(V=7, H=3, B=2, L=5)),
    "gpt": pytest.param(("examples/gpt.bend", "p", {"rope": 1, **EXAMPLE_BLOCK},
                         dict(V=1, D=1, P=1, F=1, N=1, T=1), dict(V=11, D=3, P=2, F=5, N=2, T=7)),
                        marks=[pytest.mark.slow, slow]),
    "bert": pytest.param(("examples/bert.bend", "p", EXAMPLE_BLOCK, dict(V=1, D=1, T=1, F=1, N=1),
                          dict(V=11, D=3, T=5, F=7, N=2)), marks=[pytest.mark.slow, slow]),
}


def random_inputs(prog: dsl.Program, dims: dict[str, int], seed: int) -> dict:
    """loss's inputs at these sizes: normal floats, and integers valid as an index into any
    of the dimensions (below the smallest size)."""
    rng = np.random.default_rng(seed)
    below = min(v for k, v in dims.items() if "." not in k and k != "rope")

    def fill(v):
        if isinstance(v, dict):
            return {k: fill(i) for k, i in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(fill(i) for i in v)
        if isinstance(v, np.ndarray) and v.dtype.kind == "f":
            return rng.standard_normal(v.shape).astype(v.dtype)
        if isinstance(v, np.ndarray) and v.dtype.kind in "iu":
            return rng.integers(0, below, size=v.shape).astype(v.dtype)
        return v
    return fill(example_inputs(prog._def("loss"), prog._resolved.main, dims))


@pytest.mark.parametrize("case", GENERIC.values(), ids=GENERIC)
def test_gradient_printed_generic_checks_and_computes_grads_bits_at_other_sizes(case, tmp_path):
    """Printed without the open dimensions' sizes, the gradient names them; specialised by
    the sizes of its inputs, on the reference interpreter and the CPU, it gives grad's bits."""
    path, wrt, given, *sizes = case
    text = dsl.load(str(ROOT / path)).source("loss", grad=wrt, dims=given or None)
    assert text.splitlines()[0] == (f"# loss, differentiated with respect to {wrt}, generic in "
                                    f"{', '.join(sizes[0])}" +
                                    (f"; specialised for {', '.join(f'{k}={v}' for k, v in given.items())}"
                                     if given else ""))
    for device in ("reference", "cpu"):
        prog = dsl.load(str(ROOT / path), device=device)
        for k, open_sizes in enumerate(sizes):
            args = random_inputs(prog, {**given, **open_sizes}, k)
            want = prog.grad("loss", wrt=wrt)(**args)
            assert_same_gradient(text, tmp_path, want, args, device)


def test_generic_gradient_reads_as_written(tmp_path):
    """The signature and records as the source declares them; sizes as expressions of names."""
    mlp = dsl.load(str(ROOT / "tests/programs/mlp.bend")).source("loss", grad="p")
    assert "\nobject Params { W1: f32[D, H], b1: f32[H], W2: f32[H, C], b2: f32[C] }\n" in mlp
    assert "\ndef loss_grad(p: Params, x: f32[B, D], y: i32[B]) -> Params:\n" in mlp
    assert "  zeros_25 = zeros([B * C])\n" in mlp
    conv = dsl.load(str(ROOT / "tests/programs/conv2d.bend")).source("loss", grad="w")
    assert "\n  arange_9 = arange(W - KW + 1)\n" in conv
    assert "\n  broadcast_to_20 = broadcast_to(reshape_19, [B, H - KH + 1, W - KW + 1, O])\n" in conv


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
