"""GPU benchmarks for scripts/gpu-check: fp32 `@` at 4096³ (exact mode) against cuBLAS through
torch with TF32 off, the 4-layer GPT training step of benchmarks/train_step.py against
torch eager on the same GPU, a small RNN's fold as one persistent kernel against its body
launched step by step, and an MLP's training step as a CUDA graph against its plan walked.
Prints each ratio beside its target; --json writes them."""
from __future__ import annotations

import argparse
import json
import os
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


RNN = """
def f(xs: f32[T, B, I], w: f32[I, H], u: f32[H, H], h0: f32[B, H]) -> f32[T, B, H]:
  hs = fold x in xs with h = h0:
    h = tanh(x @ w + h @ u)
    return h
  return hs
"""

MLP_STEP = """
def step(w1: f32[D, D], w2: f32[D, D], w3: f32[D, 10], x: f32[B, D], lr: f32) -> (f32[D, D], f32[D, D], f32[D, 10], f32):
  def loss(w1, w2, w3):
    y = tanh(tanh(x @ w1) @ w2) @ w3
    return mean(y * y)
  l, g = value_and_grad(loss, wrt=(w1, w2, w3))(w1, w2, w3)
  return w1 - lr * g[0], w2 - lr * g[1], w3 - lr * g[2], l
"""


def persistent_fold(repeat: int) -> dict:
    """A small RNN's fold over 1000 steps: one persistent kernel, against its body's kernels
    launched step by step (the rule's WORK at 0)."""
    import dsl
    from backend import persistent
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((1000, 4, 8), (8, 16), (16, 16), (4, 16))]
    one = dsl.loads(RNN, device="cuda")
    ours = timed(lambda: one.f(*args), repeat, lambda: None)
    work, persistent.WORK = persistent.WORK, 0
    try:
        stepped = dsl.loads(RNN, device="cuda")
        theirs = timed(lambda: stepped.f(*args), repeat, lambda: None)
    finally:
        persistent.WORK = work
    return {"persistent_ms": ours * 1e3, "stepped_ms": theirs * 1e3, "speedup": theirs / ours, "target": ">= 1"}


def cuda_graph(repeat: int) -> dict:
    """A 3-layer MLP's training step (about 20 launches) replayed as a CUDA graph, against
    the same plan walked at each call (DSLC_CUDA_GRAPHS=0)."""
    import dsl
    rng = np.random.default_rng(0)
    src = MLP_STEP.replace("D", "256").replace("B", "64")
    state = [rng.standard_normal(s).astype(np.float32) * 0.05 for s in ((256, 256), (256, 256), (256, 10))]
    x = rng.standard_normal((64, 256)).astype(np.float32)
    times = {}
    for graphs in ("1", "0"):
        os.environ["DSLC_CUDA_GRAPHS"] = graphs      # (read when the first call makes the executable)
        prog = dsl.loads(src, device="cuda")
        weights = list(state)

        def step():
            weights[:] = prog.step(*weights, x, np.float32(0.01))[:3]
        times[graphs] = timed(step, repeat, lambda: None)
    del os.environ["DSLC_CUDA_GRAPHS"]
    return {"graph_ms": times["1"] * 1e3, "walked_ms": times["0"] * 1e3, "speedup": times["0"] / times["1"],
            "target": ">= 1"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = {}
    for name, run in (("matmul", lambda: matmul(args.n, args.repeat)), ("gpt_step", lambda: gpt_step(args.repeat)),
                      ("persistent_fold", lambda: persistent_fold(args.repeat)),
                      ("cuda_graph", lambda: cuda_graph(10 * args.repeat))):
        try:
            results[name] = run()
        except Exception as e:            # report the others: a partial result is a result
            results[name] = {"error": f"{type(e).__name__}: {e}"}
        print(f"{name}: {json.dumps(results[name])}", flush=True)
        if args.json:                     # after each one: a later one may run out of time
            args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
