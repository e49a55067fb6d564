"""Data parallelism on this machine: the GPT example's training throughput on 1 rank with 1
thread and with 2, and on 2 ranks with 1 thread each (both with --micro-batches 2, so both train the
same bits), and each rank's time per step in the gradient exchange: all of it (waits for the
other rank included) and the bare transfer of the same bytes between two ranks that are ready.

    python benchmarks/data_parallel.py [--steps 8]

The first step (compilation) is left out of the throughput."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GPT = ROOT / "examples" / "gpt.bend"


def worker(steps: int, m: int) -> None:
    """Under mpiexec or alone: train, then rank 0 prints what it measured as JSON."""
    import dsl
    from dsl import distributed
    stamps: list[float] = []
    result = dsl.train(str(GPT), steps=steps, micro_batches=m, progress=None, final_eval=False,
                       device="cpu", on_step=lambda t, b, l: stamps.append(time.perf_counter()))
    team = distributed.world(600.0)
    out = {"steps_per_s": (len(stamps) - 1) / (stamps[-1] - stamps[0]),
           "loss": result.losses[-1], "weights": digest(result.params)}
    if isinstance(team, distributed.Mpi):
        out["exchange_s_per_step"] = team.seconds / steps
        out["bytes_per_step"] = team.bytes / steps
        out["transfer_s"] = transfer(team, team.bytes // steps)
    if team.rank == 0:
        print(json.dumps(out))


def digest(params) -> str:
    from dsl.values import flatten_python
    return hashlib.sha256(b"".join(a.tobytes() for a in flatten_python(params, "p").values())).hexdigest()


def transfer(team, nbytes: int, repeat: int = 20) -> float:
    """The best time of one gather of nbytes from each other rank, every rank ready at once."""
    mine = np.zeros(nbytes // max(1, team.size - 1), np.uint8)
    best = float("inf")
    for i in range(repeat):
        team.comm.Barrier()
        t0 = time.perf_counter()
        team.gather(mine, [len(mine)] * team.size, i)
        best = min(best, time.perf_counter() - t0)
    return best


def run(command: list[str], threads: int) -> dict:
    env = {**os.environ, "DSLC_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    r = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.steps, 2)
    me = [sys.executable, __file__, "--worker", "--steps", str(args.steps)]
    mpiexec = shutil.which("mpiexec", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    single = run(me, threads=1)
    one = run(me, threads=2)
    two = run([mpiexec, "-n", "2", *me], threads=1)
    assert one["weights"] == two["weights"] == single["weights"], "1 and 2 ranks trained different bits"
    print(f"GPT example, batch 32 as 2 micro-batches, {args.steps} steps (the first left out)")
    print(f"  1 rank,  1 thread:  {single['steps_per_s']:.3f} steps/s")
    print(f"  1 rank,  2 threads: {one['steps_per_s']:.3f} steps/s")
    print(f"  2 ranks, 1 thread:  {two['steps_per_s']:.3f} steps/s: "
          f"{two['steps_per_s'] / one['steps_per_s']:.2f}x 1 rank on both cores, scaling "
          f"efficiency {two['steps_per_s'] / (2 * single['steps_per_s']):.0%} (of twice 1 thread)")
    print(f"  exchange per step:  {two['exchange_s_per_step'] * 1e3:.1f} ms on rank 0, waits included; "
          f"{two['bytes_per_step'] / 2**20:.2f} MiB received; the bare transfer "
          f"{two['transfer_s'] * 1e3:.2f} ms")
    print(f"  the same bits on both: loss {one['loss']:.7g}")


if __name__ == "__main__":
    main()
