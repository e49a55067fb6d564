"""The files dslc reads from users, as a user relies on them: a malformed .safetensors header
or a damaged, hostile or oversized .npz archive is a diagnostic naming the file and the fault
(SafetensorsError, NpzError: both DslErrors), never a traceback, a hang or a huge allocation."""
from __future__ import annotations

import json
import os
import re
import resource
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from numpy.lib import format as npy
from safetensors.numpy import save_file as save_numpy

import dsl.safetensors
from conftest import isolated
from dsl import npz
from dsl.safetensors import SafetensorsError, read as read_safetensors
from frontend.diagnostics import DslError


# ---------------------------------------------------------------- safetensors headers

def safetensors_file(path: Path, header: bytes, data: bytes = b"") -> Path:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def entry(dtype=json.dumps("F32"), shape="[1]", offsets="[0, 4]") -> bytes:
    """A one-tensor header with its fields spelled as raw JSON, so that any of them can be wrong."""
    return f'{{"a": {{"dtype": {dtype}, "shape": {shape}, "data_offsets": {offsets}}}}}'.encode()


MALFORMED = [
    (entry(dtype='["F32"]'), r"tensor 'a' has dtype \['F32'\]: not a dtype"),
    (entry(dtype='{"F32": 1}'), r"tensor 'a' has dtype \{'F32': 1\}: not a dtype"),
    (b"[" * 100_000 + b"]" * 100_000, r"the header nests its JSON too deeply"),
    (entry(shape="[" + "9" * 5000 + "]"), r"the header is not valid JSON: .*4300 digits"),
    (entry(shape=f"[{2 ** 63}]"), r"shape \[9223372036854775808\]: more than NumPy can hold"),
    (entry(shape=f"[0, {2 ** 63}]", offsets="[0, 0]"), r"more than NumPy can hold"),
    (entry(shape="[" + ", ".join(["1"] * 65) + "]"), r"more than NumPy can hold \(at most 64 axes"),
    (entry(offsets="[-4, 0]"), r"data_offsets \[-4, 0\]: expected \[begin, end\]"),
    (entry(offsets="[0.0, 4.0]"), r"data_offsets \[0.0, 4.0\]: expected \[begin, end\]"),
    (entry(offsets="[false, true]"), r"data_offsets \[False, True\]: expected \[begin, end\]"),
    (entry(offsets=f"[0, {2 ** 64}]"), r"expected \[begin, end\] with 0 <= begin <= end < 2\*\*64"),
    (entry(shape='["1"]'), r"shape \['1'\]: expected a list of non-negative integers"),
    (b'{1: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', r"the header is not valid JSON"),
    (b'{"a": {"dtype": "F32", "dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
     r"the header names 'dtype' twice"),
    (b'{"\xff": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', r"the header is not valid JSON"),
    (entry(dtype=json.dumps("x" * 10 ** 6)), r"has dtype 'x{20,}\.\.\.x+': not a dtype"),
    (entry(dtype='"BOOL"', shape="[4]"), r"tensor 'a' is BOOL but holds the byte 7 \(a bool is 0 or 1\)"),
]


@pytest.mark.parametrize("header, fault", MALFORMED)
def test_a_malformed_header_is_a_safetensors_error(tmp_path, header, fault):
    path = safetensors_file(tmp_path / "bad.safetensors", header, bytes([0, 1, 7, 1]))
    with pytest.raises(SafetensorsError, match=fault) as e:
        read_safetensors(path)
    assert str(e.value).startswith(f"error: {path}: ") and len(str(e.value)) < 500


def read_within_a_gib(path: Path) -> str:
    """read_safetensors(path)'s error message, with 1 GiB more address space than the process has."""
    size = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (size + 2 ** 30, resource.getrlimit(resource.RLIMIT_AS)[1]))
    try:
        read_safetensors(path)
    except SafetensorsError as e:
        return str(e)
    return "read"


def test_no_malformed_header_crashes_hangs_or_allocates(tmp_path):
    """Each malformed case in a child process: a SafetensorsError, never a signal, a hang or a
    MemoryError (the safetensors package never sees a header that fails the checks)."""
    paths = {safetensors_file(tmp_path / f"{i}.safetensors", header, bytes([0, 1, 7, 1])): fault
             for i, (header, fault) in enumerate(MALFORMED)}
    ended = {path: (outcome, value) for path, outcome, value in isolated(read_within_a_gib, paths, 60.0, jobs=2)}
    for path, fault in paths.items():
        outcome, value = ended[path]
        assert outcome == "ok" and re.search(fault, value), (path, outcome, value)


def test_a_file_cut_after_its_header_was_checked(tmp_path, monkeypatch):
    """What the package refuses is a SafetensorsError too: here a file another process cuts
    between the header's check and the package's reading."""
    path = tmp_path / "w.safetensors"
    save_numpy({"w": np.arange(4, dtype=np.float32)}, str(path))
    package_open = dsl.safetensors.safe_open

    def cut_then_open(filename, **kw):
        Path(filename).write_bytes(Path(filename).read_bytes()[:-4])
        return package_open(filename, **kw)

    monkeypatch.setattr(dsl.safetensors, "safe_open", cut_then_open)
    with pytest.raises(SafetensorsError, match=r"w.safetensors: cannot read the file: Error while deserializing "
                                               r"header: incomplete metadata, file not fully covered"):
        read_safetensors(path)


@pytest.mark.parametrize("make, fault", [
    (lambda p: os.mkfifo(p), "not a regular file"),
    (lambda p: p.mkdir(), "Is a directory"),
])
def test_a_path_without_contents_is_refused_at_once(tmp_path, make, fault):
    make(tmp_path / "w.safetensors")
    with pytest.raises(SafetensorsError, match=f"w.safetensors: cannot read the file: {fault}"):
        read_safetensors(tmp_path / "w.safetensors")


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                    max_leaves=12)
FIELD = st.one_of(JSON, st.sampled_from(["F32", "I64", "BF16", "U8", "F64"]),
                  st.lists(st.integers(-2, 2 ** 64), max_size=3))
ENTRY = st.fixed_dictionaries({"dtype": FIELD, "shape": FIELD, "data_offsets": FIELD}) | JSON
HEADER = st.dictionaries(st.text(max_size=6), ENTRY, max_size=3) | JSON


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=HEADER, data=st.binary(max_size=24), cut=st.integers(0, 8))
def test_fuzzed_headers_are_read_or_refused(tmp_path, header, data, cut):
    text = json.dumps(header).encode()
    path = safetensors_file(tmp_path / "fuzz.safetensors", text[:len(text) - cut], data)
    try:
        read_safetensors(path)
    except SafetensorsError:
        pass


# ---------------------------------------------------------------- npz archives

def npy_member(z: zipfile.ZipFile, name: str, header: dict, data: bytes | None = None) -> None:
    """An .npy member with any header: its data the header's size in zeros unless given."""
    with z.open(name, "w", force_zip64=True) as w:
        npy.write_array_header_1_0(w, header)
        w.write(data if data is not None else bytes(
            int(np.prod(header["shape"])) * np.dtype(header["descr"]).itemsize))


def raw_npy(header: str) -> bytes:
    """An .npy version 1.0 member's bytes with any header text, and no data."""
    text = header.encode("latin1") + b"\n"
    return npy.MAGIC_PREFIX + b"\x01\x00" + struct.pack("<H", len(text)) + text


def archive(path: Path, build) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        build(z)
    return path


F32 = {"descr": "<f4", "fortran_order": False, "shape": (2, 3)}


def test_an_archive_reads_like_np_load(tmp_path):
    arrays = {"p.W": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.int64(7),
              "name": np.str_("xor.bend"), "f": np.asfortranarray(np.arange(6.0).reshape(3, 2)),
              "big": np.arange(4, dtype=">i4"), "empty": np.zeros((0, 5), np.float16)}
    for save in (np.savez, np.savez_compressed):
        save(tmp_path / "a.npz", **arrays)
        got = npz.read(tmp_path / "a.npz")
        assert list(got) == list(arrays)
        for k, a in arrays.items():
            assert got[k].dtype == np.asarray(a).dtype and np.array_equal(got[k], a), k
        assert got["p.W"].flags.writeable


@pytest.mark.parametrize("build, fault", [
    (lambda z: z.writestr("x.txt", "1 2 3\n"), r"member 'x.txt' is not an .npy array \(its name"),
    (lambda z: z.writestr("x.npy", "1 2 3\n"), r"member 'x.npy' is not an .npy array \(it does not start"),
    (lambda z: npy_member(z, "x.npy", {"descr": "<f4", "fortran_order": False, "shape": (10 ** 12,)}, b""),
     r"member 'x.npy' is float32\[1000000000000\], 4000000000000 bytes: more than the 4294967296 bytes"),
    (lambda z: npy_member(z, "x.npy", {"descr": "|O", "fortran_order": False, "shape": (1,)}, b"\x80\x04N."),
     r"member 'x.npy' has dtype object: only numbers and strings"),
    (lambda z: z.writestr("x.npy", np.lib.format.MAGIC_PREFIX + b"\x01\x00" + b"\x10\x00{'descr': '<f4'}"),
     r"member 'x.npy' is damaged: "),
    (lambda z: npy_member(z, "x.npy", {"descr": [("a", "<f4")], "fortran_order": False, "shape": (1,)}),
     r"has dtype \[\('a', '<f4'\)\]: only numbers and strings"),
    (lambda z: npy_member(z, "x.npy", {"descr": "<f4", "fortran_order": False, "shape": (-1, 2)}, b""),
     r"has shape \(-1, 2\): not the shape of an array NumPy can hold"),
    (lambda z: npy_member(z, "x.npy", {"descr": "<f4", "fortran_order": False, "shape": (0, 2 ** 63)}, b""),
     r"has shape \(0, 9223372036854775808\): not the shape"),
    (lambda z: npy_member(z, "x.npy", {"descr": "<f4", "fortran_order": False, "shape": (1,) * 65}),
     r"not the shape of an array NumPy can hold"),
    (lambda z: z.writestr("x.npy", raw_npy("[[[{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}")),
     r"member 'x.npy' is damaged: "),
    (lambda z: z.writestr("x.npy", raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (%s,)}" % ("9" * 5000))),
     r"member 'x.npy' is damaged: "),
    (lambda z: npy_member(z, "x.npy", F32, bytes(25)),
     r"member 'x.npy' is float32\[2, 3\], 24 bytes, but the zip stores 25 bytes after its header"),
    (lambda z: npy_member(z, "x.npy", F32, bytes(23)), r"24 bytes, but the zip stores 23 bytes"),
    (lambda z: (npy_member(z, "x.npy", F32), npy_member(z, "x.npy", F32)),
     r"the archive has two members named 'x.npy'"),
])
@pytest.mark.filterwarnings("ignore:Duplicate name")
def test_a_hostile_member_is_refused_before_its_data(tmp_path, build, fault):
    path = archive(tmp_path / "bad.npz", build)
    with pytest.raises(npz.NpzError, match=fault) as e:
        npz.read(path)
    assert str(e.value).startswith(f"error: {path}: ")


def test_a_zip_bomb_is_refused_without_inflating_it(tmp_path, monkeypatch):
    # 256 MiB of zeros deflate to about 1 MB; the bound is lowered to keep the test fast
    n = 2 ** 28
    with zipfile.ZipFile(tmp_path / "bomb.npz", "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        with z.open("x.npy", "w", force_zip64=True) as w:
            npy.write_array_header_1_0(w, {"descr": "|u1", "fortran_order": False, "shape": (n,)})
            for _ in range(n // 2 ** 22):
                w.write(bytes(2 ** 22))
    assert (tmp_path / "bomb.npz").stat().st_size < n // 100
    monkeypatch.setattr(npz, "MAX_BYTES", 2 ** 26)
    t0 = time.perf_counter()
    with pytest.raises(npz.NpzError, match=r"uint8\[268435456\], 268435456 bytes: more than the 67108864"):
        npz.read(tmp_path / "bomb.npz")
    assert time.perf_counter() - t0 < 0.5            # refused from its header, not inflated


def test_the_bound_is_for_the_whole_archive(tmp_path, monkeypatch):
    monkeypatch.setattr(npz, "MAX_BYTES", 40)
    np.savez(tmp_path / "two.npz", a=np.zeros(6, np.float32), b=np.zeros(6, np.float32))
    with pytest.raises(npz.NpzError, match=r"member 'b.npy' is float32\[6\], 24 bytes: more than the 40"):
        npz.read(tmp_path / "two.npz")


def test_damaged_archives_are_npz_errors(tmp_path):
    """Every truncation and many bit flips of a small archive: read whole, or an NpzError."""
    np.savez_compressed(tmp_path / "a.npz", w=np.arange(12, dtype=np.float32), s=np.str_("hi"))
    raw = (tmp_path / "a.npz").read_bytes()
    rng = np.random.default_rng(0)
    damaged = [raw[:n] for n in range(0, len(raw), 3)]
    for _ in range(300):
        b = bytearray(raw)
        b[rng.integers(len(b))] ^= 1 << rng.integers(8)
        damaged.append(bytes(b))
    for i, b in enumerate(damaged):
        (tmp_path / "b.npz").write_bytes(b)
        try:
            npz.read(tmp_path / "b.npz")
        except npz.NpzError:
            pass


@pytest.mark.parametrize("make, fault", [
    (lambda p: p.write_bytes(b""), "not an .npz archive"),
    (lambda p: p.mkdir(), "cannot read the file: Is a directory"),
    (lambda p: os.mkfifo(p), "cannot read the file: not a regular file"),
    (lambda p: None, "cannot read the file: No such file or directory"),
])
def test_not_an_archive(tmp_path, make, fault):
    make(tmp_path / "x.npz")
    with pytest.raises(DslError, match=fault):
        npz.read(tmp_path / "x.npz")


# ---------------------------------------------------------------- dslc run --inputs

MLP = Path(__file__).parent / "programs" / "mlp.bend"


@pytest.mark.parametrize("build, fault", [
    (lambda z: z.writestr("x.txt", "1 2 3\n"), "member 'x.txt' is not an .npy array"),
    (lambda z: npy_member(z, "x.npy", {"descr": "<f4", "fortran_order": False, "shape": (10 ** 12,)}, b""),
     "member 'x.npy' is float32[1000000000000], 4000000000000 bytes: more than the"),
])
def test_dslc_run_refuses_hostile_inputs(tmp_path, build, fault):
    inputs = archive(tmp_path / "in.npz", build)
    r = subprocess.run([sys.executable, "-m", "dsl", "run", str(MLP), "--entry", "loss", "--inputs", str(inputs)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert f"cannot read inputs from {inputs}: {fault}" in r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
