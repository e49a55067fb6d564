"""The compile cache: a second compilation of the same kernels loads the stored object code;
an entry that was corrupted or written for another key is ignored, rebuilt and never run, and
no entry is trusted further than a regular file of this user's, in folders only they can write,
read as data."""
from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest

from conftest import EXAMPLES, pickled_call, pickled_new
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


def as_in_a_new_process(monkeypatch) -> None:
    """Forget the object code this process has linked (backend/objects.py, backend/cpu.py's
    jit and its run function), so that the next executable reads it from the cache, as a new
    process would. (Without the run function's, the test below failed where it ran first in
    its process: the damaged entry of the run function was never read again.)"""
    from backend import cpu, objects
    monkeypatch.setattr(objects, "_linked", weakref.WeakValueDictionary())
    monkeypatch.setattr(cpu, "_jitted", weakref.WeakValueDictionary())
    cpu.run_function.cache_clear()          # (the engines it made stay: runs call them)


def test_second_compilation_loads_the_stored_object(cache_dir, monkeypatch):
    x = np.arange(120, dtype=np.float32).reshape(40, 3)
    as_in_a_new_process(monkeypatch)
    want = Executable(program()).run([x])[0]
    made = entries(cache_dir)                   # the kernel's and its run's (backend/objects.py)
    stored = []
    monkeypatch.setattr(cache, "store", lambda k, data: stored.append(k))
    as_in_a_new_process(monkeypatch)
    got = Executable(program()).run([x])[0]
    assert stored == []                         # nothing compiled: the entries were used
    assert got.tobytes() == want.tobytes() and made and all(e.exists() for e in made)


def test_a_second_executable_in_the_process_links_its_code_again_never(cache_dir, monkeypatch):
    """A new batch size, or another function with the program's kernels: the pieces and
    engines this process holds are used, not read from the cache and linked again."""
    x = np.arange(120, dtype=np.float32).reshape(40, 3)
    first = Executable(program())
    want = first.run([x])[0]
    load = cache.load
    monkeypatch.setattr(cache, "load", lambda k, kind="o": pytest.fail("object code read again")
                        if kind == "o" else load(k, kind))
    second = Executable(program())
    assert second.compiled.addresses == first.compiled.addresses
    assert second.run([x])[0].tobytes() == want.tobytes()


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "another key"])
def test_a_damaged_or_foreign_entry_is_rebuilt(cache_dir, damage, monkeypatch):
    x = np.ones((40, 3), np.float32)
    as_in_a_new_process(monkeypatch)
    Executable(program()).run([x])
    made = entries(cache_dir)
    for entry in made:
        blob = bytearray(entry.read_bytes())
        if damage == "flip a byte":
            blob[-10] ^= 0xFF
        elif damage == "truncate":
            blob = blob[: len(blob) // 2]
        else:
            blob = blob.replace(entry.stem.encode(), b"0" * len(entry.stem))
        entry.write_bytes(bytes(blob))
        assert cache.load(entry.stem) is None
    as_in_a_new_process(monkeypatch)
    got = Executable(program()).run([x])[0]
    assert np.array_equal(got, np.full(40, 3.0, np.float32))
    assert made and all(cache.load(e.stem) is not None for e in made)   # rebuilt, stored again


def test_the_key_covers_the_compiler_versions(monkeypatch):
    k = cache.key("ir")
    monkeypatch.setattr(cache, "versions", lambda: "dslc 9.9")
    assert cache.key("ir") != k


def stored_values(root):
    return sorted(p for p in root.rglob("*.val"))


def test_a_second_executable_of_the_same_function_reuses_its_plan(cache_dir, monkeypatch):
    x = np.arange(120, dtype=np.float32).reshape(40, 3)
    want = Executable(program()).run([x])[0]
    assert stored_values(cache_dir), "the plan was not stored"
    monkeypatch.setattr("runtime.cpu.schedule", lambda *a: pytest.fail("planned again"))
    got = Executable(program()).run([x])[0]       # a new lowering: other value ids, same plan
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("damage", ["flip a byte", "another key"])
def test_a_damaged_or_foreign_plan_is_planned_again_never_decoded(cache_dir, damage, monkeypatch):
    x = np.ones((40, 3), np.float32)
    Executable(program()).run([x])
    for entry in stored_values(cache_dir):
        blob = bytearray(entry.read_bytes())
        if damage == "flip a byte":
            blob[-3] ^= 0xFF
        else:
            blob = blob.replace(entry.stem.encode(), b"0" * len(entry.stem))
        entry.write_bytes(bytes(blob))
    monkeypatch.setattr("runtime.codec.decode", lambda *a: pytest.fail("a damaged entry was decoded"))
    got = Executable(program()).run([x])[0]
    assert np.array_equal(got, np.full(40, 3.0, np.float32))


def test_the_code_digest_covers_every_source(tmp_path, monkeypatch):
    (tmp_path / "backend").mkdir()
    source = tmp_path / "backend" / "schedule.py"
    source.write_text("A = 1\n")
    monkeypatch.setattr(cache, "ROOT", tmp_path)
    cache._folder_digest.cache_clear()
    try:
        before = cache.code_digest("backend")
        source.write_text("A = 2\n")
        cache._folder_digest.cache_clear()
        assert cache.code_digest("backend") != before
    finally:
        cache._folder_digest.cache_clear()


def test_object_code_is_keyed_on_the_ir_where_the_scalar_bodies_are(cache_dir, monkeypatch):
    """A kernel's code comes from its primitives' `scalar` and `step` (ir/ops): a change there
    must not load the code compiled before it."""
    digested = []
    real = cache.code_digest
    monkeypatch.setattr(cache, "code_digest",
                        lambda *folders: digested.append(folders) or real(*folders))
    Executable(program())
    assert digested and all("ir" in folders for folders in digested)


def test_a_second_load_of_the_same_source_skips_lowering(cache_dir, monkeypatch):
    import dsl
    source = "def f(x: f32[N]) -> f32:\n  return sum(x * x)\n"
    x = np.arange(5, dtype=np.float32)
    assert dsl.loads(source, device="cpu").f(x) == 30.0
    monkeypatch.setattr(dsl.Program, "_lower", lambda *a: pytest.fail("lowered again"))
    assert dsl.loads(source, device="cpu").f(x) == 30.0
    with pytest.raises(BaseException, match="lowered again"):      # other shapes: lowered
        dsl.loads(source, device="cpu").f(np.ones(4, np.float32))


def test_neither_a_warm_load_nor_a_new_size_builds_the_segments_ir_again(cache_dir, monkeypatch):
    """A second load takes its native step's code by the step's calls, without building the
    IR again (0.35 s of the GPT step's), and so does another size: the calls' sizes are read
    from the frame (backend/step.py's sized), so the code compiled for the first size serves."""
    import dsl
    import runtime.cpu
    from backend import step
    texts = []
    real = step.module_ir
    monkeypatch.setattr(step, "module_ir", lambda *args: texts.append(str(real(*args))) or real(*args))
    monkeypatch.setattr(runtime.cpu, "MIN_RUN_WORK", 30)    # tanh's run: shared at 6 x 6, not at 5 x 5
    source = "def f(a: f32[N, N], b: f32[N, N]) -> f32:\n  return sum(tanh(a @ b) @ b)\n"
    for n in (6, 6, 5):
        a = np.arange(n * n, dtype=np.float32).reshape(n, n) / (n * n)
        assert dsl.loads(source, device="cpu").f(a, a) == dsl.loads(source, device="reference").f(a, a)
    assert len(texts) == 1 and "segment0" in texts[0]


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


@pytest.mark.parametrize("roundtrip", ["codec", "pickle"])
def test_values_of_a_cached_function_never_share_an_id_with_this_process_values(roundtrip):
    import pickle
    from runtime import codec
    fn = program()
    if roundtrip == "codec":
        back = codec.decode(codec.encode(fn))    # as if stored by another process
    else:
        back = pickle.loads(pickle.dumps(fn))
    values = {v for f in (fn, back) for op in f.ops for v in op.outputs + op.inputs}
    assert len({v.id for v in values}) == len(values)



# ---------------------------------------------------------------------------------------------
# What is at an entry's path is not trusted: only a regular file of this user's, in folders no
# one else can write, with the header and checksum the key calls for, is read, and only as data.

REPO = Path(__file__).resolve().parents[2]


def child_env(cache: Path, **more: str) -> dict[str, str]:
    """The environment of a new Python process of dslc's on this cache, with `more`."""
    return dict(os.environ, DSLC_CACHE_DIR=str(cache), DSLC_DEVICE="cpu", PYTHONPATH=str(REPO),
                **more)


def child(code: str, cache: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run code in a new Python process on this cache: a hang fails the test, never the suite."""
    return subprocess.run([sys.executable, "-c", code], env=child_env(cache), cwd=REPO,
                          timeout=timeout, capture_output=True, text=True)


@pytest.mark.parametrize("thing", ["fifo", "symlink to /dev/zero"])
def test_a_fifo_or_device_at_an_entry_is_a_miss_not_a_hang(cache_dir, thing):
    k = cache.key("a fifo")
    path = cache_dir / k[:2] / f"{k}.o"
    path.parent.mkdir(mode=0o700)
    if thing == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    run = child(f"from runtime import cache; print(cache.load({k!r}))", cache_dir, timeout=30)
    assert run.stdout.split() == ["None"], run.stderr


def test_an_entry_longer_than_its_header_says_is_a_miss(cache_dir):
    cache.store("k", b"object code")
    (entry,) = cache_dir.rglob("k.o")
    with open(entry, "ab") as f:
        f.write(b"more")
    assert cache.load("k") is None


def test_an_entry_whose_header_claims_more_than_the_maximum_is_a_miss(cache_dir):
    cache.store("k", b"object code")
    (entry,) = cache_dir.rglob("k.o")
    head = cache.MAGIC + b"k\n"
    entry.write_bytes(head + cache.HEADER.pack(cache.MAX_ENTRY + 1, bytes(32)) + b"x")
    assert cache.load("k") is None


class FullDisk:
    """A file whose write fails half-way, as on a full disk."""
    fdopen = os.fdopen

    def __init__(self, fd, mode):
        self.f = FullDisk.fdopen(fd, mode)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def write(self, data):
        self.f.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("failing", ["write", "replace"])
def test_a_failed_write_leaves_no_temporary_file(cache_dir, monkeypatch, failing):
    def no_space(*a):
        raise OSError(errno.ENOSPC, "No space left on device")
    if failing == "write":
        monkeypatch.setattr(cache.os, "fdopen", FullDisk)
    else:
        monkeypatch.setattr(cache.os, "replace", no_space)
    cache.store("k", b"object code" * 1000)          # not an error to the caller
    monkeypatch.undo()
    assert [p.name for p in cache_dir.rglob("*") if p.is_file()] == []
    assert cache.load("k") is None


def test_a_planted_pickle_with_a_valid_checksum_is_never_unpickled(cache_dir, tmp_path):
    import pickle
    x = np.ones((40, 3), np.float32)
    Executable(program()).run([x])
    marker = tmp_path / "ran"

    class Hostile:
        def __reduce__(self):
            return (Path.touch, (marker,))
    assert stored_values(cache_dir)
    for entry in stored_values(cache_dir):
        cache.store(entry.stem, pickle.dumps(Hostile()), "val")   # a checksum that matches
        assert cache.load(entry.stem, "val") is not None
    got = Executable(program()).run([x])[0]
    assert np.array_equal(got, np.full(40, 3.0, np.float32)) and not marker.exists()


@pytest.mark.parametrize("where", ["cache folder", "entry folder"])
@pytest.mark.parametrize("mode", [0o777, 0o770])
def test_entries_in_a_folder_others_can_write_are_refused_with_one_warning(
        cache_dir, monkeypatch, capsys, where, mode):
    cache.store("k", b"object code")
    assert cache.load("k") == b"object code"
    (entry,) = cache_dir.rglob("k.o")
    (cache_dir if where == "cache folder" else entry.parent).chmod(mode)
    monkeypatch.setattr(cache, "_warned", False)
    assert cache.load("k") is None and cache.load("k") is None
    assert capsys.readouterr().err.count("dslc: not using the compile cache") == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_entries_in_a_folder_of_another_user_are_refused(cache_dir, monkeypatch):
    cache.store("k", b"object code")
    (entry,) = cache_dir.rglob("k.o")
    os.chown(entry.parent, 12345, -1)
    monkeypatch.setattr(cache, "_warned", True)
    assert cache.load("k") is None


def test_new_cache_folders_are_writable_by_this_user_only(tmp_path, monkeypatch):
    monkeypatch.setenv("DSLC_CACHE_DIR", str(tmp_path / "new"))
    old = os.umask(0o002)                   # a umask that would let the group write
    try:
        cache.store("k", b"object code")
    finally:
        os.umask(old)
    (entry,) = (tmp_path / "new").rglob("k.o")
    assert (entry.parent.stat().st_mode & 0o777, (tmp_path / "new").stat().st_mode & 0o777) == (0o700, 0o700)
    assert cache.load("k") == b"object code"


# ---------------------------------------------------------------------------------------------
# A program's entry (dsl/program.py): an entry point's lowering and its plan, stored as one
# entry under a key that covers everything they depend on; any change is a miss, built again.

MAIN = "from nn import relu\nfrom lib import twice\n\ndef f(x: f32[N]) -> f32:\n  return sum(relu(twice(x)) * x)\n"
LIB = "def twice(x):\n  return 2.0 * x\n"


@pytest.fixture
def sources(tmp_path, monkeypatch):
    """main.bend, importing lib.bend beside it and nn from a copy of the standard library."""
    from frontend import resolve
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "main.bend").write_text(MAIN)
    (folder / "lib.bend").write_text(LIB)
    stdlib = shutil.copytree(resolve.STDLIB_DIR, tmp_path / "stdlib")
    monkeypatch.setattr(resolve, "STDLIB_DIR", stdlib)
    return folder


def run_main(folder: Path, n: int = 5, numerics: str = "exact") -> float:
    import dsl
    return float(dsl.load(folder / "main.bend", device="cpu", numerics=numerics).f(np.arange(n, dtype=np.float32)))


def made(monkeypatch) -> list[str]:
    """What each run from now on lowers and plans afresh: 'lowered' and 'planned', in order."""
    import dsl.program
    import runtime.cpu
    done: list[str] = []
    lower, plan = dsl.program.Program._lower, runtime.cpu.plan
    monkeypatch.setattr(dsl.program.Program, "_lower", lambda *a: done.append("lowered") or lower(*a))
    monkeypatch.setattr(runtime.cpu, "plan", lambda *a: done.append("planned") or plan(*a))
    return done


def test_a_warm_load_neither_lowers_nor_plans(cache_dir, sources, monkeypatch):
    assert run_main(sources) == 60.0
    done = made(monkeypatch)
    assert run_main(sources) == 60.0 and done == []


# A new process imports only what `import dsl` and its call need: an entry it cannot decode (one
# of its classes in a module not yet imported) would be lowered and planned again at every start,
# and ml_dtypes (0.7 s to import) is for bf16 alone.
NEW_PROCESS = """
import sys, numpy as np, dsl, dsl.program
lower = dsl.program.Program._lower
lowered = []
dsl.program.Program._lower = lambda *a: lowered.append(1) or lower(*a)
prog = dsl.loads("def f(x: f32[N]) -> f32:\\n  return sum(x * x)\\n", name="warm.bend", device="cpu")
print(float(prog.f(np.arange(5, dtype=np.float32))), len(lowered), "ml_dtypes" in sys.modules)
"""


def test_a_warm_load_in_a_new_process_neither_lowers_nor_plans(cache_dir):
    cold, warm = child(NEW_PROCESS, cache_dir), child(NEW_PROCESS, cache_dir)
    assert cold.stdout.split() == ["30.0", "1", "False"], cold.stderr
    assert warm.stdout.split() == ["30.0", "0", "False"], warm.stderr


# Every example's training step, compiled into an empty cache by one new process and loaded from
# it by another: the same bits, the second having lowered and planned nothing (its whole entry
# decoded: a class the codec wrote that it cannot read back would be a miss, built again).
EXAMPLE_STEP = """
import hashlib, os, sys, time, dsl.program
sys.path.insert(0, "tests")
from conftest import bits, example_step_case
go = os.environ.get("GO")                   # a file whose making starts every process at once
print("ready", flush=True)
while go and not os.path.exists(go):
    time.sleep(0.001)
lower = dsl.program.Program._lower
lowered = []
dsl.program.Program._lower = lambda *a: lowered.append(1) or lower(*a)
prog, args = example_step_case({name!r}, "cpu")
print(hashlib.sha256(repr(sorted(bits(prog.step(**args)).items())).encode()).hexdigest(), len(lowered))
"""


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_step_loaded_warm_in_a_new_process_gives_the_same_bits(cache_dir, name):
    cold, warm = (child(EXAMPLE_STEP.format(name=name), cache_dir, timeout=300) for _ in range(2))
    _, digest, lowered = cold.stdout.split()
    assert lowered != "0", cold.stderr
    assert warm.stdout.split() == ["ready", digest, "0"], warm.stderr


def test_processes_compiling_one_program_into_one_cache_at_once_agree(cache_dir):
    """Three processes store the same entries at once, each maybe reading another's: every one
    gives the same bits, and a fourth then loads them all warm."""
    go = cache_dir.parent / "go"
    procs = [subprocess.Popen([sys.executable, "-c", EXAMPLE_STEP.format(name="gpt")],
                              env=child_env(cache_dir, GO=str(go)), cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    try:
        assert [p.stdout.readline() for p in procs] == ["ready\n"] * 3
        go.touch()
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    digests = {out.split()[0] for out, _ in outs}
    assert len(digests) == 1
    warm = child(EXAMPLE_STEP.format(name="gpt"), cache_dir, timeout=300)
    assert warm.stdout.split() == ["ready", *digests, "0"], warm.stderr


def append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


CHANGES = {
    "the program's text": lambda src, mp: append(src / "main.bend", "\n# a comment\n"),
    "an imported module's text": lambda src, mp: append(src / "lib.bend", "\n# a comment\n"),
    "the standard library's text": lambda src, mp: append(
        __import__("frontend.resolve").resolve.STDLIB_DIR / "nn.bend", "\n# a comment\n"),
    "dslc's version": lambda src, mp: mp.setattr(cache, "versions", lambda: "dslc 9.9"),
    "dslc's code": lambda src, mp: mp.setattr(cache, "code_digest", lambda *folders: "changed"),
    "the CPU": lambda src, mp: mp.setattr(cache, "host", lambda: "x86_64-unknown-linux-gnu; znver9; +avx1024"),
}


@pytest.mark.parametrize("change", CHANGES)
def test_a_change_to_anything_the_entry_depends_on_is_a_miss(cache_dir, sources, monkeypatch, change):
    assert run_main(sources) == 60.0
    CHANGES[change](sources, monkeypatch)
    done = made(monkeypatch)
    assert run_main(sources) == 60.0 and done == ["lowered", "planned"]
    assert run_main(sources) == 60.0 and done == ["lowered", "planned"]     # then a hit


@pytest.mark.parametrize("signature, want", [({"n": 6}, 110.0), ({"numerics": "fast"}, 60.0)])
def test_another_input_signature_or_numerics_is_another_entry(cache_dir, sources, monkeypatch,
                                                              signature, want):
    assert run_main(sources) == 60.0
    done = made(monkeypatch)
    assert run_main(sources, **signature) == want and done == ["lowered", "planned"]
    assert run_main(sources) == 60.0 and done == ["lowered", "planned"]     # the first kept


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "sealed garbage", "sealed other value"])
def test_a_damaged_program_entry_is_built_again(cache_dir, sources, monkeypatch, damage):
    from dsl.program import Stored
    stored = []
    store_value = cache.store_value
    monkeypatch.setattr(cache, "store_value",
                        lambda k, v: (stored.append(k) if isinstance(v, Stored) else None, store_value(k, v)))
    assert run_main(sources) == 60.0
    (k,) = stored
    entry = cache._path(k, "val")
    {"flip a byte": flip, "truncate": lambda e: e.write_bytes(e.read_bytes()[:-100]),
     "sealed garbage": lambda e: sealed(e, os.urandom(300)),
     "sealed other value": lambda e: sealed(e, __import__("runtime.codec").codec.encode((1, 2)))}[damage](entry)
    done = made(monkeypatch)
    assert run_main(sources) == 60.0 and done == ["lowered", "planned"]
    assert isinstance(cache.load_value(k, Stored), Stored)                  # stored again


def a_product_runs() -> None:
    """A program's first product, in this process, checked against float64 NumPy."""
    import dsl
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((200, 300), np.float32), rng.standard_normal((300, 100), np.float32)
    got = dsl.loads("def f(a: f32[M, K], b: f32[K, N]) -> f32[M, N]:\n  return a @ b\n",
                    device="cpu").f(a, b)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-4)


def test_the_product_kernel_is_compiled_beside_a_cold_plan_not_after_it(cache_dir, monkeypatch):
    import runtime.cpu
    from backend import contract
    monkeypatch.setattr(runtime.cpu, "_matmuls", {})            # as in a new process
    monkeypatch.setattr(contract, "llvm_ir", lambda *part: pytest.fail("compiled here"))
    a_product_runs()


@pytest.mark.parametrize("failing", ["a process that fails", "no process at all"])
def test_a_part_of_the_product_kernel_not_made_beside_is_made_here(cache_dir, monkeypatch, failing):
    """The kernel's parts are compiled by processes of their own; one that fails, or cannot
    start, leaves its part to the first product, which then links both."""
    import runtime.cpu
    from backend import contract
    monkeypatch.setattr(runtime.cpu, "_matmuls", {})            # as in a new process
    monkeypatch.setattr(runtime.cpu, "_beside", {})
    start = subprocess.Popen

    def popen(command, **kwargs):
        if "object_code('f32', 0)" not in command[-1]:
            return start(command, **kwargs)
        if failing == "no process at all":
            raise OSError("no process")
        return start([sys.executable, "-c", "raise SystemExit(3)"], **kwargs)

    monkeypatch.setattr(runtime.cpu.subprocess, "Popen", popen)
    made_here = []
    llvm_ir = contract.llvm_ir
    monkeypatch.setattr(contract, "llvm_ir", lambda *part: made_here.append(part[1]) or llvm_ir(*part))
    a_product_runs()
    assert made_here == [0] and all(contract.cached("f32", part) for part in range(contract.PARTS))


def test_the_product_kernel_starts_compiling_once_the_products_are_traced(cache_dir, monkeypatch):
    """Before the optimisation and the plan, not after them: the GPT step's first call waited
    0.34-0.42 s for the kernel when it started at the plan."""
    import dsl
    import dsl.program
    import runtime.cpu
    monkeypatch.setattr(runtime.cpu, "_matmuls", {})            # as in a new process
    monkeypatch.setattr(runtime.cpu, "_beside", {})
    started = []
    optimize = dsl.program.optimize
    monkeypatch.setattr(dsl.program, "optimize",
                        lambda fn: started.append(sorted(runtime.cpu._beside)) or optimize(fn))
    a = np.ones((20, 30), np.float32)
    dsl.loads("def f(a: f32[M, K]) -> f32[M, M]:\n  return a @ transpose(a)\n", device="cpu").f(a)
    assert started[0] == ["f32"] and runtime.cpu._beside == {}


# ---------------------------------------------------------------------------------------------
# A corpus of damaged entries, each met by a new process through the public API: every run
# gives the right answer, having ignored and rebuilt what it could not trust.

SOURCE = "def f(x: f32[N]) -> f32:\n  return sum(x * x)\n"
RUN = (f"import numpy as np, dsl; print(dsl.loads({SOURCE!r}, name='m.bend')"
       ".f(np.arange(5, dtype=np.float32)))")


def sealed(entry: Path, data: bytes) -> None:
    """Rewrite entry (in the cache $DSLC_CACHE_DIR names) with data under a header and checksum
    that match: what checking the checksum cannot catch."""
    entry.unlink()
    cache.store(entry.stem, data, entry.suffix[1:])


def flip(entry):
    blob = bytearray(entry.read_bytes())
    blob[-5] ^= 0xFF
    entry.write_bytes(bytes(blob))


def fifo(entry):
    entry.unlink()
    os.mkfifo(entry)


def dev_zero(entry):
    entry.unlink()
    entry.symlink_to("/dev/zero")


def another_key(entry):
    entry.write_bytes(entry.read_bytes().replace(entry.stem.encode(), b"0" * len(entry.stem)))


ANY_ENTRY = {
    "flip a byte": flip,
    "truncate": lambda e: e.write_bytes(e.read_bytes()[: e.stat().st_size // 2]),
    "append": lambda e: e.write_bytes(e.read_bytes() + b"\0" * 64),
    "empty": lambda e: e.write_bytes(b""),
    "another key": another_key,
    "fifo": fifo,
    "symlink to /dev/zero": dev_zero,
    "a folder": lambda e: (e.unlink(), e.mkdir()),
}
VALUE_ENTRY = {
    "sealed garbage": lambda e: sealed(e, os.urandom(200)),
    "sealed truncation": lambda e: sealed(e, cache.load(e.stem, "val")[:-7]),
    "sealed pickle": lambda e: sealed(e, __import__("pickle").dumps(print)),
    "sealed foreign class": lambda e: sealed(e, pickled_new("pathlib", "Path")),
    "sealed unimported dslc class": lambda e: sealed(e, pickled_new("runtime.nothing", "X")),
    "sealed dslc function": lambda e: sealed(e, pickled_call(__import__("dsl.program").program.loads, "")),
    "sealed empty entry object": lambda e: sealed(e, pickled_new("dsl.program", "Stored")),
    "sealed bad reference": lambda e: sealed(e, b"\x80\x04h\x07."),
    "sealed bad array": lambda e: sealed(e, pickled_call(__import__("runtime.codec").codec._array,
                                                         "|O", (3,), b"\0" * 24)),
    "sealed call": lambda e: sealed(e, pickled_call(eval, "1")),
}


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("warm")
    run = child(RUN, root)
    assert run.stdout.split() == ["30.0"], run.stderr
    return root


@pytest.mark.parametrize("kind, damage", [(k, d) for k in ("o", "val") for d in ANY_ENTRY]
                         + [("val", d) for d in VALUE_ENTRY])
def test_a_run_on_a_damaged_cache_ignores_and_rebuilds_the_damage(warm_cache, tmp_path, monkeypatch,
                                                                  kind, damage):
    root = tmp_path / "cache"
    shutil.copytree(warm_cache, root, symlinks=True)
    entries = sorted(root.rglob(f"*.{kind}"))
    assert entries
    monkeypatch.setenv("DSLC_CACHE_DIR", str(root))
    for entry in entries:
        {**ANY_ENTRY, **VALUE_ENTRY}[damage](entry)
    run = child(RUN, root, timeout=120)
    assert run.stdout.split() == ["30.0"] and "Traceback" not in run.stderr, run.stderr
    if damage != "a folder":                    # rebuilt: the next run reads what this one stored
        assert all(cache.load(e.stem, kind) is not None for e in entries), damage


# ---------------------------------------------------------------------------------------------
# The cache's size: a cap kept on every store by evicting the least recently used entries (a
# load marks an entry used), and `prune` and `clear`, safe with other processes at work.

FIRST = "def f(x: f32[N]) -> f32:\n  return sum(x * x)\n"
SECOND = "def f(x: f32[N]) -> f32:\n  return max(exp(x))\n"


def run_source(source: str) -> float:
    import dsl
    return float(dsl.loads(source, device="cpu").f(np.arange(5, dtype=np.float32)))


def paths(found: list[cache.Entry]) -> set[Path]:
    return {e.path for e in found}


def age(path: Path, seconds: int) -> None:
    """Mark path last used at this many seconds past the epoch (a time long gone)."""
    os.utime(path, ns=(seconds * 10**9, seconds * 10**9))


def test_prune_evicts_the_least_recently_used_entries_first(cache_dir, monkeypatch, tmp_path_factory):
    from backend.cpu import run_function

    def as_in_a_new_process_that_ran_others() -> None:
        # code linked by what this process ran before is not read again (the test passed or
        # failed by what ran before it); the run function is made once for all the process's
        # programs, and FIRST's second run does not load it: made under another folder
        as_in_a_new_process(monkeypatch)
        with monkeypatch.context() as elsewhere:
            elsewhere.setenv("DSLC_CACHE_DIR", str(tmp_path_factory.mktemp("warm")))
            run_function()

    as_in_a_new_process_that_ran_others()
    run_source(FIRST)
    first = paths(cache.entries())
    run_source(SECOND)
    second = paths(cache.entries()) - first
    assert first and second
    for e in cache.entries():                   # the first program's entries are the older
        age(e.path, 1000 if e.path in first else 2000)
    as_in_a_new_process_that_ran_others()
    assert run_source(FIRST) == 30.0            # ... until it runs again, loading each of them
    removed, kept = cache.prune(sum(e.size for e in cache.entries() if e.path in first))
    assert (paths(removed), paths(kept)) == (second, first)
    assert paths(cache.entries()) == first
    monkeypatch.setattr("dsl.Program._lower", lambda *a: pytest.fail("lowered again"))
    assert run_source(FIRST) == 30.0


def hex_key(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def test_stores_keep_the_cache_under_its_cap_evicting_the_least_recently_used(cache_dir, monkeypatch):
    cap = 10 * (len(cache._head(hex_key(0))) + cache.HEADER.size + 1000)    # ten entries
    monkeypatch.setenv("DSLC_CACHE_MAX_SIZE", str(cap))
    keys = [hex_key(i) for i in range(30)]
    for i, k in enumerate(keys):
        cache.store(k, bytes(1000))
        age(cache._path(k, "o"), 1000 + i)
        found = cache.entries()
        assert sum(e.size for e in found) <= cap
        assert [e.path.stem for e in found] == keys[i + 1 - len(found): i + 1]
    assert len(found) >= 9                      # evicted no further than a tenth below the cap
    age(cache._path(keys[-9], "o"), 0)          # a survivor, now the least recently used ...
    assert cache.load(keys[-9]) == bytes(1000)  # ... used again
    cache.store(hex_key(100), bytes(2000))      # two entries' worth: three are evicted
    found = [e.path.stem for e in cache.entries()]
    assert found[:6] == keys[-6:] and set(found[6:]) == {keys[-9], hex_key(100)}   # (used now, both)


def test_a_real_compilation_stays_under_a_small_cap(cache_dir, monkeypatch):
    monkeypatch.setenv("DSLC_CACHE_MAX_SIZE", "8K")      # the two programs store about 12K
    assert (run_source(FIRST), run_source(SECOND)) == (30.0, pytest.approx(54.59815))
    assert 0 < sum(e.size for e in cache.entries()) <= 8 << 10


@pytest.mark.parametrize("text, size", [("1024", 1024), ("0", 0), ("500M", 500 << 20),
                                        ("2G", 2 << 30), ("2GiB", 2 << 30), ("3k", 3 << 10),
                                        (" 1T ", 1 << 40)])
def test_sizes_are_bytes_with_binary_units(text, size):
    assert cache.parse_size(text) == size


@pytest.mark.parametrize("text", ["abc", "-1", "1.5G", "2X", "2GB", "G", "9" * 30])
def test_a_bad_cap_in_the_environment_is_a_dsl_error_even_when_nothing_is_stored(
        cache_dir, monkeypatch, text):
    import dsl
    run_source(FIRST)                           # a warm cache: the next run only loads
    monkeypatch.setenv("DSLC_CACHE_MAX_SIZE", text)
    with pytest.raises(dsl.DslError) as e:
        run_source(FIRST)
    assert str(e.value) == (f"error: DSLC_CACHE_MAX_SIZE: expected a size such as 1024, 500M "
                            f"or 2G, got {text!r}")


def test_clear_removes_dslcs_entries_and_temporaries_only(cache_dir, tmp_path_factory):
    run_source(FIRST)
    stored = paths(cache.entries())
    outside = tmp_path_factory.mktemp("outside") / "precious"
    outside.write_text("keep")
    folder = next(iter(stored)).parent
    (folder / ".tmp-abc123").write_bytes(b"half an entry")
    foreign = [cache_dir / "notes.txt", folder / "README", folder / f"{'0' * 64}.txt",
               cache_dir / "zz" / f"zz{'0' * 62}.o", cache_dir / "ab" / f"cd{'0' * 62}.o"]
    for path in foreign:
        path.parent.mkdir(exist_ok=True)
        path.write_text("not dslc's")
    (cache_dir / "ab" / f"ab{'0' * 62}.o").symlink_to(outside)
    assert paths(cache.clear()) == stored
    assert cache.entries() == [] and not (folder / ".tmp-abc123").exists()
    assert all(p.read_text() == "not dslc's" for p in foreign) and outside.read_text() == "keep"
    assert sorted(p.name for p in cache_dir.iterdir()) == sorted(["ab", folder.name, "notes.txt", "zz"])
    assert run_source(FIRST) == 30.0 and paths(cache.entries()) == stored


PRUNE = """
import hashlib, os, sys, time
from pathlib import Path
from runtime import cache
role, go = sys.argv[1], Path(sys.argv[2])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.001)
if role == "prune":
    for _ in range(3):
        cache.prune(int(sys.argv[3]))
else:
    for _ in range(3):
        for i in range(int(sys.argv[3])):
            data = cache.load(hashlib.sha256(str(i).encode()).hexdigest())
            assert data in (None, str(i).encode() * 100), data
"""


def test_processes_pruning_and_loading_at_once_neither_fail_nor_read_half_an_entry(cache_dir):
    n = 2000
    for i in range(n):
        cache.store(hex_key(i), str(i).encode() * 100)
    half = sum(e.size for e in cache.entries()) // 2
    go = cache_dir / "go"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", PRUNE, *args], env=env, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for args in (["prune", str(go), str(half)], ["prune", str(go), str(half)],
                          ["load", str(go), str(n)])]
    assert [p.stdout.readline() for p in procs] == ["ready\n"] * 3
    go.touch()                                  # all three start at once
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    kept = cache.entries()                      # (how many: the reader's loads reorder them)
    assert sum(e.size for e in kept) <= half
    assert all(cache.load(e.path.stem) is not None for e in kept)
