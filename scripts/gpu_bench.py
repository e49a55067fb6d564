"""GPU benchmarks for scripts/gpu-check: fp32 `@` at 4096³ (exact mode) against cuBLAS through
torch with TF32 off, and the 4-layer GPT training step of benchmarks/train_step.py against
torch eager on the same GPU. Prints each ratio beside its target; --json writes them."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def timed(fn, repeat: int, sync) -> float:
    """The best wall-clock time of fn() over `repeat` calls after one warm-up, each synced."""
    fn()
    sync()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def matmul(n: int, repeat: int) -> dict:
    import torch

    import dsl
    prog = dsl.loads("def mm(a: f32[M, K], b: f32[K, N]) -> f32[M, N]:\n  return a @ b\n"
                     "def keep(a: f32[M, K]) -> f32[M, K]:\n  return a + 0.0\n", device="cuda")
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), np.float32) for _ in range(2))
    da, db = prog.keep(a), prog.keep(b)              # on the GPU, so that calls copy nothing
    ours = timed(lambda: prog.mm(da, db), repeat, lambda: None)   # a call waits for its kernels
    torch.backends.cuda.matmul.allow_tf32 = False    # cuBLAS's fp32 path, as exact as ours
    ta, tb = torch.tensor(a, device="cuda"), torch.tensor(b, device="cuda")
    theirs = timed(lambda: ta @ tb, repeat, torch.cuda.synchronize)
    got = np.asarray(prog.mm(da, db))
    err = float(np.max(np.abs(got - (ta @ tb).cpu().numpy())) / np.max(np.abs(got)))
    flops = 2 * n ** 3
    return {"n": n, "dslc_tflops": flops / ours / 1e12, "cublas_tflops": flops / theirs / 1e12,
            "ratio": theirs / ours, "target": ">= 0.5", "relative_difference": err}


def gpt_step(repeat: int) -> dict:
    import torch

    import dsl
    import train_step
    p, idx, tgt = train_step.gpt_inputs()
    s = train_step.state_like(p)
    prog = dsl.loads(train_step.GPT_STEP, name=str(train_step.MODELS / "gpt_step.bend"), device="cuda")
    start = time.perf_counter()
    prog.step(p, s, idx, tgt, 4)
    compile_s = time.perf_counter() - start
    state = {"p": p, "s": s}

    def step():
        state["p"], state["s"], _ = prog.step(state["p"], state["s"], idx, tgt, 4)
    ours = timed(step, repeat, lambda: None)
    # torch eager on the GPU: benchmarks/train_step.py's model with tensors made on the GPU,
    # and each step synced so that its time is the GPU's, not the launch queue's
    torch.set_default_device("cuda")
    plain = train_step.best
    train_step.best = lambda fn, n: plain(lambda: (fn(), torch.cuda.synchronize()), n)
    try:
        theirs = train_step.torch_gpt(p, idx, tgt, repeat)
    finally:
        train_step.best = plain
        torch.set_default_device("cpu")
    return {"dslc_ms": ours * 1e3, "torch_ms": theirs * 1e3, "ratio": ours / theirs,
            "target": "<= 1.5", "first_call_s": compile_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = {}
    for name, run in (("matmul", lambda: matmul(args.n, args.repeat)), ("gpt_step", lambda: gpt_step(args.repeat))):
        try:
            results[name] = run()
        except Exception as e:            # report the others: a partial result is a result
            results[name] = {"error": f"{type(e).__name__}: {e}"}
        print(f"{name}: {json.dumps(results[name])}", flush=True)
        if args.json:                     # after each one: a later one may run out of time
            args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
