"""Reading safetensors files (Hugging Face's format for weights) into NumPy arrays, exactly.

A file is an 8-byte little-endian length N, then N bytes of JSON naming each tensor's dtype,
shape and [begin, end) byte offsets into the data that follows (plus an optional
"__metadata__" of strings), then the data: each tensor's elements, little-endian, row-major.
As the format's specification asks, the tensors must cover the data exactly, without
overlaps or holes. Anything else is a SafetensorsError naming the file and the fault.

The `safetensors` package reads the data, memory-mapped. The header is checked here first:
the package refuses a malformed header too, but its messages name neither the tensor nor the
value at fault, and it takes what dslc cannot (a tensor named twice, unknown fields, dtypes
dslc has not, a shape NumPy refuses with a ValueError of its own)."""
from __future__ import annotations

import json
import os
import reprlib
import struct

import numpy as np
from safetensors import SafetensorError, safe_open

from dsl.npz import fits_numpy, open_regular
from frontend.diagnostics import DslError
from frontend.limits import MAX_RANK
from ir.ops.base import dtype_name, np_dtype

# the dtypes read (dslc's), as little-endian NumPy dtypes; BF16 is read as its 16 bits
DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
          "U32": "<u4", "BOOL": "|b1"}
# what the format also has, named so that the error can say what was found
OTHER_DTYPES = {"U8", "I8", "U16", "I16", "U64", "C64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4",
                "F6_E2M3", "F6_E3M2"}
MAX_HEADER = 100_000_000        # bytes; the reference implementation's limit too
MAX_OFFSET = 2 ** 64            # offsets are u64 in the reference implementation
# how a value of the header appears in a message: a few elements, levels and digits of it
SHOW = reprlib.Repr()
SHOW.maxlevel, SHOW.maxlist, SHOW.maxdict, SHOW.maxstring, SHOW.maxlong, SHOW.maxother = 3, 8, 4, 60, 40, 60


class SafetensorsError(DslError):
    """A file that cannot be read as safetensors: the message names the file and the fault."""

    def __init__(self, path: str, problem: str):
        super().__init__(None, f"{path}: {problem}")
        self.path, self.problem = path, problem


def read(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of the file, by name, in the order of the data: BF16 as float32, the
    other dtypes as themselves (in native byte order)."""
    return read_with_metadata(path)[0]


def read_with_metadata(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The tensors of the file, as `read` gives them, and its "__metadata__"."""
    tensors, meta = read_exact(path)
    return {name: a.astype(np.float32) if dtype_name(a.dtype) == "bf16" else a for name, a in tensors.items()}, meta


def read_exact(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The tensors of the file with their own dtypes (BF16 as ml_dtypes' bfloat16, as dslc's
    bf16 values are), and its "__metadata__": what a checkpoint needs to resume to the bit."""
    path = os.fspath(path)
    try:
        with open_regular(path) as f:
            entries, meta, start = _header(path, f, os.fstat(f.fileno()).st_size)
            with safe_open(path, framework="np") as st:
                tensors = {name: _bf16(f, start + begin, end - begin, shape) if dtype == "BF16"
                           else st.get_tensor(name) for name, dtype, shape, begin, end in entries}
    except OSError as e:
        raise SafetensorsError(path, f"cannot read the file: {e.strerror or e}") from None
    except SafetensorError as e:            # the file changed after its header was checked
        raise SafetensorsError(path, f"cannot read the file: {e}") from None
    for name, a in tensors.items():         # NumPy takes any nonzero byte as a bool, unchecked
        if a.dtype == np.bool_ and a.size and a.view(np.uint8).max() > 1:
            raise SafetensorsError(path, f"tensor {SHOW.repr(name)} is BOOL but holds the byte "
                                         f"{a.view(np.uint8).max()} (a bool is 0 or 1)")
    return tensors, meta


def _header(path: str, f, size: int) -> tuple[list[tuple], dict[str, str], int]:
    """The checked entries (name, dtype, shape, begin, end) sorted by offset, the metadata, and
    where the data starts in the file."""
    def fail(problem: str):
        raise SafetensorsError(path, problem)

    if size < 8:
        fail(f"too short for a safetensors file ({size} bytes; the header length alone is 8)")
    (n,) = struct.unpack("<Q", f.read(8))
    if n > min(MAX_HEADER, size - 8):
        fail(f"the header is said to be {n} bytes long, but "
             + (f"only {size - 8} bytes follow (a truncated file?)" if n <= MAX_HEADER
                else f"a header may have at most {MAX_HEADER}"))
    try:
        header = json.loads(f.read(n).decode("utf-8"), object_pairs_hook=_unique_keys)
    except ValueError as e:         # not UTF-8, not JSON, or an integer of over 4300 digits
        fail(f"the header is not valid JSON: {e}")
    except RecursionError:
        fail("the header nests its JSON too deeply")
    except DuplicateKey as e:
        fail(f"the header names {SHOW.repr(e.args[0])} twice")
    if not isinstance(header, dict):
        fail(f"the header is a JSON {type(header).__name__}, not an object of tensors")
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        fail("'__metadata__' must map names to strings")
    data = size - 8 - n
    entries = [_entry(fail, name, info, data) for name, info in header.items()]
    entries.sort(key=lambda e: (e[3], e[4]))
    at, last = 0, None
    for name, _, _, begin, end in entries:
        if begin < at:
            fail(f"tensors '{last}' and '{name}' overlap (both use byte {begin} of the data)")
        if begin > at:
            fail(f"bytes {at} to {begin} of the data belong to no tensor")
        at, last = end, name
    if at != data:
        fail(f"the data has {data} bytes but its tensors cover {at}"
             + (" (trailing bytes)" if at < data else ""))
    return entries, meta, 8 + n


def _entry(fail, name: str, info, data: int) -> tuple:
    """One tensor's (name, dtype, shape, begin, end), checked against the data's size."""
    where = f"tensor {SHOW.repr(name)}"
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        fail(f"{where} must have exactly 'dtype', 'shape' and 'data_offsets'")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        known = isinstance(dtype, str) and dtype in OTHER_DTYPES
        what = "a dtype this reader does not support" if known else "not a dtype"
        fail(f"{where} has dtype {SHOW.repr(dtype)}: {what} (supported: {', '.join(DTYPES)})")
    itemsize = np.dtype(DTYPES[dtype]).itemsize
    if not isinstance(shape, list) or not all(_natural(d) for d in shape):
        fail(f"{where} has shape {SHOW.repr(shape)}: expected a list of non-negative integers")
    if not fits_numpy(shape, itemsize):
        fail(f"{where} has shape {SHOW.repr(shape)}: more than NumPy can hold (at most "
             f"{MAX_RANK} axes, and under 2**63 bytes)")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_natural(o) for o in offsets)
            and offsets[0] <= offsets[1] < MAX_OFFSET):
        fail(f"{where} has data_offsets {SHOW.repr(offsets)}: expected [begin, end] with "
             "0 <= begin <= end < 2**64")
    begin, end = offsets
    nbytes = int(np.prod(shape, dtype=object)) * itemsize
    if end - begin != nbytes:
        fail(f"{where} is {dtype}{shape} ({nbytes} bytes) but its data_offsets {offsets} "
             f"hold {end - begin} bytes")
    if end > data:
        fail(f"{where} ends at byte {end} of the data, which has only {data} bytes "
             "(a truncated file?)")
    return name, dtype, tuple(shape), begin, end


def _bf16(f, at: int, nbytes: int, shape: tuple[int, ...]) -> np.ndarray:
    """The bfloat16 tensor at byte `at` of f (read here, as the package's NumPy API has no
    bfloat16 to return)."""
    f.seek(at)
    return np.frombuffer(f.read(nbytes), "<u2").astype(np.uint16).view(np_dtype("bf16")).reshape(shape)


def _natural(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


class DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    out = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKey(k)
        out[k] = v
    return out
