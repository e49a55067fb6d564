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


def pickled(root):
    return sorted(p for p in root.rglob("*.pkl"))


def test_a_second_executable_of_the_same_function_reuses_its_plan(cache_dir, monkeypatch):
    x = np.arange(120, dtype=np.float32).reshape(40, 3)
    want = Executable(program()).run([x])[0]
    assert pickled(cache_dir), "the plan was not stored"
    monkeypatch.setattr("runtime.cpu.schedule", lambda *a: pytest.fail("planned again"))
    got = Executable(program()).run([x])[0]       # a new lowering: other value ids, same plan
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("damage", ["flip a byte", "another key"])
def test_a_damaged_or_foreign_plan_is_planned_again_never_unpickled(cache_dir, damage, monkeypatch):
    x = np.ones((40, 3), np.float32)
    Executable(program()).run([x])
    for entry in pickled(cache_dir):
        blob = bytearray(entry.read_bytes())
        if damage == "flip a byte":
            blob[-3] ^= 0xFF
        else:
            blob = blob.replace(entry.stem.encode(), b"0" * len(entry.stem))
        entry.write_bytes(bytes(blob))
    monkeypatch.setattr("pickle.loads", lambda *a: pytest.fail("a damaged entry was unpickled"))
    got = Executable(program()).run([x])[0]
    assert np.array_equal(got, np.full(40, 3.0, np.float32))


def test_the_code_digest_covers_every_source(tmp_path, monkeypatch):
    (tmp_path / "backend").mkdir()
    source = tmp_path / "backend" / "schedule.py"
    source.write_text("A = 1\n")
    monkeypatch.setattr(cache, "ROOT", tmp_path)
    cache.code_digest.cache_clear()
    try:
        before = cache.code_digest("backend")
        source.write_text("A = 2\n")
        cache.code_digest.cache_clear()
        assert cache.code_digest("backend") != before
    finally:
        cache.code_digest.cache_clear()


def test_a_second_load_of_the_same_source_skips_lowering(cache_dir, monkeypatch):
    import dsl
    source = "def f(x: f32[N]) -> f32:\n  return sum(x * x)\n"
    x = np.arange(5, dtype=np.float32)
    assert dsl.loads(source, device="cpu").f(x) == 30.0
    monkeypatch.setattr(dsl.Program, "_lower", lambda *a: pytest.fail("lowered again"))
    assert dsl.loads(source, device="cpu").f(x) == 30.0
    with pytest.raises(BaseException, match="lowered again"):      # other shapes: lowered
        dsl.loads(source, device="cpu").f(np.ones(4, np.float32))


def test_a_second_load_of_the_same_text_skips_parsing_and_reports_errors_where_they_are(
        cache_dir, monkeypatch):
    import dsl
    from dsl import program
    source = "def f(x: f32[N]) -> f32:\n  return sum(x * x)\n\ndef g(x: f32[N]) -> f32:\n  return x\n"
    for _ in range(2):
        with pytest.raises(dsl.DslError) as e:
            dsl.loads(source, name="m.bend", device="cpu").g(np.ones(3, np.float32))
        assert str(e.value).startswith("m.bend:5:")
        monkeypatch.setattr(program, "parse", lambda *a: pytest.fail("parsed again"))
    assert dsl.loads(source, name="m.bend", device="cpu").f(np.ones(3, np.float32)) == 3.0
    with pytest.raises(BaseException, match="parsed again"):        # another path: parsed
        dsl.loads(source, name="n.bend", device="cpu")

def test_values_of_a_cached_function_never_share_an_id_with_this_process_values():
    import pickle
    fn = program()
    back = pickle.loads(pickle.dumps(fn))        # as if stored by another process
    values = {v for f in (fn, back) for op in f.ops for v in op.outputs + op.inputs}
    assert len({v.id for v in values}) == len(values)

