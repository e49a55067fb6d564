"""Best-of wall-clock timing of several sides of one case in one run, the sides taking turns."""
from __future__ import annotations

import time
from typing import Callable


def interleaved(calls: dict[str, Callable[[], object]], repeat: int, rounds: int = 4,
                clock: Callable[[], float] = time.perf_counter, pause: float = 0.3,
                warm: float = 0.02) -> dict[str, float]:
    """Each call's best of about `repeat` timed calls, made back to back as a training loop
    makes them, in `rounds` turns of each call, so that a burst of other work on the machine
    falls on all of them alike. Before its turn a call waits `pause` seconds (after a call,
    OpenBLAS's, OpenMP's and Eigen's threads spin for a while on the cores the next call
    would use) and runs untimed for `warm` seconds, at least once (its code, pages and
    threads warm, and the cores' clocks up again after the pause: a 0.17 ms step timed after
    one untimed call took 0.19-0.26 ms)."""
    times: dict[str, float] = dict.fromkeys(calls, float("inf"))
    rounds = max(1, min(rounds, repeat))
    for _ in range(rounds):
        for side, fn in calls.items():
            if len(calls) > 1:
                time.sleep(pause)
            start = time.perf_counter()
            fn()
            while time.perf_counter() - start < warm:
                fn()
            for _ in range(-(-repeat // rounds)):
                start = clock()
                fn()
                times[side] = min(times[side], clock() - start)
    return times
