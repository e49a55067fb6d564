"""On GPUs: the gradient tree's device arithmetic gives NumPy's bits, and `--device cuda` on two
ranks, whose sums go GPU to GPU through NCCL, trains the bits of one process on the CPU backend
(docs/distributed.md). Skipped where no GPU is usable, and the two-rank tests where CuPy,
mpi4py or the GPUs they need are missing; scripts/gpu-check runs them."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dsl import safetensors
from runtime import cuda

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from conftest import dslc  # noqa: E402
from test_distributed import XOR, quick, trained  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda.usable(), reason="no usable NVIDIA GPU")]
NCCL = importlib.util.find_spec("cupy") is not None and importlib.util.find_spec("mpi4py") is not None




def gpus() -> int:
    """How many GPUs nvidia-smi lists."""
    smi = shutil.which("nvidia-smi")
    return len(subprocess.run([smi, "-L"], capture_output=True, text=True).stdout.splitlines()) if smi else 0


def test_device_sums_give_numpys_bits():
    from dsl import device_sums
    from dsl.program import loads
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(1000).astype(np.float32) for _ in range(2))
    up = loads("def f(x: f32[1000]) -> f32[1000]:\n  return x + 0.0\n", device="cuda").f
    s = device_sums.add(up(a), up(b))
    assert np.asarray(s).tobytes() == (a + b).tobytes()
    assert np.asarray(device_sums.divide(s, 3)).tobytes() == ((a + b) / np.float32(3)).tobytes()


@pytest.mark.skipif(not NCCL, reason="NCCL needs CuPy and mpi4py: pip install 'dslc[nccl,distributed]'")
@pytest.mark.skipif(gpus() < 2, reason="fewer than 2 GPUs")
def test_two_ranks_on_two_gpus_train_the_bits_of_the_cpu(tmp_path):
    path = quick(tmp_path, XOR)
    want = trained(path, tmp_path, "--micro-batches", "4")               # one process, CPU backend
    out = tmp_path / "gpus"
    rank = [sys.executable, "-m", "dsl", "train", str(path), "--steps", "3", "--device", "cuda",
            "--micro-batches", "4", "--checkpoint-dir", str(out)]
    r = mpiexec(["-n", "1", "-env", "CUDA_VISIBLE_DEVICES", "0", *rank, ":",
                      "-n", "1", "-env", "CUDA_VISIBLE_DEVICES", "1", *rank])
    assert r.returncode == 0, r.stderr
    got = safetensors.read(out / "step0000003.safetensors")
    for k in want:
        assert got[k].tobytes() == want[k].tobytes(), k


@pytest.mark.skipif(not NCCL, reason="NCCL needs CuPy and mpi4py: pip install 'dslc[nccl,distributed]'")
def test_two_ranks_on_one_gpu_end_with_a_diagnostic(tmp_path):
    """NCCL refuses two ranks of one communicator on one GPU: a diagnostic, not a hang."""
    r = dslc("train", str(quick(tmp_path, XOR)), "--steps", "3", "--device", "cuda",
             "--micro-batches", "4", "--ranks", "2", "--checkpoint-dir", "", timeout=240)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "NCCL could not join the ranks' GPUs" in r.stderr


def mpiexec(args: list[str]) -> subprocess.CompletedProcess:
    """MPICH's mpiexec (beside this Python, as the mpich wheel installs it) with these args."""
    where = str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]
    return subprocess.run([shutil.which("mpiexec", path=where), *args], capture_output=True,
                          text=True, timeout=240, env={**os.environ, "PYTHONPATH": str(ROOT)})
