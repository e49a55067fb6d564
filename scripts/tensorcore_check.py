"""The tensor-core kernels (backend/tensorcore.py) on a real GPU, for scripts/gpu-check: each
input dtype's product at 1000 × 700 × 900 against a float64 reference within docs/numerics.md's
bound (tests/gpu/test_tensorcore.py's), then bf16 TFLOP/s at 8192³ beside cuBLAS's (torch).
Exits 1 if a product leaves the bound; --json writes the measurements."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "gpu")]
from backend import tensorcore  # noqa: E402
from runtime import cuda  # noqa: E402
from test_tensorcore import NUMPY, bound  # noqa: E402


def run(drv, module, dtype: str, a: np.ndarray, b: np.ndarray, repeat: int = 0) -> tuple[np.ndarray, float]:
    """a @ b on the GPU by the tensor-core kernel, and the best time of `repeat` launches."""
    (m, k), n = a.shape, b.shape[1]
    pointers = [drv.alloc(x.nbytes) for x in (a, b)] + [drv.alloc(m * n * a.itemsize)]
    drv.upload(pointers[0], a)
    drv.upload(pointers[1], b)
    shape = tensorcore.launch(dtype, 1, m, n)
    fn = drv.function(module, shape.entry)
    go = lambda: drv.launch(fn, shape.grid, shape.block, pointers, [m, n, k, 0, 0, 0, 1])
    go()
    drv.synchronize()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        go()
        drv.synchronize()
        best = min(best, time.perf_counter() - start)
    c = np.empty((m, n), a.dtype)
    drv.download(c, pointers[2])
    for p in pointers:
        drv.free(p)
    return c, best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json")
    args = parser.parse_args()
    drv = cuda.driver()
    module = drv.load(tensorcore.ptx(arch=cuda.arch(drv)))
    rng = np.random.default_rng(0)
    report, ok = {}, True
    for dtype in tensorcore.DTYPES:
        a = rng.standard_normal((1000, 900)).astype(NUMPY[dtype])
        b = rng.standard_normal((900, 700)).astype(NUMPY[dtype])
        got, _ = run(drv, module, dtype, a, b)
        error = np.abs(got.astype(np.float64) - a.astype(np.float64) @ b.astype(np.float64))
        worst = float((error / bound(dtype, a[None], b[None])[0]).max())
        ok &= worst <= 1
        report[f"{dtype}_error_over_bound"] = worst
        print(f"{dtype}: largest error / documented bound = {worst:.3f} {'ok' if worst <= 1 else 'OUTSIDE THE BOUND'}")
    n = 8192
    a = rng.standard_normal((n, n)).astype(NUMPY["bf16"])
    _, seconds = run(drv, module, "bf16", a, a, repeat=3)
    report["bf16_tflops"] = 2 * n ** 3 / seconds / 1e12
    try:
        import torch
        t = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(4):
            start = time.perf_counter()
            t @ t
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
        report["cublas_bf16_tflops"] = 2 * n ** 3 / best / 1e12
        report["ratio"] = report["bf16_tflops"] / report["cublas_bf16_tflops"]
    except ImportError:
        pass
    print(f"bf16 @ at {n}³: {report['bf16_tflops']:.1f} TFLOP/s"
          + (f", cuBLAS {report['cublas_bf16_tflops']:.1f} (ratio {report['ratio']:.2f}, target ≥ 0.70)"
             if "ratio" in report else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
