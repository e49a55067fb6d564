"""One training step (forward, backward, AdamW) of the names MLP and of a 4-layer GPT: dslc's
CPU backend beside PyTorch eager (and, for the names MLP, JAX's jit) on the same machine, in
one run, as ratios; and the GPT
step's cold compile and warm (cached) load times, in the same process and in a new one.
Set DSLC_THREADS and torch's threads alike (default 2 each); on a machine other work is
using, `--threads 1 --cpu-time` compares CPU time instead of wall time."""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from timing import interleaved

MODELS = Path(__file__).parent / "models"

MLP = """
from optim import adamw
object Params { C: f32[V, E], W1: f32[T * E, H], b1: f32[H], W2: f32[H, V], b2: f32[V] }

def loss(p: Params, x: i32[B, T], y: i32[B]) -> f32:
  h = tanh(reshape(p.C[x], [B, T * E]) @ p.W1 + p.b1)
  z = h @ p.W2 + p.b2
  m = max(z, axis=-1, keepdims=True)
  lse = log(sum(exp(z - m), axis=-1)) + m[:, 0]
  return mean(lse - sum(z * one_hot(y, V), axis=-1))

def step(p: Params, s: (i32, Params, Params), x: i32[B, T], y: i32[B]) -> (Params, (i32, Params, Params), f32):
  l, g = value_and_grad(loss, wrt=p)(p, x, y)
  q, s2 = adamw(p, g, s, lr=1e-3)
  return q, s2, l
"""

GPT_STEP = """
from optim import adamw
from gpt import GPT, loss

def step(p: GPT, s: (i32, GPT, GPT), idx: i32[B, T], targets: i32[B, T], H: int) -> (GPT, (i32, GPT, GPT), f32):
  l, g = value_and_grad(loss, wrt=p)(p, idx, targets, H)
  q, s2 = adamw(p, g, s, lr=3e-4)
  return q, s2, l
"""


def best(fn, repeat: int, clock=time.perf_counter) -> float:
    return interleaved({"": fn}, repeat, rounds=1, clock=clock)[""]


def state_like(p):
    z = {k: (np.zeros_like(v) if not isinstance(v, list) else [{a: np.zeros_like(b) for a, b in x.items()} for x in v])
         for k, v in p.items()}
    return (np.zeros((), np.int32), z, z)


def torch_step(params, loss_fn, *inputs):
    import torch
    opt = torch.optim.AdamW([t for t in params], lr=1e-3, weight_decay=1e-2)

    def run():
        opt.zero_grad()
        loss = loss_fn(*inputs)
        loss.backward()
        opt.step()
    return run


MLP_SIZES = {"B": 32, "T": 3, "E": 10, "H": 200, "V": 27}


def mlp_inputs():
    B, T, E, H, V = MLP_SIZES.values()
    rng = np.random.default_rng(0)
    p = {"C": rng.standard_normal((V, E), np.float32), "W1": rng.standard_normal((T * E, H), np.float32) * 0.1,
         "b1": np.zeros(H, np.float32), "W2": rng.standard_normal((H, V), np.float32) * 0.01,
         "b2": np.zeros(V, np.float32)}
    x = rng.integers(0, V, (B, T)).astype(np.int32)
    y = rng.integers(0, V, B).astype(np.int32)
    return p, x, y


def mlp_case(repeat, clock=time.perf_counter):
    """The names MLP step's best times: dslc's, PyTorch eager's and JAX jit's, interleaved."""
    import dsl
    p, x, y = mlp_inputs()
    prog = dsl.loads(MLP, name=str(MODELS / "mlp_step.bend"), device="cpu")
    s = state_like(p)
    times = interleaved({"dslc": lambda: prog.step(p, s, x, y), "torch": torch_mlp(p, x, y),
                         "jax": jax_mlp(p, x, y)}, repeat, clock=clock)
    return times["dslc"], times["torch"], times["jax"]


def torch_mlp(p, x, y):
    """The names MLP's training step in PyTorch eager (a function)."""
    import torch
    B, T, E, _, _ = MLP_SIZES.values()
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
    tx, ty = torch.tensor(x, dtype=torch.long), torch.tensor(y, dtype=torch.long)

    def loss():
        h = torch.tanh(tp["C"][tx].reshape(B, T * E) @ tp["W1"] + tp["b1"])
        return torch.nn.functional.cross_entropy(h @ tp["W2"] + tp["b2"], ty)
    return torch_step(tp.values(), loss)


def jax_mlp(p, x, y):
    """The names MLP step by JAX's jit (XLA), AdamW as dsl/lib/optim.bend has it (a function
    that waits for its results)."""
    return on_jax(jax_adamw_step(jax_mlp_loss), p, state_like(p), x, y)


def jax_adamw_step(loss):
    """A jitted AdamW step of `loss` (dslc's optim.adamw: lr 1e-3, weight decay 1e-2)."""
    import jax
    import jax.numpy as jnp

    def step(p, s, *inputs):
        t, m, v = s
        value, g = jax.value_and_grad(loss)(p, *inputs)
        t = t + 1
        m = jax.tree.map(lambda a, d: a + 0.1 * (d - a), m, g)
        v = jax.tree.map(lambda b, d: b * 0.999 + 0.001 * d * d, v, g)
        size, root = 1e-3 / (1 - 0.9 ** t), jnp.sqrt(1 - 0.999 ** t)
        p = jax.tree.map(lambda w, a, b: w * (1 - 1e-5) - size * a / (jnp.sqrt(b) / root + 1e-8), p, m, v)
        return p, (t, m, v), value
    return jax.jit(step)


def jax_mlp_loss(p, x, y):
    import jax
    import jax.numpy as jnp
    B, T = x.shape
    h = jnp.tanh(p["C"][x].reshape(B, T * p["C"].shape[1]) @ p["W1"] + p["b1"])
    z = h @ p["W2"] + p["b2"]
    return jnp.mean(jax.nn.logsumexp(z, axis=-1) - jnp.take_along_axis(z, y[:, None], axis=-1)[:, 0])


def on_jax(fn, *args):
    """fn(*args), its arguments put on JAX's device once, as a JAX user keeps parameters and
    batches there (given NumPy arrays, each call copies them in: the names MLP step took
    0.157-0.169 ms so, 0.120-0.124 ms with them on the device); a function that waits for
    the results."""
    import jax
    args = jax.device_put(args)
    return ready(lambda: fn(*args))


def ready(fn):
    """fn, waiting for JAX's asynchronous results (a no-op on NumPy's and PyTorch's)."""
    import jax
    return lambda: jax.block_until_ready(fn())


def gpt_inputs(layers=4, B=16, T=64, D=128, V=65):
    rng = np.random.default_rng(0)
    n = lambda *s: (rng.standard_normal(s) * 0.02).astype(np.float32)
    block = lambda: {"ln1_g": np.ones(D, np.float32), "ln1_b": np.zeros(D, np.float32), "Wqkv": n(D, 3 * D),
                     "Wo": n(D, D), "ln2_g": np.ones(D, np.float32), "ln2_b": np.zeros(D, np.float32),
                     "W1": n(D, 4 * D), "b1": np.zeros(4 * D, np.float32), "W2": n(4 * D, D),
                     "b2": np.zeros(D, np.float32)}
    p = {"wte": n(V, D), "wpe": n(T, D), "blocks": [block() for _ in range(layers)],
         "lnf_g": np.ones(D, np.float32), "lnf_b": np.zeros(D, np.float32)}
    idx = rng.integers(0, V, (B, T)).astype(np.int32)
    tgt = rng.integers(0, V, (B, T)).astype(np.int32)
    return p, idx, tgt


def gpt_case(repeat, clock=time.perf_counter):
    import dsl
    p, idx, tgt = gpt_inputs()
    s = state_like(p)
    cache = tempfile.mkdtemp(prefix="dslc-bench-cache-")
    os.environ["DSLC_CACHE_DIR"] = cache
    try:
        t = time.perf_counter()
        prog = dsl.loads(GPT_STEP, name=str(MODELS / "gpt_step.bend"), device="cpu")
        prog.step(p, s, idx, tgt, 4)
        cold = time.perf_counter() - t
        t = time.perf_counter()
        warm_prog = dsl.loads(GPT_STEP, name=str(MODELS / "gpt_step.bend"), device="cpu")
        warm_prog.step(p, s, idx, tgt, 4)
        warm = time.perf_counter() - t
        fresh = min(warm_in_new_process() for _ in range(3))
        times = interleaved({"dslc": lambda: prog.step(p, s, idx, tgt, 4),
                             "torch": torch_gpt(p, idx, tgt)}, repeat, clock=clock)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return times["dslc"], times["torch"], cold, warm, fresh


def warm_in_new_process() -> float:
    """Load and first step of the GPT from the compile cache in a new Python process, its
    imports not counted (as the test of a warm load: what a second `dslc train` would wait)."""
    code = ("import sys, time; sys.path[:0] = [{root!r}, {here!r}]; import train_step as b, dsl, dsl.program; "
            "p, i, t = b.gpt_inputs(); s = b.state_like(p); c = time.perf_counter(); "
            "dsl.loads(b.GPT_STEP, name=str(b.MODELS / 'gpt_step.bend'), device='cpu')"
            ".step(p, s, i, t, 4); print(time.perf_counter() - c)")
    here = Path(__file__).resolve().parent
    out = subprocess.run([sys.executable, "-c", code.format(root=str(here.parent), here=str(here))],
                         check=True, capture_output=True, text=True, env=os.environ)
    return float(out.stdout.split()[-1])


def torch_gpt(p, idx, tgt):
    """The GPT's training step in PyTorch eager (a function)."""
    return torch_step(*torch_gpt_loss(p, idx, tgt))


def torch_gpt_loss(p, idx, tgt):
    """The GPT's parameters as PyTorch tensors, and its loss on these inputs (a function)."""
    import torch
    import torch.nn.functional as F
    H = 4
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in p.items() if k != "blocks"}
    blocks = [{k: torch.tensor(v, requires_grad=True) for k, v in b.items()} for b in p["blocks"]]
    ti, tt = torch.tensor(idx, dtype=torch.long), torch.tensor(tgt, dtype=torch.long)
    B, T = idx.shape
    D = tp["wte"].shape[1]
    mask = torch.tril(torch.ones(T, T)) > 0

    def ln(x, g, b):
        return F.layer_norm(x, (D,), g, b, 1e-5)

    def loss():
        x = tp["wte"][ti] + tp["wpe"]
        for blk in blocks:
            qkv = (ln(x, blk["ln1_g"], blk["ln1_b"]) @ blk["Wqkv"]).reshape(B, T, 3, H, D // H)
            q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
            att = (q @ k.transpose(-1, -2)) * (1.0 / (D // H) ** 0.5)
            att = torch.softmax(att.masked_fill(~mask, -1e9), dim=-1)
            x = x + (att @ v).transpose(1, 2).reshape(B, T, D) @ blk["Wo"]
            h = F.gelu(ln(x, blk["ln2_g"], blk["ln2_b"]) @ blk["W1"] + blk["b1"], approximate="tanh")
            x = x + h @ blk["W2"] + blk["b2"]
        z = ln(x, tp["lnf_g"], tp["lnf_b"]) @ tp["wte"].T
        return F.cross_entropy(z.reshape(B * T, -1), tt.reshape(-1))
    return list(tp.values()) + [t for b in blocks for t in b.values()], loss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cpu-time", action="store_true",
                    help="time the steps by the process's CPU time (use with --threads 1): "
                         "ratios that hold on a machine other work is using")
    ap.add_argument("--only-mlp", action="store_true", help="the names MLP step alone")
    args = ap.parse_args()
    os.environ.setdefault("DSLC_THREADS", str(args.threads))
    os.environ.setdefault("XLA_FLAGS", f"--xla_cpu_multi_thread_eigen={str(args.threads > 1).lower()} "
                                       f"intra_op_parallelism_threads={args.threads}")
    import torch
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.cpu_time else time.perf_counter
    d, t, j = mlp_case(args.repeat, clock)
    print(f"names MLP step:  dslc {d * 1e3:8.3f} ms   torch {t * 1e3:8.3f} ms   ratio {d / t:6.2f}x"
          f"   jax jit {j * 1e3:8.3f} ms   ratio {d / j:6.2f}x")
    if args.only_mlp:
        return
    d, t, cold, warm, fresh = gpt_case(args.repeat, clock)
    print(f"4-layer GPT step: dslc {d * 1e3:8.2f} ms   torch {t * 1e3:8.2f} ms   ratio {d / t:6.2f}x")
    print(f"GPT step compile: cold {cold:.2f} s (target < 15 s), warm cached load {warm:.2f} s "
          f"in the same process, {fresh:.2f} s in a new one (target < 0.5 s)")


if __name__ == "__main__":
    main()
