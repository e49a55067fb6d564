"""dslc's CPU backend beside its peers on the same machine, in one run: each case of issue 15's
table timed for dslc, PyTorch eager, JAX `jit`, NumPy where it applies, `torch.compile` for the
products and IREE (device="iree", where installed) for the training steps and the products,
printed as dslc's time over each peer's (below 1 is faster). Steps are best
of --repeat wall-clock calls after a warm-up, the sides of a case taking turns (a burst of
other work on the machine falls on all of them alike), dslc and PyTorch on --threads threads each
(default 2), JAX and NumPy on as many as they take (every core; 2 where issue 15 measured). The
compile cases run in new processes, timed from their imports done to their first call's end:
the GPT step into an empty compile cache (cold), into one that holds the kernels every program
shares (program only), and from it (warm), beside JAX's first call; and a new batch size of an
already compiled GPT loss; IREE's first call of the GPT step compiles it into an empty cache.
--cases runs some of the three groups."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np

import train_step as ts
from timing import interleaved
from matmul import iree_product
from runtime import iree

LSTM = """
object Cell { Wx: f32[D, 4 * H], Wh: f32[H, 4 * H], b: f32[4 * H] }

def loss(p: Cell, x: f32[T, B, D]) -> f32:
  hs = fold xt in x with h = zeros([B, H]), c = zeros([B, H]):
    i, f, g, o = split(xt @ p.Wx + h @ p.Wh + p.b, 4, axis=-1)
    c = sigmoid(f) * c + sigmoid(i) * tanh(g)
    h = sigmoid(o) * tanh(c)
    return h
  return mean(hs * hs)

def grad_loss(p: Cell, x: f32[T, B, D]) -> Cell:
  return grad(loss, wrt=p)(p, x)
"""

GPT_LOSS = """
from gpt import GPT, loss

def gpt_loss(p: GPT, idx: i32[B, T], targets: i32[B, T], H: int) -> f32:
  return loss(p, idx, targets, H)
"""


# ---------------------------------------------------------------- JAX's side

def jax_gpt_loss(p, idx, tgt, H=4):
    import jax
    import jax.numpy as jnp
    B, T = idx.shape
    D = p["wte"].shape[1]

    def ln(x, g, b):
        m = x.mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b
    x = p["wte"][idx] + p["wpe"]
    mask = jnp.tril(jnp.ones((T, T))) > 0
    for blk in p["blocks"]:
        qkv = (ln(x, blk["ln1_g"], blk["ln1_b"]) @ blk["Wqkv"]).reshape(B, T, 3, H, D // H)
        q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
        att = jnp.where(mask, q @ k.transpose(0, 1, 3, 2) / np.sqrt(D // H), -1e9)
        y = (jax.nn.softmax(att, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(B, T, D)
        x = x + y @ blk["Wo"]
        h = jax.nn.gelu(ln(x, blk["ln2_g"], blk["ln2_b"]) @ blk["W1"] + blk["b1"], approximate=True)
        x = x + h @ blk["W2"] + blk["b2"]
    z = ln(x, p["lnf_g"], p["lnf_b"]) @ p["wte"].T
    return jnp.mean(jax.nn.logsumexp(z, -1) - jnp.take_along_axis(z, tgt[..., None], -1)[..., 0])


def jax_lstm_loss(p, x):
    import jax
    import jax.numpy as jnp
    B, H = x.shape[1], p["Wh"].shape[0]

    def cell(state, xt):
        h, c = state
        i, f, g, o = jnp.split(xt @ p["Wx"] + h @ p["Wh"] + p["b"], 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h
    _, hs = jax.lax.scan(cell, (jnp.zeros((B, H)), jnp.zeros((B, H))), x)
    return jnp.mean(hs * hs)


# ---------------------------------------------------------------- the cases

def steps(repeat: int) -> list[tuple[str, dict]]:
    """(case, {side: seconds}) for the training steps and the LSTM gradients, the sides of
    each case interleaved."""
    import jax
    import dsl
    rows = []
    p, x, y = ts.mlp_inputs()
    s = ts.state_like(p)
    prog = dsl.loads(ts.MLP, name=str(ts.MODELS / "mlp_step.bend"), device="cpu")
    rows.append(("names-MLP AdamW step", interleaved({
        "dslc": lambda: prog.step(p, s, x, y), "torch": ts.torch_mlp(p, x, y),
        "jax": ts.jax_mlp(p, x, y),
        **on_iree(ts.MLP, "mlp_step", p, s, x, y)}, repeat)))
    p, idx, tgt = ts.gpt_inputs()
    s = ts.state_like(p)
    prog = dsl.loads(ts.GPT_STEP, name=str(ts.MODELS / "gpt_step.bend"), device="cpu")
    rows.append(("4-layer GPT AdamW step", interleaved({
        "dslc": lambda: prog.step(p, s, idx, tgt, 4), "torch": ts.torch_gpt(p, idx, tgt),
        "jax": ts.on_jax(ts.jax_adamw_step(jax_gpt_loss), p, s, idx, tgt),
        **on_iree(ts.GPT_STEP, "gpt_step", p, s, idx, tgt, 4)}, repeat)))
    prog = dsl.loads(LSTM, name=str(ts.MODELS / "lstm.bend"), device="cpu")
    for T, B, D, H in [(16, 16, 64, 128), (32, 32, 64, 64)]:
        rng = np.random.default_rng(0)
        p = {"Wx": (rng.standard_normal((D, 4 * H)) * 0.1).astype(np.float32),
             "Wh": (rng.standard_normal((H, 4 * H)) * 0.1).astype(np.float32),
             "b": np.zeros(4 * H, np.float32)}
        x = rng.standard_normal((T, B, D)).astype(np.float32)
        grad = jax.jit(jax.grad(jax_lstm_loss))
        rows.append((f"LSTM loss gradient, T{T} B{B} D{D} H{H}", interleaved({
            "dslc": lambda: prog.grad_loss(p, x), "torch": torch_lstm(p, x),
            "jax": ts.on_jax(grad, p, x)}, repeat)))
    return rows


def on_iree(source: str, model: str, *inputs) -> dict:
    """{"iree": the program's step on device="iree"}, or {} without IREE."""
    import dsl
    if not iree.usable():
        return {}
    prog = dsl.loads(source, name=str(ts.MODELS / f"{model}.bend"), device="iree")
    return {"iree": lambda: prog.step(*inputs)}


def torch_lstm(p, x):
    """The LSTM loss's gradient in PyTorch eager (a function)."""
    import torch
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
    tx = torch.tensor(x)
    H = p["Wh"].shape[0]

    def run():
        h = c = torch.zeros(x.shape[1], H)
        hs = []
        for xt in tx:
            i, f, g, o = (xt @ tp["Wx"] + h @ tp["Wh"] + tp["b"]).chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            hs.append(h)
        torch.autograd.grad(torch.stack(hs).pow(2).mean(), list(tp.values()))
    return run


PRODUCTS = [(64, 64, 64), (1, 768, 2304), (1024, 512, 128)]


def products(repeat: int, compiled: bool) -> list[tuple[str, dict]]:
    """`@` on float32 matrices of M×K and K×N: dslc's contraction kernel (as a program's `@`
    calls it), NumPy, PyTorch, JAX, torch.compile and IREE."""
    import jax
    import torch
    from runtime.cpu import matmul, threads
    rows = []
    for M, K, N in PRODUCTS:
        rng = np.random.default_rng(0)
        a, b = rng.standard_normal((M, K), np.float32), rng.standard_normal((K, N), np.float32)
        out = np.empty((M, N), np.float32)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        count = threads()                      # (read once: NumPy is not charged for it either)
        calls = {"dslc": lambda: matmul(a, b, out, count), "torch": lambda: ta @ tb,
                 "jax": ts.on_jax(jax.jit(lambda x, y: x @ y), a, b), "numpy": lambda: a @ b}
        if compiled:
            tmm = torch.compile(lambda x, y: x @ y)
            calls["torch.compile"] = lambda: tmm(ta, tb)
        if (imm := iree_product(a, b, "f32")) is not None:
            calls["iree"] = imm
        rows.append((f"@ {M}x{K}x{N}", interleaved(calls, repeat * 20)))
    return rows


# The kernels every program shares, compiled once per machine (backend/contract.py's product,
# backend/scatter.py's embedding gradient, the thread team), as jaxlib's are when installed: a
# program that uses them all, compiled first for the "program only" cold compile.
RUNTIME = """
def f(w: f32[V, D], i: i32[N], x: f32[D, D]) -> f32:
  return sum(w[i] @ x)

def g(w: f32[V, D], i: i32[N], x: f32[D, D]) -> f32[V, D]:
  return grad(f, wrt=w)(w, i, x)
"""


# Each first call runs in a new process (python peers.py --first SIDE): its imports and inputs
# made before the clock starts; it prints the seconds to its first call's end.
def first_call(side: str) -> float:
    import dsl
    import dsl.program      # dslc's own imports, which `import dsl` leaves to its first use
    import runtime.cpu
    if side == "runtime":
        w, x = np.ones((5, 8), np.float32), np.ones((8, 8), np.float32)
        dsl.loads(RUNTIME, name=str(ts.MODELS / "runtime.bend"), device="cpu").g(w, np.arange(3, dtype=np.int32), x)
        return 0.0
    p, idx, tgt = ts.gpt_inputs()
    s = ts.state_like(p)
    if side == "jax":
        step = ts.jax_adamw_step(jax_gpt_loss)
        start = time.perf_counter()
        ts.ready(lambda: step(p, s, idx, tgt))()
        return time.perf_counter() - start
    start = time.perf_counter()
    device = "iree" if side == "iree" else "cpu"
    dsl.loads(ts.GPT_STEP, name=str(ts.MODELS / "gpt_step.bend"), device=device).step(p, s, idx, tgt, 4)
    return time.perf_counter() - start


def in_new_process(side: str, cache: str) -> float:
    out = subprocess.run([sys.executable, __file__, "--first", side], check=True, text=True,
                         capture_output=True, env={**os.environ, "DSLC_CACHE_DIR": cache})
    return float(out.stdout.split()[-1])


def new_batch_size() -> dict:
    """The first call of a GPT loss at batch 3 after one at batch 16, in an empty compile
    cache (where an earlier run left batch 3's entries, the call would only load them): dslc
    and JAX compile again, PyTorch runs."""
    with tempfile.TemporaryDirectory(prefix="dslc-peers-") as empty, \
            mock.patch.dict(os.environ, {"DSLC_CACHE_DIR": empty}):
        return _new_batch_size()


def _new_batch_size() -> dict:
    import jax
    import dsl
    p, idx, tgt = ts.gpt_inputs()
    prog = dsl.loads(GPT_LOSS, name=str(ts.MODELS / "gpt_loss.bend"), device="cpu")
    loss = jax.jit(jax_gpt_loss)
    prog.gpt_loss(p, idx, tgt, 4)
    ts.ready(lambda: loss(p, idx, tgt))()
    small = idx[:3], tgt[:3]
    times = {}
    for side, call in [("dslc", lambda: prog.gpt_loss(p, *small, 4)),
                       ("jax", ts.ready(lambda: loss(p, *small))), ("torch", torch_loss(p, *small))]:
        start = time.perf_counter()
        call()
        times[side] = time.perf_counter() - start
    return times


def torch_loss(p, idx, tgt):
    """The GPT loss's forward pass in PyTorch eager, without gradients."""
    import torch
    _, loss = ts.torch_gpt_loss(p, idx, tgt)
    return torch.no_grad()(loss)


def compiles(repeat: int) -> list[tuple[str, dict]]:
    with tempfile.TemporaryDirectory(prefix="dslc-peers-") as empty, \
            tempfile.TemporaryDirectory(prefix="dslc-peers-") as cache, \
            tempfile.TemporaryDirectory(prefix="dslc-peers-") as for_iree:
        jax_first = min(in_new_process("jax", empty) for _ in range(2))
        cold = in_new_process("dslc", empty)
        first = {"iree": in_new_process("iree", for_iree)} if iree.usable() else {}
        warm = min(in_new_process("dslc", empty) for _ in range(3))
        in_new_process("runtime", cache)
        program = in_new_process("dslc", cache)
    return [("GPT step, cold compile / first call", {"dslc": cold, "jax": jax_first, **first}),
            ("  the same, program only (runtime kernels cached)", {"dslc": program, "jax": jax_first}),
            ("GPT step, warm cached load (target < 0.2 s)", {"dslc": warm, "jax": jax_first}),
            ("a new batch size (GPT loss, B 16 -> 3)", new_batch_size())]


SIDES = ["torch", "jax", "iree", "numpy", "torch.compile"]


def report(rows: list[tuple[str, dict]]) -> None:
    print(f"{'case':46} {'dslc':>10}" + "".join(f" {s:>22}" for s in SIDES))
    for case, times in rows:
        cells = "".join(f" {_time(times[s]):>10} {times['dslc'] / times[s]:>9.2f}x ".rjust(23)
                        if s in times else f" {'':>22}" for s in SIDES)
        print(f"{case:46} {_time(times['dslc']):>10}{cells}", flush=True)


def _time(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.3f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-torch-compile", action="store_true", help="leave torch.compile out")
    ap.add_argument("--cases", nargs="*", choices=["steps", "products", "compiles"],
                    default=["steps", "products", "compiles"])
    ap.add_argument("--first", choices=["dslc", "jax", "iree", "runtime"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ.setdefault("DSLC_THREADS", str(args.threads))
    import torch
    torch.set_num_threads(args.threads)
    if args.first:
        print(first_call(args.first))
        return
    print(f"{args.threads} threads each; dslc's time, then each peer's and dslc / peer "
          f"(below 1: dslc is faster); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if "steps" in args.cases:
        report(steps(args.repeat))
    if "products" in args.cases:
        report(products(args.repeat, not args.no_torch_compile))
    if "compiles" in args.cases:
        report(compiles(args.repeat))


if __name__ == "__main__":
    main()
