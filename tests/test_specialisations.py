"""A program keeps a bounded number of specialisations per entry point (DSLC_SPECIALISATIONS,
default 8), the most recently used; an evicted one is built again, with the same bits."""
from __future__ import annotations

import gc
import threading
import tracemalloc

import numpy as np
import pytest

import dsl
from conftest import raises, slow
from runtime.cpu import Executable

SOURCE = "def loss(w: f32[D, D], x: f32[B, D]) -> f32:\n  h = tanh(x @ w)\n  return sum(h * h)\n"
D = 128
W = np.linspace(-0.05, 0.05, D * D, dtype=np.float32).reshape(D, D)


def x_of(batch: int) -> np.ndarray:
    return np.linspace(-1, 1, batch * D, dtype=np.float32).reshape(batch, D)


def signature(batch: int) -> str:
    return f"w: f32[{D}, {D}]; x: f32[{batch}, {D}]"


def live_executables() -> int:
    gc.collect()
    return sum(isinstance(o, Executable) for o in gc.get_objects())


@slow                                   # (30 s)
def test_fifty_batch_sizes_hold_eight_specialisations_and_their_memory(monkeypatch):
    """The default bound: after 50 sizes the program holds the last 8, their executables and
    about the memory it held after the first 8 (each arena is some 0.5 MB: kept, the 50 would
    hold six times that)."""
    monkeypatch.delenv("DSLC_SPECIALISATIONS", raising=False)
    prog = dsl.loads(SOURCE, device="cpu")
    sizes = range(1000, 1050)
    before = live_executables()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for k, batch in enumerate(sizes):
            prog.loss(W, x_of(batch))
            if k == 7:
                gc.collect()
                after_eight = tracemalloc.get_traced_memory()[0] - start
        gc.collect()
        after_fifty = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert prog.specialisations("loss") == [signature(b) for b in sizes[-8:]]
    assert live_executables() - before == 8
    assert after_eight > 8 * 4 * D * 1000               # the eight arenas are in the count
    assert after_fifty < 1.5 * after_eight


def test_the_most_recently_used_survive(monkeypatch):
    monkeypatch.setenv("DSLC_SPECIALISATIONS", "3")
    prog = dsl.loads(SOURCE, device="reference")
    for batch in (1, 2, 3, 1, 4):                      # 1 is used again before 4 comes
        prog.loss(W, x_of(batch))
    assert prog.specialisations("loss") == [signature(3), signature(1), signature(4)]
    prog.loss(W, x_of(3))
    assert prog.specialisations("loss") == [signature(1), signature(4), signature(3)]


def test_an_evicted_specialisation_is_rebuilt_with_the_same_bits(monkeypatch):
    """Values and gradients of a size evicted and built again equal the first ones bit for bit."""
    monkeypatch.setenv("DSLC_SPECIALISATIONS", "2")
    prog = dsl.loads(SOURCE, device="cpu")
    step = prog.value_and_grad("loss", wrt="w")
    first_value, first_grad = step(W, x_of(5))
    for batch in (6, 7):
        step(W, x_of(batch))
    assert signature(5) not in prog.specialisations("loss")
    value, grad = step(W, x_of(5))
    assert value.tobytes() == first_value.tobytes()
    assert grad.tobytes() == first_grad.tobytes()
    assert prog.specialisations("loss") == [signature(7), signature(5)]


def test_the_fast_path_holds_no_evicted_specialisation(monkeypatch):
    """A call of a known signature skips lowering (dsl/fastcall.py) but keeps nothing alive:
    an evicted size is built again at its next call, and only the bound's executables live."""
    monkeypatch.setenv("DSLC_SPECIALISATIONS", "2")
    prog = dsl.loads(SOURCE, device="cpu")
    before = live_executables()
    first = {b: prog.loss(W, x_of(b)).tobytes() for b in (3, 4, 5)}
    assert live_executables() - before == 2
    assert prog.loss(W, x_of(3)).tobytes() == first[3]
    assert prog.loss(W, x_of(5)).tobytes() == first[5]             # held: the fast path
    assert prog.specialisations("loss") == [signature(3), signature(5)]
    assert live_executables() - before == 2


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threads_calling_many_sizes_get_the_bits_of_one_thread(monkeypatch, threads):
    """Threads that call one program at once, each its own order of sizes, evicting each
    other's specialisations (a bound of 2 for 6 sizes), get what a lone caller gets."""
    monkeypatch.setenv("DSLC_SPECIALISATIONS", "2")
    monkeypatch.setenv("DSLC_THREADS", str(threads))
    sizes = [3, 4, 5, 6, 7, 8]
    alone = dsl.loads(SOURCE, device="cpu")
    want = {b: alone.loss(W, x_of(b)).tobytes() for b in sizes}
    shared = dsl.loads(SOURCE, device="cpu")
    got: list[tuple[int, bytes]] = []

    def caller(k: int) -> None:
        for batch in sizes[k:] + sizes[:k]:
            got.append((batch, shared.loss(W, x_of(batch)).tobytes()))
    team = [threading.Thread(target=caller, args=(k,)) for k in range(threads)]
    for t in team:
        t.start()
    for t in team:
        t.join()
    assert len(got) == threads * len(sizes)
    assert all(out == want[batch] for batch, out in got)
    assert len(shared.specialisations("loss")) == 2


@pytest.mark.parametrize("value", ["0", "eight", "-1", "٣"])
def test_a_bad_bound_is_a_dsl_error(monkeypatch, value):
    monkeypatch.setenv("DSLC_SPECIALISATIONS", value)
    raises(lambda: dsl.loads(SOURCE, device="reference"),
           f"DSLC_SPECIALISATIONS: expected a whole number of at least 1, got {value!r}")


def test_an_entry_not_called_holds_none():
    prog = dsl.loads(SOURCE, device="reference")
    assert prog.specialisations("loss") == []
    raises(lambda: prog.specialisations("lost"), "defines no function 'lost'")
