"""Object code made once for each distinct kernel (backend/objects.py): a model's repeated
layers compile their kernels once, with the bits of kernels compiled one by one; a changed
program compiles only what changed; a damaged cache entry is compiled again; worker processes
make the object code this process would. Compilations run in child processes, where a crash
is a finding rather than the end of the run."""
from __future__ import annotations

import numpy as np
import pytest

from backend import objects
from conftest import isolated
from ir.core import Builder, tensor_type
from runtime.cpu import Executable

B, D = 16, 32


def layers(n: int, last: str = "tanh"):
    """n layers of softmax(h @ w) + h through tanh (the last through `last`), and a column sum."""
    b = Builder()
    h = b.param(tensor_type("f32", (B, D)))
    for i in range(n):
        z = b.emit("matmul", h, b.param(tensor_type("f32", (D, D))))
        e = b.emit("exp", b.emit("sub", z, b.emit("max", z, axis=1, keepdims=True)))
        s = b.emit("div", e, b.emit("sum", e, axis=1, keepdims=True))
        h = b.emit(last if i == n - 1 else "tanh", b.emit("add", s, h))
    return b.finish([h, b.emit("sum", h, axis=0)])


def compiled(case: tuple) -> dict:
    """In a child: the program `layers(*case[1:])` compiled into the cache folder case[0],
    what it compiled, and its results' bytes."""
    folder, n, *last = case
    import os
    os.environ["DSLC_CACHE_DIR"] = folder
    exe = Executable(layers(n, *last))
    return {"made": exe.compiled.made, "kernels": len(exe.plan.kernels),
            "results": [a.tobytes() for a in exe.run(arrays(n))]}


def arrays(n: int) -> list[np.ndarray]:
    r = np.random.default_rng(n)
    return [r.standard_normal((B, D)).astype(np.float32)] + \
           [(r.standard_normal((D, D)) * 0.3).astype(np.float32) for _ in range(n)]


def in_child(fn, *cases) -> list:
    """fn(case) for each case, one child process each, in order; a crash or an error fails."""
    done = {}
    for case, outcome, value in isolated(fn, cases, timeout=600):
        assert outcome == "ok", (case, outcome, value)
        done[case] = value
    return [done[case] for case in cases]


def test_repeated_layers_compile_their_kernels_once(tmp_path):
    one, four, eight = in_child(compiled, (str(tmp_path / "1"), 1), (str(tmp_path / "4"), 4),
                                (str(tmp_path / "8"), 8))
    # each layer: a product whose epilogue is the softmax and tanh (a kernel); then the column
    # sum: the same two pieces whatever the depth (their runs are one function for all)
    assert (four["kernels"], eight["kernels"]) == (5, 9)
    assert len(one["made"]) == len(four["made"]) == len(eight["made"]) == 2
    assert set(four["made"]) == set(eight["made"])


def undeduplicated(case: tuple) -> dict:
    """compiled(case) with every kernel its own piece, at LLVM's O3: as before kernels were
    shared."""
    objects._anonymous = lambda k: k
    objects.OPT_LEVEL = 3
    return compiled(case)


def test_shared_kernels_give_the_bits_of_kernels_compiled_one_by_one(tmp_path):
    shared, alone = in_child(compiled, (str(tmp_path / "a"), 6))[0], \
        in_child(undeduplicated, (str(tmp_path / "b"), 6))[0]
    assert len(alone["made"]) == alone["kernels"] > len(shared["made"])
    assert shared["results"] == alone["results"]


def test_a_changed_program_compiles_only_what_changed(tmp_path):
    folder = str(tmp_path)
    (first,) = in_child(compiled, (folder, 4))
    again, changed = in_child(compiled, (folder, 4), (folder, 4, "sigmoid"))
    assert again["made"] == ()                     # all of it from the cache
    assert again["results"] == first["results"]
    # the last layer's kernel is new; the rest is the cache's
    assert len(changed["made"]) == 1


def corrupted(case: tuple) -> dict:
    """compiled(case) after every object entry in the cache had a byte flipped."""
    from pathlib import Path
    for entry in Path(case[0]).rglob("*.o"):
        blob = bytearray(entry.read_bytes())
        blob[len(blob) // 2] ^= 0xFF
        entry.write_bytes(bytes(blob))
    return compiled(case)


def test_a_damaged_entry_is_compiled_again_not_run(tmp_path):
    folder = str(tmp_path)
    (first,) = in_child(compiled, (folder, 3))
    (again,) = in_child(corrupted, (folder, 3))
    assert sorted(again["made"]) == sorted(first["made"])
    assert again["results"] == first["results"]


def worker_pieces() -> list:
    kernels = Executable(layers(3, "sigmoid")).plan.kernels
    return objects.pieces(kernels, objects.kernel_symbols(kernels))


def by_workers(case: str) -> tuple[list[bytes], int]:
    """The object code of the pieces, compiled by this process alone or with two workers (a
    piece each at the least), or with workers that fail to start; and how many pieces this
    process compiled."""
    pieces = worker_pieces()
    objects.PIECES_PER_WORKER = 1
    objects._cores = lambda: 1 if case == "alone" else 3
    if case == "failing":
        objects.sys.executable = "/bin/false"
    here = []
    real = objects.object_code
    objects.object_code = lambda p: here.append(p) or real(p)
    return objects.compile_all(pieces), len(here)


@pytest.mark.parametrize("case, here", [("workers", 1), ("failing", 3)])
def test_workers_make_the_object_code_this_process_makes(case, here, tmp_path, monkeypatch):
    monkeypatch.setenv("DSLC_CACHE_DIR", str(tmp_path))
    (tmp_path / "backend").mkdir()                    # another `backend` in the current folder
    (tmp_path / "backend" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    (alone, all_here), (got, got_here) = in_child(by_workers, "alone", case)
    assert len(alone) == all_here == 3
    assert got == alone and got_here == here
