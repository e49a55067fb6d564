"""A training run's progress on a stream (stderr): a tqdm bar on a terminal; elsewhere (a log,
CI) plain lines, one every INTERVAL seconds, so that a long run never floods its log."""
from __future__ import annotations

import time
from collections import deque
from typing import Callable, TextIO

import numpy as np
from tqdm import tqdm

from dsl.values import shortest

INTERVAL = 30.0                                 # seconds between lines off a terminal
RECENT = 50                                     # the losses averaged in "loss …"
BAR = "{percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_noinv_fmt}{postfix}]"


class Progress:
    """Steps start+1 … total of a run; `log` writes a line above the bar (or between lines)."""

    def __init__(self, stream: TextIO | None, start: int, total: int,
                 clock: Callable[[], float] = time.monotonic, interval: float = INTERVAL):
        self.stream, self.start, self.total = stream, start, total
        self.clock, self.interval = clock, interval
        self.t0 = self.shown = clock()
        self.recent: deque[float] = deque(maxlen=RECENT)
        tty = stream is not None and hasattr(stream, "isatty") and stream.isatty()
        self.bar = tqdm(total=total, initial=start, file=stream, unit=" steps", bar_format=BAR,
                        dynamic_ncols=True) if tty and start < total else None

    def loss(self) -> str:
        """The mean of the recent losses, an f32 as the report prints it."""
        return shortest(sum(self.recent) / len(self.recent), np.float32)

    def rate(self, done: int, evaluating: float) -> float:
        """Steps per second of training since the start (the time spent evaluating left out,
        as in the final report)."""
        return (done - self.start) / max(self.clock() - self.t0 - evaluating, 1e-9)

    def update(self, done: int, loss: float, evaluation: str | None = None,
               evaluating: float = 0.0) -> None:
        """After `done` steps, the last with this loss (and an evaluation's line, if one ran;
        `evaluating` seconds have gone to evaluations so far)."""
        self.recent.append(loss)
        if self.stream is None:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(f"loss {self.loss()}", refresh=False)
            self.bar.update(1)
            if evaluation is not None:
                self.log(f"step {done}/{self.total} loss {self.loss()} {evaluation}")
            return
        now = self.clock()
        if evaluation is not None or done == self.total or now - self.shown >= self.interval:
            self.shown = now
            self.log(f"step {done}/{self.total} loss {self.loss()}"
                     f"{' ' + evaluation if evaluation else ''} {self.rate(done, evaluating):.1f} steps/s")

    def log(self, line: str) -> None:
        if self.stream is None:
            return
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
