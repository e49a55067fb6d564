"""Runs of kernels shared by several threads (backend/cpu.py): chunks claimed one at a time,
each point computed whole by one thread, so the bits are those of one thread whoever joins and
whenever, and the caller alone finishes a run no helper joins."""
from __future__ import annotations

import numpy as np
import pytest

from backend.cpu import LINE
from ir import interp
from ir.core import Builder, tensor_type
from runtime import cpu
from runtime.cpu import Executable, _RunLaunch

rng = np.random.default_rng(5)


def layer_norm_and_softmax(b, x, g):
    """Row reductions, a column reduction (reduced side by side, LANES points at a time) and
    the maps between them: one run."""
    mean = b.emit("mean", x, axis=1, keepdims=True)
    d = b.emit("sub", x, mean)
    var = b.emit("mean", b.emit("mul", d, d), axis=1, keepdims=True)
    y = b.emit("mul", b.emit("mul", d, b.emit("rsqrt", b.emit("add", var, b.constant(1e-5, "f32")))), g)
    e = b.emit("exp", b.emit("sub", y, b.emit("max", y, axis=1, keepdims=True)))
    p = b.emit("div", e, b.emit("sum", e, axis=1, keepdims=True))
    return [p, b.emit("sum", p, axis=0), b.emit("sum", y)]


def compiled(monkeypatch) -> tuple[Executable, list[np.ndarray], list[np.ndarray]]:
    """The program with every run shared from its first element and cut as fine as it goes,
    its arrays, and its results on one thread (one chunk a kernel)."""
    monkeypatch.setattr(cpu, "MIN_RUN_WORK", 0)
    monkeypatch.setattr(cpu, "MIN_CHUNK_WORK", 1)
    arrays = [rng.standard_normal((67, 45)).astype(np.float32),
              rng.standard_normal(45).astype(np.float32)]
    b = Builder()
    params = [b.param(tensor_type("f32", a.shape)) for a in arrays]
    fn = b.finish(layer_norm_and_softmax(b, *params))
    exe = Executable(fn)
    assert any(isinstance(launch, _RunLaunch) for launch in exe.launches)
    monkeypatch.setenv("DSLC_THREADS", "1")
    want = exe.run(arrays)
    same_bits(want[2:], interp.run(fn, arrays)[2:])     # no exp (the math library's) in this one
    return exe, arrays, want


def same_bits(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes()


@pytest.mark.parametrize("threads", ["1", "2", "3", "5"])
def test_a_shared_run_gives_the_bits_of_one_thread(threads, monkeypatch):
    exe, arrays, want = compiled(monkeypatch)
    monkeypatch.setenv("DSLC_THREADS", threads)
    for _ in range(20):                     # helpers join at different points each time
        same_bits(exe.run(arrays), want)


def run_alone(exe: Executable, arrays: list[np.ndarray], threads: int) -> list[np.ndarray]:
    """exe on one thread, each run called as though `threads` threads shared it, without the
    helpers ever coming."""
    def alone(self, env, pointers, n):
        for v in self.fresh:
            env[v] = np.empty(v.shape, dtype=cpu.np_dtype(v.dtype))
        pointers.words.fill(0)
        for i, v in self.patches:
            pointers.table[i] = cpu.address(env[v])
        self.fn(pointers.table, 0, threads)
        claimed, done = pointers.words[::2 * LINE], pointers.words[LINE::2 * LINE]
        assert (done > 0).all() and (claimed > done).all()      # every chunk, by the caller
    original = _RunLaunch.__call__
    _RunLaunch.__call__ = alone
    try:
        return exe.run(arrays)
    finally:
        _RunLaunch.__call__ = original


def test_the_caller_finishes_a_run_no_helper_joins(monkeypatch):
    exe, arrays, want = compiled(monkeypatch)
    same_bits(run_alone(exe, arrays, 4), want)
