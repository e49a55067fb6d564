"""Every kernel of every test program and example, forward and backward, lowered to PTX for
sm_80 and sm_90 and accepted by ptxas; launch shapes within the chips' limits; no call
that LLVM cannot select on NVPTX (math functions are the math library's own code)."""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

import dsl
from backend import nvptx, schedule
from dsl.program import example_inputs
from ir.ad import grad_function
from ir.passes import optimize

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import test_programs as programs  # noqa: E402

needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on the PATH")

CASES = {
    "mlp": lambda: (programs.load("mlp"), programs.mlp_inputs(0)),
    "layer_norm": lambda: (programs.load("layer_norm"), programs.layer_norm_inputs(0)),
    "attention": lambda: (programs.load("attention"), programs.attention_inputs(0)),
    "lstm": lambda: (programs.load("lstm"), programs.lstm_inputs(0)),
    "conv2d": lambda: (programs.load("conv2d"), programs.conv_inputs(0)),
    "gpt": lambda: gpt(),
    "xor": lambda: xor(),
}


def gpt():
    prog = dsl.load(str(ROOT / "benchmarks" / "models" / "gpt.bend"))
    d = prog._def("loss")
    return prog, example_inputs(d, prog._resolved.main,
                                {"B": 2, "T": 8, "D": 16, "V": 11, "H": 2, "p.blocks": 2})


def xor():
    import numpy as np
    prog = dsl.load(str(ROOT / "examples" / "xor.bend"))
    p = prog.init(dsl.key(0), H=4)
    return prog, {"p": p, "x": np.zeros((4, 2), np.float32), "y": np.zeros(4, np.float32)}


def kernels(fn, name):
    """The kernels of fn and of the scan and checkpoint bodies it holds."""
    out = list(schedule.schedule(fn, name).kernels)
    for i, op in enumerate(fn.ops):
        if op.body is not None:
            out += kernels(op.body, f"{name}_b{i}")
    return out


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", CASES)
def test_every_kernel_assembles(name, arch):
    prog, args = CASES[name]()
    low, _ = prog.lower("loss", (), args)
    grad = optimize(grad_function(low.function, list(range(len(low.function.params)))[:1] or [0]))
    ks = kernels(low.function, f"{name}_f") + kernels(grad, f"{name}_g")
    assert ks, "nothing to compile"
    text = nvptx.ptx(ks, arch)
    assert not re.search(r"\bcall(\.uni)?\s", text), "a call reached the PTX"
    nvptx.ptxas(text, arch)
    for k in ks:
        shape = nvptx.launch(k)
        assert shape.block <= 1024 and shape.grid <= nvptx.MAX_GRID_X
        assert f".entry {shape.entry}" in text or f".entry \"{shape.entry}\"" in text.replace("\"", "\"")


def test_ptxas_rejection_is_reported():
    if shutil.which("ptxas") is None:
        pytest.skip("ptxas is not on the PATH")
    with pytest.raises(RuntimeError, match="ptxas rejected"):
        nvptx.ptxas(".version 8.0\n.target sm_90\nthis is not ptx\n")
