"""The cost of the t-th generated token of a small GPT-2 (examples/gpt2.bend) on the CPU
backend, for t = 1, 2, 4, …, 256: one `decode` call with the key/value cache beside
recomputing the `forward` of the whole sequence, side by side in one run; and the kernels each
launches (from the compiled plans). Set DSLC_THREADS (default 2)."""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

MODEL = Path(__file__).resolve().parent.parent / "examples" / "gpt2.bend"


def random_gpt2(n_layer: int, d: int, vocab: int, n_ctx: int, seed: int = 0) -> dict:
    """The GPT2 record of gpt2.bend with GPT-2-like random weights."""
    rng = np.random.default_rng(seed)
    n = lambda *s: (rng.standard_normal(s) * 0.02).astype(np.float32)
    norm = lambda: {"weight": np.ones(d, np.float32), "bias": np.zeros(d, np.float32)}
    affine = lambda i, o: {"weight": n(i, o), "bias": np.zeros(o, np.float32)}
    block = lambda: {"ln_1": norm(), "attn": {"c_attn": affine(d, 3 * d), "c_proj": affine(d, d)},
                     "ln_2": norm(), "mlp": {"c_fc": affine(d, 4 * d), "c_proj": affine(4 * d, d)}}
    return {"wte": n(vocab, d), "wpe": n(n_ctx, d), "h": [block() for _ in range(n_layer)], "ln_f": norm()}


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def launches(prog, name: str, args: tuple) -> dict[str, int]:
    """What one call of `name` runs, by kind: fused kernels (a product's epilogue included),
    matrix products, host steps (views, which compute nothing, left out), and of those the
    ones Python runs (the rest are in the native call: docs/cpu.md)."""
    from backend.schedule import ContractStep, HostStep, made_once
    low, _ = prog.lower(name, args, {})
    exe = prog.executable(low.function)
    plan = exe.plan
    return {"kernels": len(plan.kernels), "matmuls": sum(isinstance(s, ContractStep) for s in plan.steps),
            "host": sum(isinstance(s, HostStep) and not made_once(s.op) for s in plan.steps),
            "python": sum(isinstance(x, int) and not made_once(plan.steps[x].op) for x in exe.native.items)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=256, help="the last token measured (a power of 2)")
    ap.add_argument("--repeat", type=int, default=10, help="rounds; each time is the best of them")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("DSLC_THREADS", str(args.threads))
    # forward at each of the 9 lengths is a specialisation of its own, timed round after round:
    # with the default 8 kept, each call built its specialisation again (12 ms at any length)
    os.environ.setdefault("DSLC_SPECIALISATIONS", "16")
    import dsl

    n_ctx = args.tokens + 1
    p = random_gpt2(args.layers, args.width, args.vocab, n_ctx)
    prog = dsl.load(str(MODEL), device="cpu")
    rng = np.random.default_rng(1)
    seq = rng.integers(0, args.vocab, (1, args.tokens + 1)).astype(np.int32)
    # the cache of the whole run, as decode sees it at every step: entries past pos are
    # never read, so timing decode at position t on it is timing the t-th token
    _, cache = prog.prefill(p, seq, args.heads, n_ctx)
    print(f"GPT-2 with {args.layers} layers, {args.heads} heads, width {args.width}, vocabulary "
          f"{args.vocab}, a cache of {n_ctx} positions; DSLC_THREADS={os.environ['DSLC_THREADS']}")
    step = (p, seq[:, 0], np.array(0, np.int32), cache)
    counts = launches(prog, "decode", step)
    print(f"decode, every token: {counts['kernels']} fused kernels + {counts['matmuls']} matrix "
          f"products + {counts['host']} host steps, {counts['python']} of them in Python")
    tokens = [2 ** i for i in range(args.tokens.bit_length()) if 2 ** i <= args.tokens]
    calls = {t: (lambda t=t: prog.decode(p, seq[:, t], np.array(t, np.int32), cache),
                 lambda t=t: prog.forward(p, seq[:, :t + 1], args.heads)) for t in tokens}
    best = {t: [timed(c), timed(f)] for t, (c, f) in calls.items()}     # the first compiles
    for _ in range(args.repeat):        # rounds over every token, so that noise spreads evenly
        for t, (c, f) in calls.items():
            best[t] = [min(best[t][0], timed(c)), min(best[t][1], timed(f))]
    print(f"{'token':>6} {'cached decode':>14} {'full forward':>13} {'ratio':>7}   forward's launches")
    for t in tokens:
        cached, full = best[t]
        c = launches(prog, "forward", (p, seq[:, :t + 1], args.heads))
        print(f"{t:>6} {cached * 1e3:11.2f} ms {full * 1e3:10.2f} ms {full / cached:6.1f}x   "
              f"{c['kernels']} + {c['matmuls']} + {c['host']}")


if __name__ == "__main__":
    main()
