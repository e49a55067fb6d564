"""The host's thread team (backend/team.py): helpers join a task while it is open and the
caller waits for every helper that joined, and for no other; a helper that comes late never
starts a task that is over; helpers sleep between bursts of work and wake for the next task;
a second caller runs its task alone; at exit the helpers are let go."""
from __future__ import annotations

import ctypes
import threading
import time

import numpy as np
import pytest

from backend.team import BOX, CLOSED, ENTRY, LEFT, SLEEPERS, Task, Team, team


class Recorder:
    """A task (a Python callback) that notes which threads started and finished it; the
    caller's share takes `caller_seconds` (asleep: the helpers' callbacks can run meanwhile),
    each helper's `helper_seconds`."""

    def __init__(self, caller_seconds: float = 0.0, helper_seconds: float = 0.0):
        self.started: list[int] = []
        self.finished: list[int] = []
        self.seconds = (caller_seconds, helper_seconds)
        self.task = Task(self._call)
        self.address = ctypes.cast(self.task, ctypes.c_void_p).value

    def _call(self, argument, thread, threads) -> None:
        self.started.append(thread)
        time.sleep(self.seconds[min(thread, 1)])
        self.finished.append(thread)


def joined(box: np.ndarray) -> int:
    return int(box[ENTRY]) % CLOSED


def test_the_caller_returns_after_every_helper_that_joined_has_left():
    t = team()
    for _ in range(20):
        r = Recorder(caller_seconds=0.001, helper_seconds=0.005)
        t.run(r.address, 0, 3)
        assert 0 in r.finished and sorted(r.started) == sorted(r.finished)
        assert len(set(r.started)) == len(r.started)            # each thread at most once
        assert int(t.box[ENTRY]) & CLOSED and joined(t.box) == t.box[LEFT] == len(r.started) - 1


def test_helpers_sleep_between_bursts_and_wake_for_the_next_task():
    t = team()
    t.run(Recorder().address, 0, 3)
    time.sleep(0.05)                              # far past the spin: every helper asleep
    assert t.box[SLEEPERS] == len(t.helpers) >= 2
    r = Recorder(caller_seconds=0.05)
    t.run(r.address, 0, 3)
    assert sorted(r.started) == [0, 1, 2]         # woken, they joined while the caller slept


def test_the_caller_does_not_wait_for_a_helper_that_never_runs():
    box = np.zeros(BOX, dtype=np.int64)           # a box no helper serves
    r = Recorder()
    started = time.perf_counter()
    team()._run(box.ctypes.data, r.address, 0, 4)
    assert r.started == r.finished == [0] and time.perf_counter() - started < 0.05


def test_a_late_helper_never_starts_a_task_that_is_over():
    t, box = team(), np.zeros(BOX, dtype=np.int64)
    r = Recorder()
    t._run(box.ctypes.data, r.address, 0, 2)      # posted and closed with no helper there
    late = threading.Thread(target=t._serve, args=(box.ctypes.data, 1))
    late.start()                                  # a helper that only starts now
    time.sleep(0.02)
    t._stop(box.ctypes.data)
    late.join(timeout=5)
    assert not late.is_alive() and r.started == [0]


@pytest.mark.parametrize("threads", [2, 3])
def test_two_callers_at_once_each_get_their_whole_task_done(threads):
    t = team()
    recorders = [Recorder(helper_seconds=0.002) for _ in range(8)]
    callers = [threading.Thread(target=t.run, args=(r.address, 0, threads)) for r in recorders]
    for c in callers:
        c.start()
    for c in callers:
        c.join()
    for r in recorders:
        assert 0 in r.finished and sorted(r.started) == sorted(r.finished)


def test_stop_lets_every_helper_go():
    t = Team()
    t.run(Recorder().address, 0, 4)
    helpers = list(t.helpers)
    assert len(helpers) == 3 and all(h.is_alive() for h in helpers)
    t.stop()
    assert not any(h.is_alive() for h in helpers)
