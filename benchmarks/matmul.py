"""float32 matmul: dslc's CPU kernel (backend/contract.py) against NumPy (OpenBLAS), both on
the same number of threads (2 by default), in one process; prints GFLOP/s and the ratio
dslc / NumPy (target: at least 0.7). Rates are best-of-N wall clock, NumPy and dslc
interleaved so that both see the same background load."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", type=int, nargs="*", default=[128, 256, 512, 1024, 2048])
    ap.add_argument("--repeat", type=int, default=10, help="timed calls in a row; best is kept")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the two sides")
    ap.add_argument("--dtype", default="f32", choices=["f32", "f64"])
    args = ap.parse_args()
    # OpenBLAS reads its thread count once, when NumPy is first imported.
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import numpy as np
    from backend.contract import Matmul

    kernel = Matmul(args.dtype)
    load = os.getloadavg()[0]
    print(f"tiles {kernel.tiles}, {args.threads} threads, best of {args.rounds}×{args.repeat}; "
          f"load average {load:.1f} on {os.cpu_count()} CPUs")
    if load > 0.5:
        print("warning: other processes are running; wall-clock rates will scatter")
    print(f"{'n':>6} {'numpy GFLOP/s':>14} {'dslc GFLOP/s':>13} {'ratio':>6}")
    rng = np.random.default_rng(0)
    dtype = np.float32 if args.dtype == "f32" else np.float64
    for n in args.sizes:
        a, b = (rng.standard_normal((n, n)).astype(dtype) for _ in range(2))
        runs = {"numpy": lambda: a @ b, "dslc": lambda: kernel(a, b, threads=args.threads)}
        best = dict.fromkeys(runs, float("inf"))
        # Back-to-back calls of one side, as a training loop makes them, then a pause (after a
        # call, OpenBLAS's threads spin ~0.1 s, on the cores the other side would use); the
        # rounds alternate so that both sides see the same background load.
        for _ in range(args.rounds):
            for name, run in runs.items():
                time.sleep(0.3)
                run()                                        # warm: code, pages, threads
                for _ in range(args.repeat):
                    start = time.perf_counter()
                    run()
                    best[name] = min(best[name], time.perf_counter() - start)
        gflops = {name: 2 * n ** 3 / t / 1e9 for name, t in best.items()}
        print(f"{n:>6} {gflops['numpy']:>14.1f} {gflops['dslc']:>13.1f} "
              f"{gflops['dslc'] / gflops['numpy']:>6.2f}")


if __name__ == "__main__":
    main()
