"""The 4-layer GPT AdamW step (benchmarks/train_step.py) against this machine's floor: the
multiply-adds of its products, counted from dslc's plan of the step, at the peak rate of the
cores' FMA units, measured here by a loop of independent vector FMAs that the thread team
runs as it runs dslc's kernels. Prints that peak, the step's products and their time at the
peak (the least time any implementation of the step needs, whatever else it does), dslc's
and PyTorch eager's times for the step (best of --repeat, the two taking turns), and the
least ratio to PyTorch that the floor leaves: issue 15 asks for 0.6."""
from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir

import train_step as ts
from timing import interleaved

CHAINS = 12                # independent accumulators: FMA latency × ports, with room to spare
CHUNK = 100_000            # loop trips a thread claims at once (about 0.1 ms)
CHUNKS = 400               # chunks of a measurement: 0.2 s on 2 cores at 100 GFLOP/s each
TOTAL, NEXT, SINK, RAN = range(4)      # peak's words: RAN + t counts thread t's chunks


def fma_task(width: int) -> ir.Module:
    """`peak(i64 *words, i64 thread, i64 threads)`, a task of the thread team
    (backend/team.py): chunks of CHUNK trips of CHAINS vector FMAs of `width` float lanes,
    claimed from words[NEXT] until words[TOTAL] are taken, as dslc's kernels claim their jobs;
    each thread counts its chunks in words[RAN + thread] and leaves its sum in words[SINK] (so
    the loop is not dead code)."""
    f32, i64 = ir.FloatType(), ir.IntType(64)
    vec = ir.VectorType(f32, width)
    module = ir.Module(name="roofline")
    module.triple = llvm.get_process_triple()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i64, i64]),
                     name="peak")
    fma = ir.Function(module, ir.FunctionType(vec, [vec] * 3), name=f"llvm.fma.v{width}f32")
    words_arg, thread, _ = fn.args
    word = lambda i: b.gep(words, [i if isinstance(i, ir.Value) else ir.Constant(i64, i)])
    blocks = [fn.append_basic_block(n) for n in ("entry", "claim", "chunk", "trip", "done")]
    entry, claim, chunk, trip, done = blocks
    b = ir.IRBuilder(entry)
    words = b.bitcast(words_arg, i64.as_pointer())
    total, mine = b.load(word(TOTAL)), word(b.add(thread, ir.Constant(i64, RAN)))
    b.branch(claim)

    b.position_at_end(claim)       # the accumulators run on across a thread's chunks
    accs = [b.phi(vec) for _ in range(CHAINS)]
    claimed = b.atomic_rmw("add", word(NEXT), ir.Constant(i64, 1), "monotonic")
    b.cbranch(b.icmp_signed("<", claimed, total), chunk, done)

    b.position_at_end(chunk)
    b.store(b.add(b.load(mine), ir.Constant(i64, 1)), mine)
    b.branch(trip)

    b.position_at_end(trip)
    i = b.phi(i64)
    running = [b.phi(vec) for _ in range(CHAINS)]
    scale, step = (ir.Constant(vec, [v] * width) for v in (0.999999, 1e-7))
    nexts = [b.call(fma, [acc, scale, step]) for acc in running]
    i_next = b.add(i, ir.Constant(i64, 1))
    b.cbranch(b.icmp_signed("<", i_next, ir.Constant(i64, CHUNK)), trip, claim)

    i.add_incoming(ir.Constant(i64, 0), chunk)
    i.add_incoming(i_next, trip)
    for k, (acc, run, nxt) in enumerate(zip(accs, running, nexts)):
        acc.add_incoming(ir.Constant(vec, [1.0 + k * 1e-3] * width), entry)
        acc.add_incoming(nxt, trip)
        run.add_incoming(acc, chunk)
        run.add_incoming(nxt, trip)

    b.position_at_end(done)
    total_sum = accs[0]
    for acc in accs[1:]:
        total_sum = b.fadd(total_sum, acc)
    lane = b.extract_element(total_sum, ir.Constant(ir.IntType(32), 0))
    b.store(b.fptosi(b.fmul(lane, ir.Constant(f32, 1e6)), i64), word(SINK))
    b.ret_void()
    return module


def fma_peak(threads: int, chunks: int = CHUNKS, repeat: int = 3) -> tuple[float, list[int]]:
    """FLOP/s of `threads` threads running only FMAs (an FMA counts 2), best of `repeat`, and
    the chunks each thread ran in the last."""
    from backend import cpu
    from backend.contract import host_tiles
    from backend.team import team
    width = host_tiles("f32").width
    engine = cpu.jit(("roofline", "fma", str(width), str(CHAINS), str(CHUNK)),
                     lambda: fma_task(width))
    task = engine.get_function_address("peak")
    words = np.zeros(RAN + threads, np.int64)
    seconds = []
    for _ in range(repeat):
        words[:] = 0
        words[TOTAL] = chunks
        start = time.perf_counter()
        team().run(task, words.ctypes.data, threads)
        seconds.append(time.perf_counter() - start)
    return chunks * CHUNK * CHAINS * width * 2 / min(seconds), list(words[RAN:])


def product_flops(prog, name: str, *args) -> tuple[int, int]:
    """(products, FLOPs) of the products in dslc's CPU plan of prog's entry point `name` for
    args (a product of [.., M, K] by [.., K, N] counts 2·K for each of its outputs)."""
    from backend.schedule import ContractStep
    from ir.ops.base import Role
    from runtime.cpu import _ops, plan
    fn = getattr(prog, name).lower(*args).function
    if any(o.primitive.role is Role.CONTRACTION
           for op in fn.ops if op.body is not None for o in _ops(op.body)):
        raise ValueError("a product inside a loop's body: its trips are not counted here")
    steps = [s for s in plan(fn, name).plan.steps if isinstance(s, ContractStep)]
    flops = sum(2 * math.prod(s.op.outputs[0].shape) * s.op.inputs[0].shape[-1] for s in steps)
    return len(steps), flops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("DSLC_THREADS", str(args.threads))
    import dsl
    p, idx, tgt = ts.gpt_inputs()
    s = ts.state_like(p)
    prog = dsl.loads(ts.GPT_STEP, name=str(ts.MODELS / "gpt_step.bend"), device="cpu")
    calls = {"dslc": lambda: prog.step(p, s, idx, tgt, 4)}
    try:
        import torch
        torch.set_num_threads(args.threads)
        calls["torch"] = ts.torch_gpt(p, idx, tgt)
    except ImportError:
        pass
    times = interleaved(calls, args.repeat)
    count, flops = product_flops(prog, "step", p, s, idx, tgt, 4)
    peak = {n: fma_peak(n)[0] for n in sorted({1, args.threads})}
    floor, dslc = flops / peak[args.threads], times["dslc"]
    print("FMA peak: " + ", ".join(f"{r / 1e9:.1f} GFLOP/s on {n} thread{'s' * (n > 1)}"
                                    for n, r in peak.items())
          + f"; load average {os.getloadavg()[0]:.1f}")
    print(f"GPT step: {count} products, {flops / 1e9:.2f} GFLOP: {floor * 1e3:.1f} ms at the peak "
          f"of {args.threads} threads")
    print(f"dslc: {dslc * 1e3:.1f} ms ({flops / dslc / 1e9:.0f} GFLOP/s in its products, "
          f"{flops / dslc / peak[args.threads]:.0%} of the peak over the whole step)")
    if "torch" in times:
        print(f"PyTorch eager: {times['torch'] * 1e3:.1f} ms; dslc / PyTorch "
              f"{dslc / times['torch']:.2f}; the floor / PyTorch {floor / times['torch']:.2f} "
              f"(no step can be faster)")

if __name__ == "__main__":
    main()
