"""Lower a 12-layer GPT (benchmarks/models/gpt.bend) to IR and differentiate it; prints the
time (target: under 2 s) and the op counts of the loss and of its optimised gradient."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import dsl
from dsl.inputs import example_inputs
from ir.ad import grad_function
from ir.passes import optimize

MODEL = Path(__file__).parent / "models" / "gpt.bend"


def ops(fn) -> int:
    return sum(1 + (ops(op.body) if op.body else 0) for op in fn.ops)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    dims = {"B": 4, "T": 64, "D": 128, "V": 65, "H": 4, "p.blocks": args.layers}
    best = float("inf")
    for _ in range(args.repeat):
        prog = dsl.load(str(MODEL))           # a fresh program: nothing cached
        inputs = example_inputs(prog._def("loss"), prog._resolved.main, dims)
        start = time.perf_counter()
        low, _ = prog.lower("loss", (), inputs)
        wrt = low.arg_leaves[0]
        grad = optimize(grad_function(low.function, wrt))
        best = min(best, time.perf_counter() - start)
    primal = ops(low.function)
    print(f"{args.layers}-layer GPT: loss {primal} ops, gradient {ops(grad)} ops "
          f"({ops(grad) / primal:.2f}x the primal)")
    print(f"lower + differentiate + optimise: {best:.3f} s (best of {args.repeat}; target < 2 s)")


if __name__ == "__main__":
    main()
