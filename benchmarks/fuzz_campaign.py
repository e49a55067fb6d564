"""A long run of tests/backend/test_random_programs.py's random programs, each in a child
process: one JSON line per program in --out, and the count of each outcome at the end.

    python benchmarks/fuzz_campaign.py --mode small --start 1000 --count 5000 --out small.jsonl
    python benchmarks/fuzz_campaign.py --show small 1234     # the program, its inputs, its outcome
    python benchmarks/fuzz_campaign.py --summary small.jsonl large.jsonl
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "backend")]

import test_random_programs as fuzz  # noqa: E402


def campaign(mode: str, start: int, count: int, jobs: int, out: Path) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    began = time.monotonic()
    with out.open("a") as f:
        keys = [(mode, s) for s in range(start, start + count)]
        for (m, seed), outcome, value in fuzz.run_all(keys, jobs):
            counts[outcome] += 1
            detail = value.get("detail")
            detail = detail if isinstance(detail, (str, type(None))) else "\n".join(detail)
            f.write(json.dumps({"mode": m, "seed": seed, "outcome": outcome,
                                "detail": (detail or "")[-3000:], "prims": value.get("prims"), "ulps": value.get("ulps"),
                                "seconds": round(time.monotonic() - began, 1)}) + "\n")
            f.flush()
    return counts


def summary(paths: list[Path]) -> None:
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    ulps: dict[str, float] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            row = json.loads(line)
            counts[row["mode"]][row["outcome"]] += 1
            for f, err in (row.get("ulps") or {}).items():
                ulps[f] = max(err, ulps.get(f, 0.0))
    for mode, c in counts.items():
        print(mode, sum(c.values()), dict(c))
    print("largest error of each math function compiled alone (ulps):", dict(sorted(ulps.items())))


def show(mode: str, seed: int) -> None:
    print(fuzz.reproducer((mode, seed)))
    for key, outcome, value in fuzz.run_all([(mode, seed)], 1):
        print(outcome, value.get("detail"))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["small", "large", "wide", "grad", "gpu"], default="small")
    ap.add_argument("--start", type=int, default=1000)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("fuzz.jsonl"))
    ap.add_argument("--show", nargs=2, metavar=("MODE", "SEED"))
    ap.add_argument("--summary", nargs="+", type=Path)
    a = ap.parse_args()
    if a.show:
        show(a.show[0], int(a.show[1]))
    elif a.summary:
        summary(a.summary)
    else:
        print(dict(campaign(a.mode, a.start, a.count, a.jobs, a.out)))
