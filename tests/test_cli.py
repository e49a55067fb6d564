"""`dslc` as a user runs it: exit statuses, the diagnostic format, no tracebacks."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    assert [p["shape"] for p in manifest["params"]] == [[3, 5], [5], [5, 2], [2], [4, 3], [4]]
    assert len(manifest["results"]) == 5             # the loss, then the 4 gradients of p
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
