"""float32 matmul: dslc's CPU kernel (backend/contract.py) against NumPy (OpenBLAS), both on
the same number of threads (2 by default), in one process; prints GFLOP/s and the ratio
dslc / NumPy (target: at least 0.7). Then the products of a 4-layer GPT training step
(benchmarks/train_step.py) against torch.matmul where torch is installed: microseconds and
the ratio dslc / torch (1 or less is as fast). Then small and skinny products (64³, a decoder's
token, the medium products of the GPT step's forward and backward passes) as the runtime calls
them (runtime.cpu.matmul), beside NumPy and torch: the ratios dslc / NumPy and dslc / torch,
and dslc's GFLOP/s as a share of its rate at the largest of --sizes. Last, where a call's
time goes (--calls): the kernel alone (called n times from a native loop), the direct call
from Python (Matmul.direct), the runtime's (runtime.cpu.matmul), the checked path
(Matmul.__call__) and NumPy's, on one thread (--calls: only that). Rates are best-of-N wall clock, the sides
interleaved so that all see the same background load."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from timing import interleaved

# (name, A's shape, B's shape, B read transposed from a contiguous [N, K] array)
GPT_SHAPES = [
    ("x @ W, d 128", (1024, 128), (128, 128), False),
    ("heads: att @ v", (64, 64, 64), (64, 64, 32), False),
    ("x @ W, 65 columns", (1024, 128), (128, 65), False),
    ("MLP down, d 512", (1024, 512), (512, 128), False),
    ("dX = dY @ W^T, 384", (1024, 128), (128, 384), True),
    ("dX = dY @ W^T, 128", (1024, 512), (512, 128), True),
    ("4 x 4 (call overhead)", (4, 4), (4, 4), False),
]

# (name, M, K, N, A read transposed, B read transposed): products of few rows (the job grid
# once gave them one thread, or one thread two jobs of three); the GPT step's gradient reads
# h.T @ dY and x.T @ dH (A transposed) and dY @ W.T (B transposed)
SMALL_SHAPES = [
    ("64³", 64, 64, 64, False, False),
    ("a decoder's token", 1, 768, 2304, False, False),
    ("few rows", 96, 96, 256, False, False),
    ("three row blocks", 256, 256, 256, False, False),
    ("narrow", 200, 512, 64, False, False),
    ("MLP down", 1024, 512, 128, False, False),
    ("dX = dY @ W2ᵀ", 1024, 512, 128, False, True),
    ("MLP up", 1024, 128, 512, False, False),
    ("dH = dY @ W1ᵀ", 1024, 128, 512, False, True),
    ("dW2 = hᵀ @ dY", 512, 1024, 128, True, False),
    ("dW1 = xᵀ @ dH", 128, 1024, 512, True, False),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", type=int, nargs="*", default=[128, 256, 512, 1024, 2048])
    ap.add_argument("--repeat", type=int, default=10, help="timed calls in a row; best is kept")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the two sides")
    ap.add_argument("--dtype", default="f32", choices=["f32", "f64"])
    ap.add_argument("--calls", action="store_true",
                    help="only where a call's time goes (the kernel alone and each route)")
    args = ap.parse_args()
    # OpenBLAS reads its thread count once, when NumPy is first imported.
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import numpy as np
    from backend.contract import Matmul

    rng = np.random.default_rng(0)
    if args.calls:
        calls(args, rng)
        return
    kernel = Matmul(args.dtype)
    load = os.getloadavg()[0]
    print(f"tiles {kernel.tiles}, {args.threads} threads, best of {args.rounds}×{args.repeat}; "
          f"load average {load:.1f} on {os.cpu_count()} CPUs")
    if load > 0.5:
        print("warning: other processes are running; wall-clock rates will scatter")
    print(f"{'n':>6} {'numpy GFLOP/s':>14} {'dslc GFLOP/s':>13} {'ratio':>6}")
    dtype = np.float32 if args.dtype == "f32" else np.float64
    large = None                                   # dslc's rate at the largest size
    for n in sorted(args.sizes):
        a, b = (rng.standard_normal((n, n)).astype(dtype) for _ in range(2))
        runs = {"numpy": lambda: a @ b, "dslc": lambda: kernel(a, b, threads=args.threads)}
        best = interleaved(runs, args.rounds * args.repeat, args.rounds)
        gflops = {name: 2 * n ** 3 / t / 1e9 for name, t in best.items()}
        print(f"{n:>6} {gflops['numpy']:>14.1f} {gflops['dslc']:>13.1f} "
              f"{gflops['dslc'] / gflops['numpy']:>6.2f}")
        large = gflops["dslc"]
    gpt_products(kernel, args, rng)
    small_products(args, rng, large)
    calls(args, rng)


def gpt_products(kernel, args, rng) -> None:
    """The GPT step's products, dslc against torch.matmul on the same threads."""
    import numpy as np
    try:
        import torch
    except ImportError:
        print("torch is not installed: no GPT products")
        return
    torch.set_num_threads(args.threads)
    print(f"\nGPT training-step products, {args.threads} threads (us, best of "
          f"{args.rounds}x{args.repeat}; ratio dslc / torch)")
    print(f"{'product':>22} {'A':>12} {'B':>12} {'dslc':>8} {'torch':>8} {'ratio':>6}")
    dtype = np.float32 if args.dtype == "f32" else np.float64
    for name, a_shape, b_shape, transposed in GPT_SHAPES:
        a = rng.standard_normal(a_shape).astype(dtype)
        b = rng.standard_normal(b_shape[:-2] + b_shape[:-3:-1]).astype(dtype).swapaxes(-1, -2) \
            if transposed else rng.standard_normal(b_shape).astype(dtype)
        out = np.empty(np.broadcast_shapes(a_shape[:-2], b_shape[:-2]) + (a_shape[-2], b_shape[-1]),
                       dtype)
        ta, tb = torch.from_numpy(a), torch.from_numpy(np.ascontiguousarray(b.swapaxes(-1, -2))
                                                       ).swapaxes(-1, -2) if transposed \
            else torch.from_numpy(b)
        runs = {"dslc": lambda: kernel(a, b, threads=args.threads, out=out),
                "torch": lambda: torch.matmul(ta, tb)}
        best = interleaved(runs, args.rounds * args.repeat, args.rounds)
        print(f"{name:>22} {'x'.join(map(str, a_shape)):>12} "
              f"{'x'.join(map(str, b_shape)) + ('ᵀ' if transposed else ''):>12} "
              f"{best['dslc'] * 1e6:>8.1f} {best['torch'] * 1e6:>8.1f} "
              f"{best['dslc'] / best['torch']:>6.2f}")


def iree_product(a, b, dtype: str):
    """A call of a @ b (of dslc's dtype) compiled by IREE as device="iree" compiles a
    program's `@` (runtime/iree.py), or None without IREE. IREE reads contiguous operands: a
    transposed view is copied on each call."""
    from ir.core import Builder, tensor_type
    from runtime import iree
    if not iree.usable():
        return None
    f = Builder("matmul")
    x, y = (f.param(tensor_type(dtype, v.shape)) for v in (a, b))
    run = iree.Executable(f.finish([f.emit("matmul", x, y)]), "matmul").run
    return lambda: run([a, b])


def small_products(args, rng, large: float | None) -> None:
    """SMALL_SHAPES by runtime.cpu.matmul beside NumPy, torch.matmul and IREE (where
    installed)."""
    import numpy as np
    from runtime.cpu import matmul
    try:
        import torch
        torch.set_num_threads(args.threads)
    except ImportError:
        torch = None
    dtype = np.float32 if args.dtype == "f32" else np.float64
    print(f"\nsmall and skinny products, {args.threads} threads (us, best of "
          f"{args.rounds}x{args.repeat}; ratios dslc / numpy and dslc / torch; dslc's GFLOP/s "
          f"as a share of its rate at n = {max(args.sizes, default='-')}; IREE on its own threads)")
    print(f"{'product':>18} {'M x K x N':>15} {'dslc':>8} {'numpy':>8} {'torch':>8} {'iree':>8} "
          f"{'/numpy':>7} {'/torch':>7} {'/iree':>7} {'share':>6}")
    for name, m, k, n, a_t, b_t in SMALL_SHAPES:
        a = rng.standard_normal((k, m)).astype(dtype).T if a_t else \
            rng.standard_normal((m, k)).astype(dtype)
        b = rng.standard_normal((n, k)).astype(dtype).T if b_t else \
            rng.standard_normal((k, n)).astype(dtype)
        out = np.empty((m, n), dtype)
        runs = {"dslc": lambda: matmul(a, b, out, args.threads), "numpy": lambda: a @ b}
        if torch is not None:
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            runs["torch"] = lambda: torch.matmul(ta, tb)
        if (iree := iree_product(a, b, args.dtype)) is not None:
            runs["iree"] = iree
        best = interleaved(runs, args.rounds * args.repeat, args.rounds)
        us = {side: t * 1e6 for side, t in best.items()}
        share = f"{2 * m * k * n / best['dslc'] / 1e9 / large:>6.2f}" if large else f"{'-':>6}"
        peer = {side: (f"{us[side]:>8.1f}", f"{us['dslc'] / us[side]:>7.2f}") if side in us
                else (f"{'-':>8}", f"{'-':>7}") for side in ("torch", "iree")}
        print(f"{name:>18} {f'{m}x{k}x{n}':>15} {us['dslc']:>8.1f} {us['numpy']:>8.1f} "
              f"{peer['torch'][0]} {peer['iree'][0]} {us['dslc'] / us['numpy']:>7.2f} "
              f"{peer['torch'][1]} {peer['iree'][1]} {share}")


CALL_SHAPES = [(4, 4, 4), (64, 64, 64), (1, 768, 2304)]


def native_loop():
    """loop(task, arguments, next_job, n): the kernel's task run n times on one thread, its job
    counter reset before each, as a ctypes function (no Python between the calls)."""
    import ctypes
    from llvmlite import ir
    from backend import cpu
    i8p, i64 = ir.IntType(8).as_pointer(), ir.IntType(64)
    task = ir.FunctionType(ir.VoidType(), [i8p, i64, i64]).as_pointer()
    module = ir.Module(name="matmul_loop")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [task, i8p, i64.as_pointer(), i64]),
                     "loop")
    run, arguments, next_job, n = fn.args
    entry, body, done = (fn.append_basic_block(name) for name in ("entry", "body", "done"))
    b = ir.IRBuilder(entry)
    b.branch(body)
    b.position_at_end(body)
    i = b.phi(i64)
    b.store(ir.Constant(i64, 0), next_job)
    b.call(run, [arguments, ir.Constant(i64, 0), ir.Constant(i64, 1)])
    step = b.add(i, ir.Constant(i64, 1))
    i.add_incoming(ir.Constant(i64, 0), entry)
    i.add_incoming(step, body)
    b.cbranch(b.icmp_signed("<", step, n), body, done)
    b.position_at_end(done)
    b.ret_void()
    engine = cpu.jit(("matmul_loop",), lambda: module)
    call = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                            ctypes.c_int64)(engine.get_function_address("loop"))
    return engine, call


def calls(args, rng) -> None:
    """Where a call's time goes, on one thread: CALL_SHAPES by the kernel alone and by each
    route from Python (us a call, best of --rounds × --repeat batches of n calls)."""
    import numpy as np
    from backend.contract import ARGUMENTS, Matmul, _Block
    from runtime.cpu import matmul
    dtype = np.float32 if args.dtype == "f32" else np.float64
    kernel = Matmul(args.dtype)
    engine, loop = native_loop()
    print(f"\nwhere a call's time goes, 1 thread (us a call; NumPy on {args.threads} threads)")
    print(f"{'M x K x N':>15} {'kernel':>8} {'direct':>8} {'runtime':>8} {'checked':>8} "
          f"{'numpy':>8}")
    for m, k, n in CALL_SHAPES:
        a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
        out = np.empty((m, n), dtype)
        count = max(1, 2_000_000 // (m * k * n + 50_000))
        block = _Block(args.dtype, kernel.tiles, 1)      # the task's arguments for one thread
        block.words[:ARGUMENTS - 4] = kernel.arguments(a[None], b[None], out[None])

        def batch(call):
            return lambda: [call() for _ in range(count)]
        runs = {"kernel": lambda: loop(kernel.task, block.address, block.address + 8 * ARGUMENTS,
                                       count),
                "direct": batch(lambda: kernel.direct(a, b, out, 1)),
                "runtime": batch(lambda: matmul(a, b, out, 1)),
                "checked": batch(lambda: kernel(a, b, threads=1, out=out)),
                "numpy": batch(lambda: np.matmul(a, b, out=out))}
        best = interleaved(runs, args.rounds * args.repeat, args.rounds)
        us = {side: t / count * 1e6 for side, t in best.items()}
        print(f"{f'{m}x{k}x{n}':>15}" + "".join(f" {us[side]:>8.2f}" for side in runs))


if __name__ == "__main__":
    main()
