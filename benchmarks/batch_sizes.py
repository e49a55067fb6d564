"""A new batch size of an already compiled program: the first call of the GPT loss at batch 3
after one at batch 16, and of BERT's inference at batch 3 after one at batch 8, each beside
the program's first call (its cold compile), into an empty compile cache; with the pieces of
object code each call compiled. Issue 15's target: a new batch size < 0.1 s.

    python benchmarks/batch_sizes.py [--profile]"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import train_step as ts

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
GPT_LOSS = """
from gpt import GPT, loss

def gpt_loss(p: GPT, idx: i32[B, T], targets: i32[B, T], H: int) -> f32:
  return loss(p, idx, targets, H)
"""


class Compiles:
    """Counts the pieces of object code compiled (backend/objects.py) and the modules JIT-
    compiled whole (backend/cpu.py's jit: native steps, products, scatters) while it is on."""

    def __enter__(self) -> Compiles:
        from backend import cpu, objects
        self.pieces = self.modules = 0
        self._saved = objects.compile_all, cpu.optimise
        compile_all, optimise = self._saved

        def counted_pieces(pieces):
            self.pieces += len(pieces)
            return compile_all(pieces)

        def counted_modules(mod, opt=3, machine=None):
            self.modules += machine is None       # objects.object_code passes its machine
            return optimise(mod, opt, machine)

        objects.compile_all, cpu.optimise = counted_pieces, counted_modules
        return self

    def __exit__(self, *exc) -> None:
        from backend import cpu, objects
        objects.compile_all, cpu.optimise = self._saved


def timed(call) -> tuple[float, Compiles]:
    with Compiles() as counts:
        start = time.perf_counter()
        call()
        return time.perf_counter() - start, counts


def gpt_cases():
    import dsl
    p, idx, tgt = ts.gpt_inputs()
    prog = dsl.loads(GPT_LOSS, name=str(ts.MODELS / "gpt_loss.bend"), device="cpu")
    yield "GPT loss, B 16", lambda: prog.gpt_loss(p, idx, tgt, 4)
    yield "GPT loss, B 3", lambda: prog.gpt_loss(p, idx[:3], tgt[:3], 4)


def bert_cases():
    import dsl
    sys.path.insert(0, str(EXAMPLES))
    from bert import DIMS
    prog = dsl.load(str(EXAMPLES / "bert.bend"), device="cpu")
    x = np.random.default_rng(0).integers(0, DIMS["V"] - 1, (8, DIMS["T"])).astype(np.int32)
    params = prog.init(dsl.key(0), **{k: DIMS[k] for k in ("V", "D", "L", "H", "G", "T")})
    yield "BERT inference, B 8", lambda: prog.scores(params, x)
    yield "BERT inference, B 3", lambda: prog.scores(params, x[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", action="store_true", help="profile each new batch size's call")
    ap.add_argument("--cases", nargs="*", choices=["gpt", "bert"], default=["gpt", "bert"])
    args = ap.parse_args()
    os.environ["DSLC_CACHE_DIR"] = tempfile.mkdtemp(prefix="dslc-sizes-")
    for name in args.cases:
        first = None
        for label, call in {"gpt": gpt_cases, "bert": bert_cases}[name]():
            if first is not None and args.profile:
                profile = cProfile.Profile()
                profile.enable()
            seconds, counts = timed(call)
            if first is not None and args.profile:
                profile.disable()
                pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
            ratio = "" if first is None else f"  ({seconds / first:.3f}x the first call)"
            print(f"{label:24s} {seconds:7.3f} s  {counts.pieces:4d} pieces, "
                  f"{counts.modules:3d} modules compiled{ratio}")
            first = first or seconds


if __name__ == "__main__":
    main()
