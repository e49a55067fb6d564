"""Python's cycle collector, paused while a stage of the compiler runs: the stages make many
objects and few cycles worth collecting (the front end's, the backend's and the cache's
collections cost a sixth to a third of their time), and the objects a stage leaves alive join
the oldest generation, where the next collection of the youngest would otherwise walk every
one of them (8 ms after a new batch size of the GPT loss was built)."""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Callable, TypeVar

T = TypeVar("T")


@contextlib.contextmanager
def paused() -> Iterator[None]:
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            if gc.get_freeze_count() == 0:      # (a program that froze objects keeps them frozen)
                gc.freeze()                     # every tracked object to the permanent generation,
                gc.unfreeze()                   # and back into the oldest: two moves of a list
            gc.enable()


def without_gc(thunk: Callable[[], T]) -> Callable[[], T]:
    """thunk, to be run with the collector paused."""
    def run() -> T:
        with paused():
            return thunk()
    return run
