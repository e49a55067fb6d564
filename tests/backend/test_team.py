"""The host's thread team (backend/team.py): helpers join a task while it is open and the
caller waits for every helper that joined, and for no other; a helper that comes late never
starts a task that is over; a second caller runs its task alone."""
from __future__ import annotations

import ctypes
import threading
import time

import pytest

from backend.team import ASLEEP, AWAKE, CLOSED, ENTRY, LEFT, LINE, STATE, Task, team


class Recorder:
    """A task (a Python callback) that notes which threads started and finished it; helpers
    take `helper_seconds` over their share."""

    def __init__(self, helper_seconds: float = 0.0):
        self.started: list[int] = []
        self.finished: list[int] = []
        self.helper_seconds = helper_seconds
        self.task = Task(self._call)
        self.address = ctypes.cast(self.task, ctypes.c_void_p).value

    def _call(self, argument, thread, threads) -> None:
        self.started.append(thread)
        if thread:
            time.sleep(self.helper_seconds)
        self.finished.append(thread)


def test_the_caller_returns_after_every_helper_that_joined_has_left():
    t = team()
    for _ in range(20):
        r = Recorder(helper_seconds=0.005)
        t.run(r.address, 0, 3)
        assert 0 in r.finished and sorted(r.started) == sorted(r.finished)
        assert len(set(r.started)) == len(r.started)            # each thread at most once
        entry = int(t.box[ENTRY])
        assert entry & CLOSED and entry % CLOSED == t.box[LEFT] == len(r.started) - 1


def test_the_caller_does_not_wait_for_a_helper_that_never_runs():
    t = team()
    t.run(Recorder().address, 0, 2)               # helper 1 exists; now it is held up:
    time.sleep(0.01)                             # (asleep, its serve returned)
    assert t.box[STATE + LINE] == ASLEEP
    t.box[STATE + LINE] = AWAKE                  # taken for awake, it is not woken
    try:
        r = Recorder()
        started = time.perf_counter()
        t.run(r.address, 0, 2)
        assert r.started == r.finished == [0] and time.perf_counter() - started < 0.005
    finally:
        t.box[STATE + LINE] = ASLEEP


def test_a_late_helper_never_starts_a_task_that_is_over():
    t = team()
    r = Recorder()
    t.run(r.address, 0, 2)
    time.sleep(0.01)                             # the helper is asleep: its serve returned
    before = list(r.started)
    t.box[STATE + LINE] = AWAKE
    t._serve(t._address, 1)                      # a serve that starts only now, on this thread,
    assert r.started == before                   # sees the closed task, spins, sleeps, returns
    assert t.box[STATE + LINE] == ASLEEP


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
