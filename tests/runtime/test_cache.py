"""The compile cache: a second compilation of the same kernels loads the stored object code;
an entry that was corrupted or written for another key is ignored, rebuilt and never run."""
from __future__ import annotations

import numpy as np
import pytest

from ir.core import Builder, tensor_type
from runtime import cache
from runtime.cpu import Executable


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DSLC_CACHE_DIR", str(tmp_path))
    return tmp_path


def program():
    b = Builder()
    x = b.param(tensor_type("f32", (40, 3)))
    return b.finish([b.emit("sum", b.emit("mul", x, x), axis=1)])


def entries(root):
    return sorted(p for p in root.rglob("*.o"))


def test_second_compilation_loads_the_stored_object(cache_dir, monkeypatch):
    x = np.arange(120, dtype=np.float32).reshape(40, 3)
    want = Executable(program()).run([x])[0]
    (entry,) = entries(cache_dir)
    stored = []
    monkeypatch.setattr(cache, "store", lambda k, data: stored.append(k))
    got = Executable(program()).run([x])[0]
    assert stored == []                         # nothing compiled: the entry was used
    assert got.tobytes() == want.tobytes() and entry.exists()


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "another key"])
def test_a_damaged_or_foreign_entry_is_rebuilt(cache_dir, damage):
    x = np.ones((40, 3), np.float32)
    Executable(program()).run([x])
    (entry,) = entries(cache_dir)
    blob = bytearray(entry.read_bytes())
    if damage == "flip a byte":
        blob[-10] ^= 0xFF
    elif damage == "truncate":
        blob = blob[: len(blob) // 2]
    else:
        blob = blob.replace(entry.stem.encode(), b"0" * len(entry.stem))
    entry.write_bytes(bytes(blob))
    assert cache.load(entry.stem) is None
    got = Executable(program()).run([x])[0]
    assert np.array_equal(got, np.full(40, 3.0, np.float32))
    assert cache.load(entry.stem) is not None   # rebuilt and stored again


def test_the_key_covers_the_compiler_versions(monkeypatch):
    k = cache.key("ir")
    monkeypatch.setattr(cache, "versions", lambda: "dslc 9.9")
    assert cache.key("ir") != k
