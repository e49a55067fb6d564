"""The on-disk compile cache: object code, and the products of the stages before it (syntax
trees, lowered IR, kernel plans) as plain data (runtime/codec.py), stored under a key that
covers everything they depend on (the source, the code that made them, the target CPU and its
features, the versions of dslc, llvmlite and LLVM). `~/.cache/dslc`, or $DSLC_CACHE_DIR.
Writes are atomic. An entry is read only from a regular file of this user's, in folders no one
else can write, and only when its header and checksum match; anything else is a miss, rebuilt."""
from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import os
import stat
import struct
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable

from runtime import codec

MAGIC = b"dslc-entry-v2\n"
HEADER = struct.Struct("<Q32s")     # after MAGIC and the key: the data's length and its sha256
MAX_ENTRY = 1 << 28                 # bytes of data (256 MiB); an entry that says more is not ours
ROOT = Path(__file__).resolve().parents[1]


def versions() -> str:
    import llvmlite
    import llvmlite.binding as llvm
    try:
        dslc = version("dslc")
    except PackageNotFoundError:
        dslc = "source"
    return f"dslc {dslc}; llvmlite {llvmlite.__version__}; llvm {llvm.llvm_version_info}"


def cache_dir() -> Path:
    return Path(os.environ.get("DSLC_CACHE_DIR") or Path.home() / ".cache" / "dslc")


def key(*parts: str) -> str:
    h = hashlib.sha256()
    for p in (versions(), *parts):
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


@functools.cache
def code_digest(*folders: str) -> str:
    """A digest of the Python and .bend sources under these folders of dslc: what they make
    must not be reused once they change."""
    h = hashlib.sha256()
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".bend"):
                h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _path(k: str, kind: str) -> Path:
    return cache_dir() / k[:2] / f"{k}.{kind}"


def _head(k: str) -> bytes:
    return MAGIC + k.encode() + b"\n"


def load(k: str, kind: str = "o") -> bytes | None:
    """The bytes stored under k, or None when absent or not exactly what was stored."""
    path = _path(k, kind)
    if not _trusted(path.parent):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _read_entry(fd, _head(k))
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_entry(fd: int, head: bytes) -> bytes | None:
    """The data of the entry open at fd, reading no more than its header says: a FIFO, a device
    or a file of another user's is not an entry, nor is one that is longer or shorter."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        return None
    prefix = _read_exactly(fd, len(head) + HEADER.size)
    if prefix is None or not prefix.startswith(head):
        return None
    size, digest = HEADER.unpack_from(prefix, len(head))
    if size > MAX_ENTRY or len(prefix) + size != st.st_size:
        return None
    data = _read_exactly(fd, size)
    return data if data is not None and hashlib.sha256(data).digest() == digest else None


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def store(k: str, data: bytes, kind: str = "o") -> None:
    """Store atomically (a reader sees the old entry or the new one, never half of one);
    a cache that cannot be written is not an error, and leaves no temporary file behind."""
    path = _path(k, kind)
    tmp = None
    try:
        cache_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
        path.parent.mkdir(mode=0o700, exist_ok=True)
        if not _trusted(path.parent):
            return
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(_head(k) + HEADER.pack(len(data), hashlib.sha256(data).digest()) + data)
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


_warned = False


def _trusted(folder: Path) -> bool:
    """Whether the cache folder and this folder of it are directories of this user's that no
    one else can write: an entry another user planted could carry hostile object code."""
    global _warned
    for d in (cache_dir(), folder):
        try:
            st = os.stat(d)
        except OSError:
            return False
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022:
            continue
        if not _warned:
            _warned = True
            print(f"dslc: not using the compile cache in {d}: it is not a folder of this user's "
                  f"that only this user can write (see chmod go-w, or set DSLC_CACHE_DIR)",
                  file=sys.stderr)
        return False
    return True


def load_value(k: str) -> Any | None:
    """The value stored under k by store_value, or None. Decoded with the cycle collector
    paused: the many objects it makes are all alive, and collections triggered by their number
    would each walk the whole heap."""
    data = load(k, "val")
    if data is None:
        return None
    collecting = gc.isenabled()
    gc.disable()
    try:
        return codec.decode(data)
    except codec.DecodeError:
        return None
    finally:
        if collecting:
            gc.enable()


def store_value(k: str, value: Any) -> None:
    """Store value under k, unless it holds a type the codec does not write (then it is made
    again next time)."""
    try:
        data = codec.encode(value)
    except codec.EncodeError:
        return
    store(k, data, "val")


def memo(k: str, make: Callable[[], Any]) -> Any:
    """The value stored under k, or make()'s, stored there for next time."""
    value = load_value(k)
    if value is None:
        value = make()
        store_value(k, value)
    return value
