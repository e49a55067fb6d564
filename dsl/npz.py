"""Reading .npz archives (NumPy's zip of .npy arrays) without trusting them, and what is
written to them.

Each member's .npy header is read and checked before its data: the dtype must be plain numbers
or strings (never objects, which would need pickle), the shape one NumPy can hold, the zip's
declared size of the member exactly the header plus the data it describes, and all the members
together at most MAX_BYTES. Only then is the data inflated, so a zip bomb or a header that
claims 10^12 elements costs nothing. Anything else is an NpzError naming the file and the fault.
"""
from __future__ import annotations

import errno
import math
import os
import stat
import struct
import tokenize
import zipfile
import zlib
from typing import BinaryIO

import numpy as np
from numpy.lib import format as npy

from frontend.diagnostics import DslError
from frontend.limits import MAX_RANK
from ir.ops.base import dtype_name

MAX_BYTES = 4 * 2 ** 30          # the arrays of one archive, inflated; more is refused unread
CHUNK = 2 ** 20                  # bytes inflated at a time
KINDS = "biufcUS"                # bool, integers, floats, complex, strings: nothing that pickles
ENCRYPTED_OR_PATCHED = 0x1 | 0x20 | 0x40      # zip flag bits that zipfile cannot read past
# what a damaged zip or .npy raises from the standard library while it is read
# (NumPy tokenizes a header that does not parse, as one written by Python 2 might not)
DAMAGE = (zipfile.BadZipFile, zlib.error, EOFError, ValueError, struct.error, OverflowError,
          NotImplementedError, OSError, tokenize.TokenError)


class NpzError(DslError):
    """An archive that cannot be read: `problem` says why, the message also names the file."""

    def __init__(self, path: str, problem: str):
        super().__init__(None, f"{path}: {problem}")
        self.path, self.problem = path, problem


def storable(a: np.ndarray) -> np.ndarray:
    """a as an .npz member holds it: bf16, which .npy has no name for, widened exactly to float32."""
    return a.astype(np.float32) if dtype_name(a.dtype) == "bf16" else a


def fits_numpy(shape: tuple[int, ...], itemsize: int) -> bool:
    """Whether NumPy can make an array of this shape: at most 64 axes, and its nonzero sizes'
    product in bytes below 2**63 (NumPy checks that even when another axis is 0)."""
    return len(shape) <= MAX_RANK and math.prod(max(d, 1) for d in shape) * max(itemsize, 1) < 2 ** 63


def open_regular(path: str) -> BinaryIO:
    """The file at path, opened for reading, if it is a regular file: a FIFO would block until
    a writer came, and a device has no end (a directory is refused by open itself)."""
    f = open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NONBLOCK))
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        f.close()
        raise OSError(errno.EINVAL, "not a regular file")
    return f


def read(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every array of the archive, by name (the member's name less '.npy'), in its order."""
    path = os.fspath(path)
    try:
        f = open_regular(path)
    except OSError as e:
        raise NpzError(path, f"cannot read the file: {e.strerror or e}") from None
    with f:
        try:
            if not zipfile.is_zipfile(f):
                raise NpzError(path, "not an .npz archive (a zip of .npy arrays)")
            with zipfile.ZipFile(f) as z:
                return _members(path, z)
        except DAMAGE as e:
            raise NpzError(path, f"not a readable zip archive: {e or type(e).__name__}") from None


def _members(path: str, z: zipfile.ZipFile) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    budget = MAX_BYTES
    for info in z.infolist():
        name = info.filename.removesuffix(".npy")
        if name in out:
            raise NpzError(path, f"the archive has two members named '{info.filename}'")
        try:
            out[name], nbytes = _member(path, z, info, budget)
        except DAMAGE as e:
            raise NpzError(path, f"member '{info.filename}' is damaged: {e or type(e).__name__}") from None
        budget -= nbytes
    return out


def _member(path: str, z: zipfile.ZipFile, info: zipfile.ZipInfo, budget: int) -> tuple[np.ndarray, int]:
    """One member's array and its size in bytes, its header checked before its data is read."""
    def fail(problem: str):
        raise NpzError(path, f"member '{info.filename}' {problem}")

    if not info.filename.endswith(".npy"):
        fail("is not an .npy array (its name does not end in .npy)")
    if info.flag_bits & ENCRYPTED_OR_PATCHED:
        fail("is encrypted or patched (zip features that an .npz does not use)")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        fail(f"uses zip compression method {info.compress_type}: only stored and deflated "
             "members are read")
    with z.open(info) as fp:
        if fp.read(6) != npy.MAGIC_PREFIX:
            fail("is not an .npy array (it does not start with NumPy's magic string)")
        version = tuple(fp.read(2))
        if version not in ((1, 0), (2, 0)):
            fail(f"is in .npy format version {version}: only versions 1.0 and 2.0 are read")
        header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
        shape, fortran, dtype = header(fp)
        nbytes = _check(fail, shape, dtype, info.file_size - fp.tell(), budget)
        a = np.empty(shape[::-1] if fortran else shape, dtype)
        got = _fill(fp, a)
    if got != nbytes:
        fail(f"ends after {got} of its {nbytes} bytes")
    return (a.T if fortran else a), nbytes


def _fill(fp, a: np.ndarray) -> int:
    """Read a's bytes from fp in chunks, so that reading costs no copy of the whole array;
    returns how many bytes there were."""
    view, got = memoryview(a.reshape(-1).view(np.uint8)), 0
    while got < len(view):
        n = fp.readinto(view[got:got + CHUNK])
        if not n:
            break
        got += n
    return got


def _check(fail, shape: tuple, dtype: np.dtype, stored: int, budget: int) -> int:
    """The size in bytes of the data that the header describes, refused unless it is plain
    numbers, NumPy can hold it, the zip stores exactly that many bytes and the budget has room."""
    if dtype == np.dtype("V2"):             # what np.save writes for ml_dtypes' bfloat16
        fail("has dtype |V2, raw 2-byte values: what NumPy writes for a bf16 array, as .npy has no "
             "name for bf16; save it as float32 (exactly: a.astype(np.float32)) and cast it to "
             "bf16 in the program, or pass it from Python")
    if dtype.kind not in KINDS or dtype.fields is not None or dtype.subdtype is not None:
        fail(f"has dtype {dtype}: only numbers and strings are read (never objects, which "
             "would need pickle)")
    if dtype.itemsize == 0:
        fail(f"has dtype {dtype}, of size 0")
    if any(type(d) is not int or d < 0 for d in shape) or not fits_numpy(shape, dtype.itemsize):
        fail(f"has shape {shape}: not the shape of an array NumPy can hold")
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > budget:
        fail(f"is {dtype}{list(shape)}, {nbytes} bytes: more than the {MAX_BYTES} bytes "
             "an archive may hold (dsl.npz.MAX_BYTES)")
    if stored != nbytes:
        fail(f"is {dtype}{list(shape)}, {nbytes} bytes, but the zip stores {stored} bytes "
             "after its header")
    return nbytes
