"""The buffer plan: values the kernels write share one arena, reused from call to call, and
two values never share bytes while both are alive; results and what host steps may alias
stay out of it."""
from __future__ import annotations

import errno
import mmap
import sys
from pathlib import Path

import numpy as np
import pytest

import dsl
from backend.schedule import HostStep, nbytes, plan_memory, reads, writes
from ir import interp
from ir.ad import grad_function
from ir.core import Builder, tensor_type
from ir.passes import optimize
from runtime.cpu import FAULTED_BESIDE, Executable, _pages

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import test_programs as programs  # noqa: E402

rng = np.random.default_rng(5)


def lifetimes(plan):
    """Each written value's first and last step, a host output's lifetime counting for the
    inputs it may be a view of."""
    span = {}
    for i, step in enumerate(plan.steps):
        for v in writes(step):
            span[v] = [i, i]
        for v in reads(step):
            span.setdefault(v, [i, i])[1] = i
    for step in reversed(plan.steps):
        if isinstance(step, HostStep):
            for v in step.op.inputs:
                span[v][1] = max([span[v][1]] + [span[o][1] for o in step.op.outputs])
    return span


@pytest.mark.parametrize("name, wrt", [("mlp", ("p", "x")), ("attention", ("q", "k", "v")),
                                       ("layer_norm", ("p", "x"))])
def test_no_two_live_values_share_bytes(name, wrt):
    prog = dsl.load(str(programs.PROGRAMS / f"{name}.bend"), device="cpu")
    args = getattr(programs, f"{name}_inputs")(0)
    low, _ = prog.lower("loss", (), args)
    fn = optimize(grad_function(low.function, list(range(len(low.function.params))), with_value=True))
    plan = Executable(fn).plan
    memory = plan_memory(plan)
    span = lifetimes(plan)
    placed = sorted(memory.offsets.items(), key=lambda kv: kv[1])
    assert len(placed) > 3, "nothing was planned"
    for i, (u, a) in enumerate(placed):
        assert not set(fn.results) & {u}
        for v, b in placed[i + 1:]:
            if b >= a + nbytes(u):
                break
            first, last = span[u], span[v]
            assert last[1] < first[0] or first[1] < last[0], "two live values share bytes"


def test_a_value_kept_alive_across_many_kernels_is_not_overwritten():
    # y stays alive while a chain of same-sized temporaries comes and goes around it
    b = Builder()
    x = b.param(tensor_type("f32", (64, 64)))
    y = b.emit("sqrt", b.emit("abs", x))
    t = x
    for _ in range(6):
        t = b.emit("sum", b.emit("mul", t, x), axis=1, keepdims=True)
        t = b.emit("add", b.emit("neg", t), x)
    fn = b.finish([b.emit("add", t, y), b.emit("max", y, axis=0)])
    exe = Executable(fn)
    a = rng.standard_normal((64, 64)).astype(np.float32)
    got, want = exe.run([a]), interp.run(fn, [a])
    assert exe.memory.offsets, "nothing was planned"
    for g, w in zip(got, want):
        assert g.tobytes() == w.tobytes()


def test_results_are_fresh_arrays_that_a_later_call_leaves_alone():
    b = Builder()
    x = b.param(tensor_type("f32", (300, 70)))
    fn = b.finish([b.emit("sum", b.emit("mul", b.emit("add", x, x), x), axis=1)])
    exe = Executable(fn)
    a = rng.standard_normal((300, 70)).astype(np.float32)
    first = exe.run([a])[0]
    kept = first.copy()
    second = exe.run([a * 2])[0]
    assert not np.shares_memory(first, second)
    assert first.tobytes() == kept.tobytes()
    assert second.tobytes() == interp.run(fn, [a * 2])[0].tobytes()


def test_a_host_view_of_a_planned_value_keeps_it_alive():
    # reshape runs on the host and may return a view of the kernel's output
    b = Builder()
    x = b.param(tensor_type("f32", (8, 16)))
    e = b.emit("mul", x, x)
    r = b.emit("reshape", e, shape=(128,))
    later = b.emit("add", b.emit("mul", x, b.constant(3.0, "f32")), x)
    fn = b.finish([b.emit("add", r, b.emit("reshape", later, shape=(128,))), r])
    exe = Executable(fn)
    a = rng.standard_normal((8, 16)).astype(np.float32)
    for g, w in zip(exe.run([a]), interp.run(fn, [a])):
        assert g.tobytes() == w.tobytes()


def test_a_large_first_arena_is_faulted_beside_the_build_and_serves_one_call():
    """The first call takes the arena a thread faulted in while the executable was built; a call
    made during it (nested here) maps one of its own; both give the interpreter's bits."""
    b = Builder()
    x, w = b.param(tensor_type("f32", (1031, 64))), b.param(tensor_type("f32", (64, 1024)))
    y = b.emit("matmul", x, w)                      # 4.2 MB in the arena
    fn = b.finish([b.emit("sum", b.emit("mul", b.emit("exp", y), y), axis=1)])
    exe = Executable(fn)
    assert exe.memory.size >= FAULTED_BESIDE and len(exe._faulting) == 1
    faulted = exe._faulting[0].memory
    a, c = (rng.standard_normal(s).astype(np.float32) * 0.1 for s in ((1031, 64), (64, 1024)))
    inner = []

    def outer(arena, arrays):
        assert arena.memory is faulted
        inner.append(exe.run([a * 2, c])[0])        # the arena is taken: another is mapped
        return exe.native.run(arena, arrays)
    (got,) = exe._in_arena(outer, [a, c])
    assert not exe._faulting and len(exe._arenas) == 2
    assert not np.shares_memory(exe._arenas[0].memory, exe._arenas[1].memory)
    assert got.tobytes() == exe.walk([a, c])[0].tobytes()
    assert inner[0].tobytes() == exe.walk([a * 2, c])[0].tobytes()
    want = interp.run(fn, [a, c])[0]                # (exp within a few ulp: docs/numerics.md)
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))


@pytest.mark.skipif(not hasattr(mmap, "MAP_POPULATE"), reason="an arena is np.empty's there")
def test_an_arena_the_system_cannot_map_is_out_of_memory(monkeypatch):
    """A MemoryError, which the API reports as out of memory, not the OSError of mmap."""
    arena = _pages(3 << 20)
    assert arena.nbytes == 3 << 20 and not arena.any() and arena.flags.writeable

    def refuse(*args, **kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")
    monkeypatch.setattr(mmap, "mmap", refuse)
    with pytest.raises(MemoryError):
        _pages(1 << 20)
