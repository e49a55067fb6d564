"""A new batch size of a compiled program (docs/cpu.md, "Sizes at run time"): its kernels, runs
and native steps are the ones compiled at another size, and give the bits that a process
compiling the program at that size alone gives, near the interpreter's values. Each program
runs in a child process of its own compile cache, where a crash is a finding rather than the
end of the run."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import isolated

SOURCE = """
from nn import gelu, layer_norm, softmax

def forward(w1: f32[D, H], b1: f32[H], w2: f32[H, V], x: f32[B, D]) -> f32[B, V]:
  return softmax(layer_norm(gelu(x @ w1 + b1)) @ w2)

def loss(w1: f32[D, H], b1: f32[H], w2: f32[H, V], x: f32[B, D]) -> f32:
  p = forward(w1, b1, w2, x)
  return sum(p * p)

def gradient(w1: f32[D, H], b1: f32[H], w2: f32[H, V], x: f32[B, D]) -> (f32[D, H], f32[H], f32[H, V]):
  return grad(loss, wrt=(w1, b1, w2))(w1, b1, w2, x)
"""
D, H, V = 32, 256, 48
# a size whose runs the threads share (runtime/cpu.py's MIN_RUN_WORK), a prime, an empty batch,
# one row, and a size met before; the first compiles the program and the thread team
SIZES = (2053, 7, 0, 1, 16)
ENTRIES = ("forward", "gradient")


def weights() -> list[np.ndarray]:
    r = np.random.default_rng(0)
    return [(r.standard_normal(s) * 0.2).astype(np.float32) for s in ((D, H), (H,), (H, V))]


def x_of(batch: int) -> np.ndarray:
    return np.random.default_rng(batch).standard_normal((batch, D)).astype(np.float32)


def objects(folder: str) -> int:
    """The pieces of object code compiled into a cache folder so far (runtime/cache.py)."""
    return sum(1 for _ in Path(folder).rglob("*.o"))


def bits(out) -> list[bytes]:
    return [np.asarray(a).tobytes() for a in (out if isinstance(out, tuple) else (out,))]


def runs(case: tuple) -> dict:
    """In a child, on 2 threads with its own cache folder case[0]: each entry called at each
    size of case[1] in turn; for each call, its results' bytes and the pieces it compiled."""
    import os
    folder, sizes = case
    os.environ.update(DSLC_CACHE_DIR=folder, DSLC_THREADS="2")
    import dsl
    prog = dsl.loads(SOURCE, device="cpu")
    done = {}
    for batch in sizes:
        for entry in ENTRIES:
            before = objects(folder)
            out = getattr(prog, entry)(*weights(), x_of(batch))
            done[entry, batch] = {"bits": bits(out), "compiled": objects(folder) - before}
    return done


@pytest.fixture(scope="module")
def children(tmp_path_factory) -> tuple[dict, dict]:
    """The program at every size in one process, and at each size in a process of its own."""
    folder = tmp_path_factory.mktemp("sizes")
    cases = [(str(folder / "together"), SIZES)]
    cases += [(str(folder / f"b{n}"), (n,)) for n in SIZES[:-1]]
    done = {}
    for case, outcome, value in isolated(runs, cases, timeout=900, jobs=2):
        assert outcome == "ok", (case, outcome, value)
        done.update({(case[1] if len(case[1]) == 1 else None, *k): v for k, v in value.items()})
    together = {k[1:]: v for k, v in done.items() if k[0] is None}
    return together, {k[1:]: v for k, v in done.items() if k[0] is not None}


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("batch", SIZES[:-1])
def test_every_batch_size_in_one_process_gives_the_bits_of_a_fresh_process(children, entry, batch):
    together, alone = children
    assert together[entry, batch]["bits"] == alone[entry, batch]["bits"]
    # near the interpreter, whose exp and erf are NumPy's, not the exact-mode library's: a
    # gradient's sums over 2053 rows carry their few ulps' difference (docs/numerics.md)
    import dsl
    definition = getattr(dsl.loads(SOURCE, device="reference"), entry)(*weights(), x_of(batch))
    for got, want in zip(alone[entry, batch]["bits"], bits(definition)):
        got, want = np.frombuffer(got, np.float32), np.frombuffer(want, np.float32)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6 * np.abs(want).max(initial=0))


def test_a_new_batch_size_compiles_no_kernel(children):
    """Nor a run: the reductions over the batch (the bias's gradient, the loss's sum) take
    their length at run time; nor a native step: whether a run is worth the threads (at 2053
    the gradient's is, at 7 not) is a word of its frame (backend/step.py's sized)."""
    together, _ = children
    assert together["forward", 2053]["compiled"] > 0 and together["gradient", 2053]["compiled"] > 0
    assert together["forward", 7]["compiled"] == together["forward", 16]["compiled"] == 0
    assert together["gradient", 7]["compiled"] == together["gradient", 16]["compiled"] == 0


# q @ kᵀ of heads sliced from one array: a loop of products over its batch axes, whose counts
# and steps change with the batch size
HEADS = """
def scores(qkv: f32[B, T, 3 * D], H: int) -> f32[B, H, T, T]:
  q, k, v = split(qkv, 3, axis=-1)
  q = transpose(reshape(q, [B, T, H, D // H]), [0, 2, 1, 3])
  k = transpose(reshape(k, [B, T, H, D // H]), [0, 2, 3, 1])
  return q @ k
"""


def in_own_cache(folder: str, source: str) -> tuple:
    """In a forked child: the program compiled into its own cache folder (what the parent had
    linked cleared, lest it be reused and no object code counted), and its definition."""
    import os
    os.environ["DSLC_CACHE_DIR"] = folder
    import dsl
    from backend import objects
    objects._linked.clear()
    return dsl.loads(source, device="cpu"), dsl.loads(source, device="reference")


def heads_runs(folder: str) -> list[tuple[bool, int]]:
    """In a child with its own cache folder: the scores at batch 3, then 5, each as (whether
    they are the interpreter's bits, the pieces of object code compiled)."""
    prog, definition = in_own_cache(folder, HEADS)
    done = []
    for batch in (3, 5):
        qkv = np.random.default_rng(batch).standard_normal((batch, 7, 24)).astype(np.float32)
        before = objects(folder)
        same = prog.scores(qkv, 4).tobytes() == definition.scores(qkv, 4).tobytes()
        done.append((same, objects(folder) - before))
    return done


def test_the_loop_of_products_over_heads_takes_its_counts_and_steps_at_run_time(tmp_path):
    """Its counts and the bytes each axis moves are the product's block's words, not the native
    step's code: a new batch size compiles nothing."""
    [(_, outcome, done)] = isolated(heads_runs, [str(tmp_path)], timeout=300)
    assert outcome == "ok", done
    (first_same, first_made), (same, made) = done
    assert first_same and same and first_made > 0 and made == 0


# a reduction's code serves every length of its class (backend/llvm.py's levels): up to 4096
# elements one level of chunks, up to 4096² two
LENGTHS = """
def total(x: f32[N]) -> f32:
  return mean(x * x)
"""


def length_runs(folder: str) -> list[tuple[int, bool, int]]:
    """In a child with its own cache folder: the mean of squares at each length in turn, each
    as (the length, whether it is the interpreter's bits, the pieces of object code compiled)."""
    prog, definition = in_own_cache(folder, LENGTHS)
    done = []
    for n in (100, 4000, 4096, 4097, 9000, 4096 * 4096 + 5, 1, 0, 33):
        x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        before = objects(folder)
        same = np.asarray(prog.total(x)).tobytes() == np.asarray(definition.total(x)).tobytes()
        done.append((n, same, objects(folder) - before))
    return done


def test_a_reduction_is_compiled_once_for_each_class_of_lengths(tmp_path):
    [(_, outcome, done)] = isolated(length_runs, [str(tmp_path)], timeout=300)
    assert outcome == "ok", done
    assert all(same for _, same, _ in done), done
    made = {n: count for n, _, count in done}
    assert made[100] > 0 and made[4000] == made[4096] == made[33] == 0     # one level
    assert made[4097] > 0 and made[9000] == 0                               # two
    assert made[4096 * 4096 + 5] > 0                                        # three
