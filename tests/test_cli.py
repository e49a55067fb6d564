"""`dslc` as a user runs it: exit statuses, the diagnostic format, no tracebacks."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

VALID = Path(__file__).parent / "corpus" / "valid" / "01_first_look.bend"


def dslc(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsl", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_check_accepts_a_valid_program():
    r = dslc("check", str(VALID))
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_check_reports_every_error_of_every_file_and_exits_1(tmp_path: Path):
    a = tmp_path / "a.bend"
    a.write_text("def f(x: f32[N]) -> f32[N]:\n  return x + y\n\ndef g(x: f32[N]) -> f32[N]:\n  return x @ 1\n")
    b = tmp_path / "b.bend"
    b.write_text("def h(x: u24[N]) -> f32[N]:\n  return x\n")
    r = dslc("check", str(a), str(b), str(VALID))
    assert r.returncode == 1
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert lines[0] == f"{a}:2:14: error: undefined name 'y'"
    assert lines[1:3] == ["    2 |   return x + y", "      |              ^"]
    assert f"{b}:1:10: error: 'u24' is not supported; use u32" in lines
    assert "Traceback" not in r.stderr


def test_diagnostic_shows_the_span_and_a_note_on_the_declaration(tmp_path: Path):
    src = tmp_path / "model.bend"
    src.write_text("object P { W1: f32[T * E, H] }\n\n"
                   "def f(p: P, x: f32[B, 64]) -> f32[B, H]:\n"
                   "  h = x @ p.W1\n"
                   "  return h\n")
    r = dslc("check", str(src))
    assert r.returncode == 1
    assert r.stderr.splitlines()[:3] == [
        f"{src}:4:9: error: shape mismatch in '@': f32[B, 64] @ f32[T * E, H]",
        "    4 |   h = x @ p.W1",
        "      |         ^",
    ]
    assert f"note: p.W1 is f32[T * E, H] ({src}:1)" in r.stderr


def test_check_verbose_says_ok_for_each_file_that_checks(tmp_path: Path):
    bad = tmp_path / "bad.bend"
    bad.write_text("def f(x: f32[N]) -> f32[N]:\n  return y\n")
    r = dslc("check", "-v", str(VALID), str(bad), str(VALID))
    assert r.returncode == 1
    assert r.stdout == f"{VALID}: ok\n{VALID}: ok\n"
    assert r.stderr.startswith(f"{bad}:2:10: error: undefined name 'y'")


def test_every_command_and_option_has_help():
    import argparse
    from dsl.cli import parser

    def missing(p: argparse.ArgumentParser, command: str) -> list[str]:
        found = []
        for action in p._actions:
            if not action.help or action.help == argparse.SUPPRESS:
                found.append(f"{command} {'/'.join(action.option_strings) or action.metavar or action.dest}")
            if isinstance(action, argparse._SubParsersAction):
                summaries = {a.dest: a.help for a in action._choices_actions}
                for name, sub in action.choices.items():
                    if not summaries.get(name) or not sub.description:
                        found.append(f"{command} {name}: its summary or description")
                    found += missing(sub, f"{command} {name}")
        return found

    assert missing(parser(), "dslc") == []


@pytest.mark.parametrize("args", [[], ["check"], ["frobnicate", "x.bend"], ["check", "--bogus", "x"]])
def test_usage_errors_exit_2(args):
    r = dslc(*args)
    assert r.returncode == 2
    assert "usage:" in r.stderr


def test_missing_file_is_a_user_error(tmp_path: Path):
    r = dslc("check", str(tmp_path / "nope.bend"))
    assert r.returncode == 1
    assert "cannot read" in r.stderr and "Traceback" not in r.stderr


def test_version():
    r = dslc("--version")
    assert r.returncode == 0 and r.stdout.startswith("dslc ")


def test_doc_prints_each_definition_with_its_doc_comment():
    r = dslc("doc", str(VALID.parent / "02_comments.bend"))
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == ("object Affine { W: f32[I, O], b: f32[O] }\n"
                        "    An affine layer's parameters.\n\n"
                        "type Squash:\n  Tanh\n  Sigmoid\n"
                        "    How to squash the output.\n\n"
                        "def apply(p: Affine, x: f32[B, I], s: Squash) -> f32[B, O]\n"
                        "    Applies the layer, then the squashing function.\n"
                        "    Documentation may span several lines.\n")


def test_doc_of_an_example_lists_its_definitions_in_source_order():
    r = dslc("doc", str(Path(__file__).parents[1] / "examples" / "xor.bend"))
    assert r.returncode == 0, r.stderr
    assert [line for line in r.stdout.splitlines() if line and not line.startswith(" ")] == [
        "object Params { W1: f32[2, H], b1: f32[H], W2: f32[H, 1], b2: f32[1] }",
        "object Metrics { accuracy: f32 }",
        "def init(key: Key, H: int) -> Params",
        "def predict(p: Params, x: f32[B, 2]) -> f32[B]",
        "def loss(p: Params, x: f32[B, 2], y: f32[B]) -> f32",
        "def evaluate(p: Params, x: f32[B, 2], y: f32[B]) -> Metrics",
        "def update(p: Params, g: Params, lr: f32) -> Params",
        "def step(p: Params, x: f32[B, 2], y: f32[B], lr: f32) -> (Params, f32)",
    ]
    assert "-> f32\n    Binary cross-entropy of the predictions.\n\n" in r.stdout


@pytest.mark.parametrize("text, message", [
    ("def f(:\n  return 1\n", ":1:7: error: unexpected ':'; expected ')' or a name"),
    ("#{ Returns y. #}\ndef f(x: f32) -> f32:\n  return y\n", ":3:10: error: undefined name 'y'"),
])
def test_doc_of_a_file_with_errors_prints_its_diagnostics(tmp_path: Path, text, message):
    src = tmp_path / "bad.bend"
    src.write_text(text)
    r = dslc("doc", str(src))
    assert_user_error(r, f"{src}{message}")
    assert r.stdout == ""


MLP = Path(__file__).parent / "programs" / "mlp.bend"


def test_ir_prints_the_tensor_ir():
    r = dslc("ir", str(MLP), "--entry", "loss", "--dims", "B=4,D=3,H=5,C=2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("def loss(%0: f32[3, 5], %1: f32[5], %2: f32[5, 2], %3: f32[2], "
                               "%4: f32[4, 3], %5: i32[4])")
    assert "= tanh(" in r.stdout


def test_ir_without_a_needed_dim_is_a_user_error():
    r = dslc("ir", str(MLP), "--entry", "loss", "--dims", "B=4,D=3")
    assert r.returncode == 1
    assert "--dims must give" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("level, text", [("loops", "kernel loss_"), ("llvm", "define void @\"loss_0\""),
                                         ("ptx", ".entry loss_0_gpu")])
def test_ir_shows_the_cpu_backend_stages(level, text):
    r = dslc("ir", str(MLP), "--entry", "loss", "--dims", "B=4,D=3,H=5,C=2", "--level", level)
    assert r.returncode == 0, r.stderr
    assert text in r.stdout


def test_run_reads_named_arrays_and_writes_the_result(tmp_path: Path):
    import numpy as np
    import dsl
    rng = np.random.default_rng(0)
    arrays = {"p.W1": rng.standard_normal((3, 5), np.float32), "p.b1": np.zeros(5, np.float32),
              "p.W2": rng.standard_normal((5, 2), np.float32), "p.b2": np.zeros(2, np.float32),
              "x": rng.standard_normal((4, 3), np.float32), "y": np.array([0, 1, 1, 0], np.int32)}
    np.savez(tmp_path / "in.npz", **arrays)
    r = dslc("run", str(MLP), "--entry", "loss", "--inputs", str(tmp_path / "in.npz"),
             "-o", str(tmp_path / "out.npz"), "--device", "cpu")
    assert r.returncode == 0, r.stderr
    want = dsl.load(str(MLP)).loss({k[2:]: v for k, v in arrays.items() if k.startswith("p.")},
                                   arrays["x"], arrays["y"])
    with np.load(tmp_path / "out.npz") as out:
        assert list(out.files) == ["out"] and np.array_equal(out["out"], want)


def test_run_reads_safetensors_inputs(tmp_path: Path):
    import numpy as np
    from safetensors.numpy import save_file
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    save_file({"x": x}, str(tmp_path / "in.safetensors"))
    (tmp_path / "f.bend").write_text("def f(x: f32[N, M]) -> f32[N]:\n  return sum(x * x, axis=1)\n")
    r = dslc("run", str(tmp_path / "f.bend"), "--entry", "f", "--inputs", str(tmp_path / "in.safetensors"),
             "-o", str(tmp_path / "out.npz"))
    assert r.returncode == 0, r.stderr
    with np.load(tmp_path / "out.npz") as out:
        assert np.array_equal(out["out"], np.array([5, 50], np.float32))


@pytest.mark.parametrize("content, message", [
    (b"", "not an .npz archive"),
    (b"def f(x: f32) -> f32:\n  return x\n", "not an .npz archive"),
    (None, "No such file or directory"),
])
def test_run_refuses_unreadable_inputs_with_a_diagnostic(tmp_path: Path, content, message):
    inputs = tmp_path / "in.npz"
    if content is not None:
        inputs.write_bytes(content)
    r = dslc("run", str(MLP), "--entry", "loss", "--inputs", str(inputs))
    assert r.returncode == 1 and f"cannot read inputs from {inputs}: " in r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr


def test_run_into_a_closed_pipe_is_quiet(tmp_path: Path):
    import numpy as np
    np.savez(tmp_path / "in.npz", x=np.zeros((200, 200), np.float32))
    (tmp_path / "f.bend").write_text("def f(x: f32[N, M]) -> f32[N, M]:\n  return x + 1.0\n")
    p = subprocess.Popen([sys.executable, "-m", "dsl", "run", str(tmp_path / "f.bend"), "--entry", "f",
                          "--inputs", str(tmp_path / "in.npz")], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()                            # as `| head -1` does
    assert p.wait(timeout=120) == 0
    assert p.stderr.read() == b""


def test_run_names_a_missing_input(tmp_path: Path):
    import numpy as np
    np.savez(tmp_path / "in.npz", x=np.zeros((4, 3), np.float32))
    r = dslc("run", str(MLP), "--entry", "loss", "--inputs", str(tmp_path / "in.npz"))
    assert r.returncode == 1
    assert "no array 'p.W1'" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("target, artifact", [("cpu", "kernels.o"), ("ptx", "kernels.ptx")])
def test_compile_writes_code_and_a_manifest(tmp_path: Path, target, artifact):
    import json
    r = dslc("compile", str(MLP), "--entry", "loss", "--dims", "B=4,D=3,H=5,C=2", "--grad", "p",
             "--target", target, "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert (tmp_path / "out" / artifact).stat().st_size > 0
    assert manifest["entry"] == "loss" and manifest["gradient_of"] == "p"
    assert [(p["name"], p["shape"]) for p in manifest["params"]] == [
        ("p.W1", [3, 5]), ("p.b1", [5]), ("p.W2", [5, 2]), ("p.b2", [2]), ("x", [4, 3]), ("y", [4])]
    assert [r["name"] for r in manifest["results"]] == [      # the loss, then the gradients of p
        "out", "grad(p.W1)", "grad(p.b1)", "grad(p.W2)", "grad(p.b2)"]
    assert manifest["kernels"] and all("buffers" in k for k in manifest["kernels"])
    # the range of each kernel's (lo, hi): the batch's rows for the softmax's row kernels
    assert {(k["kind"], k["extent"]) for k in manifest["kernels"] if k["kind"] != "map"} >= {("rows", 4)}
    kinds = {next(iter(s)) for s in manifest["steps"]}
    assert {"kernel", "matmul"} <= kinds              # x @ W1 and the like: the contraction kernel
    if target == "ptx":
        assert all(k["launch"]["block"] <= 1024 for k in manifest["kernels"])
        ptx = (tmp_path / "out" / artifact).read_text()
        assert manifest["matmul_entries"] and all(f".entry {e}(" in ptx for e in manifest["matmul_entries"])
        assert all(f".entry {k['launch']['entry']}(" in ptx for k in manifest["kernels"])
        assert "host" not in kinds or all(s.get("host") != "transpose" for s in manifest["steps"])


def test_the_manifest_names_each_buffer_as_dslc_run_names_its_array(tmp_path: Path):
    import json
    (tmp_path / "f.bend").write_text(
        "object P { W: f32[D, C], b: f32[C] }\n\n"
        "def f(p: P, k: Key, n: int, xs: List(f32[D]), unused: f32[D]) -> (f32, P):\n"
        "  fold x in xs with s = sum(p.W) + sum(p.b) * n:\n"
        "    s = s + sum(x)\n"
        "  return (s, p)\n")
    r = dslc("compile", str(tmp_path / "f.bend"), "--entry", "f", "--dims", "D=2,C=3,n=2,xs=2",
             "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    params = {p["name"]: p for p in manifest["params"]}
    assert list(params) == ["p.W", "p.b", "k", "xs[0]", "xs[1]", "unused"]
    assert (params["k"]["dtype"], params["k"]["shape"]) == ("u32", [2])
    results = {r["name"]: r["id"] for r in manifest["results"]}
    assert list(results) == ["out[0]", "out[1].W", "out[1].b"]
    assert (results["out[1].W"], results["out[1].b"]) == (params["p.W"]["id"], params["p.b"]["id"])


# ---------------------------------------------------------------- numbers as dslc prints them

@pytest.mark.parametrize("value, dtype, text", [
    (np.float32(0.6931472), None, "0.6931472"),
    (0.6931471824645996, np.float32, "0.6931472"),        # a mean of f32 losses, taken in f64
    (np.float64(0.6931472), None, "0.6931472"),
    (1 / 3, None, "0.3333333333333333"),
    (np.float16(0.6931472), None, "0.6934"),
    (np.float32(1e-7), None, "1e-07"),
    (np.array([1 / 3, 0.25], np.float32), None, "[0.33333334 0.25      ]"),
    (np.array([1 / 3, 0.25]), None, "[0.3333333333333333 0.25              ]"),
    (np.array([[1, 2], [3, 4]], np.int32), None, "[[1 2]\n [3 4]]"),
])
def test_numbers_print_as_the_shortest_text_of_their_dtype(value, dtype, text):
    from dsl.values import shortest
    assert shortest(value, dtype) == text


def test_run_prints_each_float_in_the_shortest_text_of_its_dtype(tmp_path: Path):
    (tmp_path / "f.bend").write_text(
        "def f(x: f32[N], y: f64[N], z: f16[N]) -> (f32, f64, f16, f64[N]):\n"
        "  return (mean(x), mean(y), mean(z), y / 3.0)\n")
    x = np.array([0.5, 0.8862944])
    np.savez(tmp_path / "in.npz", x=x.astype(np.float32), y=x, z=x.astype(np.float16))
    r = dslc("run", str(tmp_path / "f.bend"), "--entry", "f", "--inputs", str(tmp_path / "in.npz"),
             "--device", "reference")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ("out[0]: float32[]\n0.6931472\nout[1]: float64[]\n0.6931472000000001\n"
                        "out[2]: float16[]\n0.6934\n"
                        "out[3]: float64[2]\n[0.16666666666666666 0.2954314666666667 ]\n")


def test_train_reports_losses_as_f32s(tmp_path: Path):
    from dsl import safetensors
    from dsl.values import shortest
    r = dslc("train", str(Path(__file__).parent.parent / "examples" / "xor.bend"), "--steps", "3",
             "--checkpoint-dir", str(tmp_path), "--device", "reference")
    assert r.returncode == 0, r.stderr
    losses = safetensors.read(tmp_path / "step0000003.safetensors")["loss"].astype(np.float64)
    # off a terminal, the last line: the mean of the last (at most 50) losses, as an f32
    assert f"step 3/3 loss {shortest(losses.mean(), np.float32)} " in r.stderr
    assert f"  step loss   {shortest(losses.mean(), np.float32)} (the mean" in r.stdout


def test_the_training_report_prints_metrics_as_f32s():
    from dsl.train import Result
    report = Result("m.bend", params=None, opt_state=None, start_step=0, steps=1, seed=0,
                    train_seconds=0.0, eval_seconds=0.0, losses=[], evals=[],
                    metrics={"train": {"loss": 0.6931471824645996, "accuracy": 0.75}})
    assert str(report).splitlines()[2:] == ["  loss        train 0.6931472",
                                            "  accuracy    train 0.75"]


# ---------------------------------------------------------------- bad input on the command line

def assert_user_error(r: subprocess.CompletedProcess, *fragments: str) -> None:
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    for fragment in fragments:
        assert fragment in r.stderr, r.stderr


@pytest.mark.parametrize("command", [
    ["ir", "--dims", "B=4,D=3,H=5,C=2"], ["grad", "--wrt", "p", "--dims", "B=4,D=3,H=5,C=2"],
    ["compile", "--dims", "B=4,D=3,H=5,C=2", "-o", "out"], ["run", "--inputs", "in.npz"],
])
def test_an_unknown_entry_is_a_user_error_with_a_suggestion(tmp_path: Path, command):
    import numpy as np
    np.savez(tmp_path / "in.npz", x=np.zeros(2, np.float32))
    r = dslc(command[0], str(MLP), "--entry", "los", *command[1:], cwd=tmp_path)
    assert_user_error(r, "defines no function 'los' (did you mean 'loss'?)",
                      "note: its entry points are hvp, loss, loss_one_hot, step")


@pytest.mark.parametrize("wrt, message", [
    ("y", "cannot differentiate 'loss' with respect to 'y': it is i32[4]"),
    ("pp", "'pp' is not a parameter of 'loss' (did you mean 'p'?)"),
])
def test_grad_with_respect_to_a_non_float_or_non_parameter_is_a_user_error(wrt, message):
    assert_user_error(dslc("grad", str(MLP), "--entry", "loss", "--wrt", wrt, "--dims", "B=4,D=3,H=5,C=2"),
                      message)
    generic = message.replace("i32[4]", "i32[B]")        # without --dims, in the sizes' names
    assert_user_error(dslc("grad", str(MLP), "--entry", "loss", "--wrt", wrt), generic)


def test_grad_without_dims_prints_a_program_generic_in_them_that_checks(tmp_path: Path):
    r = dslc("grad", str(MLP), "--entry", "loss", "--wrt", "p")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("# loss, differentiated with respect to p, generic in D, H, C, B\n\n"
                               "object Params { W1: f32[D, H], b1: f32[H], W2: f32[H, C], b2: f32[C] }\n\n"
                               "def loss_grad(p: Params, x: f32[B, D], y: i32[B]) -> Params:\n")
    (tmp_path / "g.bend").write_text(r.stdout)
    assert dslc("check", str(tmp_path / "g.bend")).returncode == 0


def test_grad_keeps_the_dimensions_dims_leaves_out():
    r = dslc("grad", str(MLP), "--entry", "loss", "--wrt", "p", "--dims", "C=2,B=4")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("# loss, differentiated with respect to p, generic in D, H; "
                               "specialised for C=2, B=4\n\nobject Params { W1: f32[D, H], b1: f32[H], "
                               "W2: f32[H, 2], b2: f32[2] }\n\n"
                               "def loss_grad(p: Params, x: f32[4, D], y: i32[4]) -> Params:\n")


@pytest.mark.parametrize("file, dims, fragments", [
    (MLP.parent / "attention.bend", [], [
        "attention.bend:56:10: error: assertion failed: the number of key/value heads must divide",
        "note: while printing 'loss' generic in its dimensions, at the sample sizes B=",
        "note: give in --dims (dims=) the sizes it needs; the dimensions --dims leaves out stay names"]),
    (MLP.parent / "attention.bend", ["--dims", "Hq=4,Hkv=2"], [
        "error: cannot print 'loss' generic in B, T, D: ",
        "is no single expression of the dimensions (line 9: constant_11 = full([], 0.",
        "note: give in --dims (dims=) the sizes it needs"]),
])
def test_grad_that_cannot_be_generic_says_which_sizes_to_give(file, dims, fragments):
    assert_user_error(dslc("grad", str(file), "--entry", "loss", "--wrt", "q", *dims), *fragments)


@pytest.mark.parametrize("dims, message", [
    ("B=4,D=3,H=5,C=2,Q=1", "--dims names 'Q', which 'loss' does not have"),
    ("B=4,D=3,H=5,CC=2", "must give the dimension 'C' (C=…); it gives 'CC': did you mean 'C'?"),
    ("B=-1,D=3,H=5,C=2", "gives the dimension 'B' the value -1, outside [0, 1099511627776]"),
])
def test_dims_must_name_the_entrys_dimensions_within_bounds(dims, message):
    assert_user_error(dslc("ir", str(MLP), "--entry", "loss", "--dims", dims), message)


def test_ir_of_a_huge_shape_allocates_nothing():
    r = dslc("ir", str(MLP), "--entry", "loss", "--dims", "B=1000000000000,D=1000000,H=5,C=2")
    assert r.returncode == 0, r.stderr
    assert "f32[1000000000000, 1000000]" in r.stdout


@pytest.mark.parametrize("dims", ["B=1e3", "B=", "=3", "B=1,B=2"])
def test_malformed_dims_are_usage_errors(dims):
    r = dslc("ir", str(MLP), "--entry", "loss", "--dims", dims)
    assert r.returncode == 2 and "usage:" in r.stderr and "Traceback" not in r.stderr



@pytest.mark.parametrize("change, message", [
    ({"k": [1, 2, 3]}, "the input array 'k' is a key: two integers in [0, 2**32), got i64[3]"),
    ({"k": [1.5, 2.0]}, "the input array 'k' is a key"),
    ({"k": [-1, 2]}, "the input array 'k' is a key"),
    ({"p.W.x": [1.0]}, "no input for the array 'p.W.x'"),
    ({"1.5": [1.0]}, "no input for the array '1.5'"),
    ({"-1": [1.0]}, "no input for the array '-1'"),
    ({"ys[-1][0]": [1.0]}, "no input for the array 'ys[-1][0]'"),
    ({"x": np.ones((4, 3))}, "the input array 'x' is f64[4, 3], but 'x' is f32[B, D]"),
    ({"p.bias": np.zeros((2, 1), np.float32)}, "the input array 'p.bias' is f32[2, 1], but 'p.bias' is f32[C]"),
    ({"p.biass": np.zeros(2, np.float32), "p.bias": None}, "no array 'p.bias' for 'f' (did you mean 'p.biass'?)"),
], ids=lambda v: None if isinstance(v, str) else ",".join(v))
def test_run_refuses_arrays_that_do_not_name_an_input_exactly(tmp_path: Path, change, message):
    (tmp_path / "r.bend").write_text(
        "object P { W: f32[D, C], bias: f32[C] }\n"
        "def f(p: P, x: f32[B, D], k: Key, n: int, ys: List((f32[C], i32))) -> f32:\n"
        "  return sum(x @ p.W + p.bias) * n + sum(ys[0][0])\n")
    arrays = {"p.W": np.ones((3, 2), np.float32), "p.bias": np.zeros(2, np.float32),
              "x": np.ones((4, 3), np.float32), "k": np.array([1, 2], np.uint32),
              "ys[0][0]": np.ones(2, np.float32), "ys[0][1]": np.array(3, np.int32)}
    run = ("run", str(tmp_path / "r.bend"), "--entry", "f", "--inputs", str(tmp_path / "in.npz"),
           "--device", "reference")
    np.savez(tmp_path / "in.npz", **arrays)
    r = dslc(*run, "--dims", "n=2")
    assert r.returncode == 0 and r.stdout == "out: float32[]\n50.0\n", r.stderr
    for k, v in change.items():
        if v is None:
            del arrays[k]
        else:
            arrays[k] = np.asarray(v)
    np.savez(tmp_path / "in.npz", **arrays)
    assert_user_error(dslc(*run, "--dims", "n=2"), message)


def test_run_refuses_unknown_static_values(tmp_path: Path):
    np.savez(tmp_path / "in.npz", x=np.zeros(2, np.float32))
    (tmp_path / "f.bend").write_text("def f(x: f32[N], b: bool) -> f32[N]:\n  return x\n")
    run = ("run", str(tmp_path / "f.bend"), "--entry", "f", "--inputs", str(tmp_path / "in.npz"))
    assert_user_error(dslc(*run, "--dims", "b=1,bb=2"), "--dims names 'bb'", "did you mean 'b'?")
    assert_user_error(dslc(*run, "--dims", "b=5"), "the static bool 'b' the value 5, outside [0, 1]")


def test_running_an_array_larger_than_memory_is_a_user_error(tmp_path: Path):
    np.savez(tmp_path / "in.npz", x=np.zeros(2, np.float32))
    (tmp_path / "f.bend").write_text("def f(x: f32[N]) -> f32:\n  return sum(zeros([100000, 100000])) + sum(x)\n")
    r = dslc("run", str(tmp_path / "f.bend"), "--entry", "f", "--inputs", str(tmp_path / "in.npz"))
    assert_user_error(r, "'f' would need an array of 40000000000 bytes, f32[100000, 100000]")


def mapped(pid: int, library: str) -> bool:
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="watches /proc/PID/maps")
@pytest.mark.parametrize("library", ["_multiarray_umath", "libllvmlite"])
def test_ctrl_c_during_start_up_or_compilation_exits_130_quietly(library):
    """SIGINT once the process has NumPy (its start-up) or LLVM (compilation) loading: the
    process is watched until the library is mapped, so the timing does not depend on the
    machine's speed; a run that finishes first is tried again."""
    import signal
    import time
    for _ in range(5):
        p = subprocess.Popen([sys.executable, "-m", "dsl", "ir", str(MLP), "--entry", "step",
                              "--dims", "B=4,D=3,H=5,C=2", "--level", "llvm"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        while p.poll() is None and not mapped(p.pid, library):
            time.sleep(0.002)
        p.send_signal(signal.SIGINT)
        err = p.communicate(timeout=120)[1]
        # 0, or a silent death by SIGINT once its output was written: done before the signal
        if (p.returncode, err) not in ((0, ""), (-signal.SIGINT, "")):
            break
    assert (p.returncode, err) == (130, "dslc: interrupted\n")


def test_ctrl_c_while_numpys_c_code_imports_exits_130_quietly():
    """SIGINT as NumPy's C start-up imports datetime: a KeyboardInterrupt there would come out as
    an ImportError (with a traceback), so the start-up's handler must end the process itself."""
    code = textwrap.dedent("""
        import os, signal, sys
        class InterruptAtDatetime:
            def find_spec(self, name, path=None, target=None):
                if name == "datetime":
                    os.kill(os.getpid(), signal.SIGINT)
        sys.meta_path.insert(0, InterruptAtDatetime())
        from dsl.cli import main
        """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stderr) == (130, "dslc: interrupted\n")


def test_compiling_an_array_past_2_to_the_40_bytes_is_a_user_error(tmp_path: Path):
    # its indices would wrap in the compiled code (2**80 elements); the tensor IR is still shown
    dims = "B=1099511627776,D=1099511627776,H=5,C=2"
    assert_user_error(dslc("compile", str(MLP), "--entry", "loss", "--dims", dims, "-o", str(tmp_path / "o")),
                      "more than the 1099511627776 bytes an array of compiled code may take")
    assert_user_error(dslc("ir", str(MLP), "--entry", "loss", "--dims", dims, "--level", "loops"),
                      "f32[1099511627776, 5] (an input)")


def test_run_into_an_unwritable_output_is_a_user_error(tmp_path: Path):
    np.savez(tmp_path / "in.npz", x=np.zeros(2, np.float32))
    (tmp_path / "f.bend").write_text("def f(x: f32[N]) -> f32[N]:\n  return x\n")
    r = dslc("run", str(tmp_path / "f.bend"), "--entry", "f", "--inputs", str(tmp_path / "in.npz"),
             "-o", str(tmp_path / "no" / "such" / "out.npz"))
    assert_user_error(r, "cannot write the result to")


# ---------------------------------------------------------------- the compile cache

SQUARES = "def f(x: f32[N]) -> f32:\n  return sum(x * x)\n"


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch) -> Path:
    """A compile cache of its own for the dslc this test runs, under the default cap."""
    monkeypatch.setenv("DSLC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DSLC_CACHE_MAX_SIZE", raising=False)
    return tmp_path / "cache"


def cache_says(*args: str) -> list[str]:
    r = dslc("cache", *args)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    return r.stdout.splitlines()


def test_cache_info_prune_and_clear_on_the_entries_of_a_run(tmp_path: Path, cache_root: Path):
    (tmp_path / "f.bend").write_text(SQUARES)
    np.savez(tmp_path / "in.npz", x=np.arange(5, dtype=np.float32))
    r = dslc("run", str(tmp_path / "f.bend"), "--entry", "f", "--inputs", str(tmp_path / "in.npz"),
             "--device", "cpu")
    assert r.returncode == 0, r.stderr
    stored = sorted(p for p in cache_root.glob("??/*") if p.suffix in (".o", ".val"))
    for i, path in enumerate(stored):           # known times of use: least recently used first
        os.utime(path, (1.7e9 + i, 1.7e9 + i))
    sizes = [p.stat().st_size for p in stored]
    total = sum(sizes)
    assert len(stored) >= 4 and 1024 <= total < 1 << 20
    used = [time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1.7e9 + i)) for i in range(len(stored))]
    assert cache_says("info") == [
        f"location: {cache_root}", f"entries: {len(stored)}, {total / 1024:.1f} KiB ({total} bytes)",
        "size cap: 2.0 GiB (2147483648 bytes), the default",
        f"least recently used: {used[0]}", f"most recently used: {used[-1]}"]

    foreign = [cache_root / "notes.txt", stored[0].parent / "README"]
    for path in foreign:
        path.write_text("not dslc's")
    k = len(stored) // 2                        # what the newest half takes: the oldest go
    (pruned,) = cache_says("prune", "--max-size", str(sum(sizes[k:])))
    assert pruned.startswith(f"removed {k} entries, ") and f"({sum(sizes[:k])} bytes); kept " in pruned
    assert [p.exists() for p in stored] == [False] * k + [True] * (len(stored) - k)

    (cleared,) = cache_says("clear")
    assert cleared.startswith(f"removed {len(stored) - k} entries, ") and cleared.endswith(f" from {cache_root}")
    assert not any(p.exists() for p in stored) and all(p.read_text() == "not dslc's" for p in foreign)
    assert cache_says("info")[1] == "entries: 0, 0 bytes"


def test_version_shows_the_cache_location(cache_root: Path):
    r = dslc("--version")
    assert r.returncode == 0 and r.stdout.splitlines()[1:] == [f"compile cache: {cache_root}"]


@pytest.mark.parametrize("size", ["abc", "-5", "1.5G", "2X", ""])
def test_a_bad_prune_size_is_a_usage_error(cache_root: Path, size: str):
    r = dslc("cache", "prune", "--max-size", size)
    assert r.returncode == 2 and r.stderr.startswith("usage: dslc cache prune"), r.stderr
    assert f"argument --max-size: expected a size such as 1024, 500M or 2G, got {size!r}" in r.stderr


@pytest.mark.parametrize("action, says", [
    (["info"], ["location: {} (not made yet)", "entries: 0, 0 bytes",
                "size cap: 2.0 GiB (2147483648 bytes), the default"]),
    (["clear"], ["removed 0 entries, 0 bytes from {}"]),
    (["prune", "--max-size", "1M"], ["removed 0 entries, 0 bytes; kept 0 entries, 0 bytes"]),
])
def test_a_cache_not_made_yet_is_empty_and_stays_unmade(cache_root: Path, action, says):
    assert cache_says(*action) == [line.format(cache_root) for line in says]
    assert not cache_root.exists()


@pytest.mark.parametrize("action", [["info"], ["clear"], ["prune", "--max-size", "1M"]])
def test_a_cache_location_that_is_not_a_folder_is_a_user_error(cache_root: Path, action):
    cache_root.write_text("a file")
    r = dslc("cache", *action)
    assert_user_error(r, f"error: cannot use the compile cache in {cache_root}: Not a directory")
    assert cache_root.read_text() == "a file"


@pytest.mark.parametrize("command", [["cache", "info"], ["run", str(VALID), "--entry", "f", "--inputs", "x.npz"]])
def test_a_bad_cap_in_the_environment_is_a_user_error(cache_root: Path, monkeypatch, command):
    monkeypatch.setenv("DSLC_CACHE_MAX_SIZE", "2 gigs")
    assert_user_error(dslc(*command), "error: DSLC_CACHE_MAX_SIZE: expected a size such as 1024, "
                                      "500M or 2G, got '2 gigs'")


@pytest.mark.parametrize("command", [["run", str(VALID), "--entry", "f", "--inputs", "x.npz"],
                                     ["train", str(VALID), "--steps", "1"]])
def test_a_bad_specialisation_bound_in_the_environment_is_a_user_error(monkeypatch, command):
    monkeypatch.setenv("DSLC_SPECIALISATIONS", "eight")
    assert_user_error(dslc(*command), "error: DSLC_SPECIALISATIONS: expected a whole number of "
                                      "at least 1, got 'eight'")


# ---------------------------------------------------------------- GPU architectures

@pytest.mark.parametrize("arch, version", [(None, "7.8"), ("sm_80", "7.0"), ("sm_86", "7.1"),
                                           ("sm_120", "8.7")])
def test_compile_and_ir_build_ptx_for_the_architecture_asked_for(tmp_path: Path, arch, version):
    """--arch (default sm_90) is the PTX's target, with that target's first PTX ISA version, in
    kernels.ptx, in the manifest and in `ir --level ptx`."""
    import json
    import shutil
    given = ["--arch", arch] if arch else []
    out = tmp_path / "out"
    r = dslc("compile", str(MLP), "--entry", "loss", "--dims", "B=4,D=3,H=5,C=2", "--target", "ptx",
             "-o", str(out), *given)
    assert r.returncode == 0, r.stderr
    header = f"\n.version {version}\n.target {arch or 'sm_90'}\n"
    assert header in (out / "kernels.ptx").read_text()
    assert json.loads((out / "manifest.json").read_text())["arch"] == (arch or "sm_90")
    r = dslc("ir", str(MLP), "--entry", "loss", "--dims", "B=4,D=3,H=5,C=2", "--level", "ptx", *given)
    assert r.returncode == 0 and header in r.stdout, r.stderr
    if shutil.which("ptxas"):
        from backend import nvptx
        nvptx.ptxas((out / "kernels.ptx").read_text(), arch or "sm_90")


@pytest.mark.parametrize("args, message", [
    (["compile", "--target", "ptx", "--arch", "sm_75"],
     "argument --arch: expected one of sm_80, sm_86, sm_89, sm_90, sm_100, sm_120, got 'sm_75'"),
    (["compile", "--arch", "sm_86"], "--arch is for --target ptx"),
    (["ir", "--level", "llvm", "--arch", "sm_86"], "--arch is for --level ptx"),
])
def test_an_arch_that_is_not_built_or_not_for_ptx_is_a_usage_error(tmp_path: Path, args, message):
    command, *rest = args
    r = dslc(command, str(MLP), "--entry", "loss", "--dims", "B=4,D=3,H=5,C=2", *rest,
             *(["-o", str(tmp_path)] if command == "compile" else []))
    assert r.returncode == 2 and r.stderr.endswith(f"error: {message}\n"), r.stderr
    assert "Traceback" not in r.stderr


def test_the_help_of_arch_names_every_architecture():
    from backend.nvptx import ARCHES
    from dsl.cli import ARCH
    assert [a for a in ARCHES if a not in ARCH] == []


def test_the_api_builds_ptx_for_an_architecture_and_refuses_others(tmp_path: Path):
    import dsl
    from conftest import raises
    prog = dsl.load(str(MLP))
    dims = {"B": 4, "D": 3, "H": 5, "C": 2}
    assert "\n.target sm_89\n" in prog.ir("loss", dims, "ptx", arch="sm_89")
    assert prog.compile_to("loss", "ptx", str(tmp_path), dims, arch="sm_100")["arch"] == "sm_100"
    raises(lambda: prog.ir("loss", dims, "ptx", arch="sm_70"),
           "arch= is one of sm_80, sm_86, sm_89, sm_90, sm_100, sm_120, got 'sm_70'")
    raises(lambda: prog.compile_to("loss", "cpu", str(tmp_path), dims, arch="sm_80"),
           "arch= is for PTX: it needs target='ptx'")
    raises(lambda: prog.compile("loss").ir("llvm", dims, arch="sm_80"), "it needs level='ptx'")
