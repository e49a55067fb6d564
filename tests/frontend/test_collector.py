"""The cycle collector paused around a stage of the compiler (frontend/collector.py): running
again after it, its generations holding the stage's objects as the oldest, and a program's own
setting (paused, or objects frozen) left as it was."""
from __future__ import annotations

import gc

import pytest

from frontend import collector


@pytest.fixture
def collecting():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_the_objects_a_stage_leaves_alive_join_the_oldest_generation(collecting):
    with collector.paused():
        assert not gc.isenabled()
        made = [[i] for i in range(1000)]
    assert gc.isenabled()
    young = {id(x) for generation in (0, 1) for x in gc.get_objects(generation)}
    oldest = {id(x) for x in gc.get_objects(2)}
    assert not any(id(x) in young for x in made) and all(id(x) in oldest for x in made)


def test_a_stage_inside_a_stage_leaves_the_collector_to_the_outer_one(collecting):
    with collector.paused():
        with collector.paused():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_program_that_paused_the_collector_or_froze_objects_keeps_them_so(collecting):
    gc.disable()
    with collector.paused():
        pass
    assert not gc.isenabled()
    gc.enable()
    kept = [[]]
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with collector.paused():
            made = [[] for _ in range(10)]
        assert gc.get_freeze_count() == frozen and kept and made
    finally:
        gc.unfreeze()
