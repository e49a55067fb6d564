"""The on-disk compile cache: object code, and the products of the stages before it (syntax
trees, lowered IR, kernel plans) as plain data (runtime/codec.py), stored under a key that
covers everything they depend on (the source, the code that made them, the target CPU and its
features, the versions of dslc, llvmlite and LLVM). `~/.cache/dslc`, or $DSLC_CACHE_DIR.
Writes are atomic. An entry is read only from a regular file of this user's, in folders no one
else can write, and only when its header and checksum match; anything else is a miss, rebuilt.
The cache is kept under a cap ($DSLC_CACHE_MAX_SIZE) by evicting the least recently used
entries; a load marks an entry used by its mtime."""
from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import re
import stat
import struct
import sys
import tempfile
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable

from frontend import collector
from frontend.diagnostics import DslError
from runtime import codec

MAGIC = b"dslc-entry-v2\n"
HEADER = struct.Struct("<Q32s")     # after MAGIC and the key: the data's length and its sha256
MAX_ENTRY = 1 << 28                 # bytes of data (256 MiB); an entry that says more is not ours
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MAX_SIZE = 2 << 30          # bytes of entries (2 GiB); $DSLC_CACHE_MAX_SIZE overrides
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
SIZE = re.compile(r"(\d{1,20})(?:([KMGT])(?:iB)?)?", re.I)
FOLDER = re.compile(r"[0-9a-f]{2}")
ENTRY = re.compile(r"[0-9a-f]{64}\.(?:o|val|vmfb)") # what key() and store() name an entry
TEMPORARY = re.compile(r"\.tmp-[0-9a-z_]+")          # what store() names the file it writes


@functools.cache
def versions() -> str:
    """dslc's, llvmlite's and LLVM's versions (read once: dslc's from its metadata costs 5 ms,
    and a program's kernels each take a key)."""
    import llvmlite
    import llvmlite.binding as llvm
    try:
        dslc = version("dslc")
    except PackageNotFoundError:
        dslc = "source"
    return f"dslc {dslc}; llvmlite {llvmlite.__version__}; llvm {llvm.llvm_version_info}"


@functools.cache
def host() -> str:
    """This machine, as object code and what is planned for it depend on it: LLVM's target
    triple, CPU name and CPU features."""
    import llvmlite.binding as llvm
    return f"{llvm.get_default_triple()}; {llvm.get_host_cpu_name()}; {llvm.get_host_cpu_features().flatten()}"


def cache_dir() -> Path:
    return Path(os.environ.get("DSLC_CACHE_DIR") or Path.home() / ".cache" / "dslc")


def parse_size(text: str) -> int:
    """Bytes, from a size such as 1024, 500M or 2G (K, M, G and T are powers of 1024)."""
    m = SIZE.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"expected a size such as 1024, 500M or 2G, got {text!r}")
    return int(m[1]) * UNITS[(m[2] or "").upper()]


def max_size() -> int:
    """The cap on the bytes of the cache's entries: $DSLC_CACHE_MAX_SIZE, or 2 GiB."""
    text = os.environ.get("DSLC_CACHE_MAX_SIZE")
    if not text:
        return DEFAULT_MAX_SIZE
    try:
        return parse_size(text)
    except ValueError as e:
        raise DslError(None, f"DSLC_CACHE_MAX_SIZE: {e}") from None


def key(*parts: str) -> str:
    h = hashlib.sha256()
    for p in (versions(), *parts):
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


def code_digest(*folders: str) -> str:
    """A digest of the Python and .bend sources under these folders of dslc: what they make
    must not be reused once they change."""
    return hashlib.sha256("\0".join(map(_folder_digest, folders)).encode()).hexdigest()


@functools.cache
def _folder_digest(folder: str) -> str:
    """A folder's part of code_digest, read once a process (a warm load's keys name three sets
    of folders, most of them in more than one)."""
    h = hashlib.sha256()
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
    max_size()              # a bad $DSLC_CACHE_MAX_SIZE is reported before the work, not at a store
    path = _path(k, kind)
    if not _trusted(path.parent):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = _read_entry(fd, _head(k))
        if data is not None:                # used now: what eviction goes by (atime is often not kept)
            with contextlib.suppress(OSError):
                os.utime(fd)
        return data
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
    """Store atomically (a reader sees the old entry or the new one, never half of one), then
    keep the cache under its cap; a cache that cannot be written is not an error, and leaves no
    temporary file behind."""
    cap = max_size()
    path = _path(k, kind)
    tmp = None
    try:
        cache_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
        path.parent.mkdir(mode=0o700, exist_ok=True)
        if not _trusted(path.parent):
            return
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        entry = _head(k) + HEADER.pack(len(data), hashlib.sha256(data).digest()) + data
        with os.fdopen(fd, "wb") as f:
            f.write(entry)
        os.replace(tmp, path)
        tmp = None
        _keep_under(cap, len(entry))
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


def load_value(k: str, kind: type) -> Any | None:
    """The value of type `kind` stored under k by store_value; None where there is none, or
    one of another type. Decoded with the cycle collector paused: the many objects it makes
    are all alive, and collections triggered by their number would each walk the whole heap."""
    data = load(k, "val")
    if data is None:
        return None
    try:
        with collector.paused():
            value = codec.decode(data)
    except codec.DecodeError:
        return None
    return value if isinstance(value, kind) else None


def store_value(k: str, value: Any) -> None:
    """Store value under k, unless it holds a type the codec does not write (then it is made
    again next time)."""
    try:
        data = codec.encode(value)
    except codec.EncodeError:
        return
    store(k, data, "val")


def memo(k: str, make: Callable[[], Any], kind: type) -> Any:
    """The value of type `kind` stored under k, or make()'s, stored there for next time."""
    value = load_value(k, kind)
    if value is None:
        value = make()
        store_value(k, value)
    return value


# ---------------------------------------------------------------------------------------------
# Managing the cache: its entries, least recently used first, and their eviction. Several
# processes may list, load, store and evict at once: an entry that vanishes under one of them
# is a miss (or already evicted), never an error.

@dataclass(frozen=True)
class Entry:
    """An entry on disk: its size in bytes and when it was last stored or loaded (mtime, ns)."""
    path: Path
    size: int
    used: int


def entries() -> list[Entry]:
    """The cache's entries, least recently used first; none when the cache folder does not
    exist. Only regular files named as store() names them, in the folder it puts them in, are
    entries."""
    return sorted((Entry(path, st.st_size, st.st_mtime_ns) for path, st in _files(ENTRY)
                   if path.name[:2] == path.parent.name), key=lambda e: (e.used, e.path))


def _folders() -> list[str]:
    """The cache's entry folders (not links to folders); none when it does not exist."""
    try:
        with os.scandir(cache_dir()) as it:
            return [d.path for d in it if FOLDER.fullmatch(d.name) and d.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []


def _files(name: re.Pattern) -> list[tuple[Path, os.stat_result]]:
    """The regular files named `name` in the cache's entry folders (not following links)."""
    found = []
    for folder in _folders():
        with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(folder) as it:
            for f in it:
                if name.fullmatch(f.name):
                    with contextlib.suppress(FileNotFoundError):
                        st = f.stat(follow_symlinks=False)
                        if stat.S_ISREG(st.st_mode):
                            found.append((Path(f.path), st))
    return found


def prune(max_size: int, to: int | None = None) -> tuple[list[Entry], list[Entry]]:
    """(removed, kept): if the entries take more than max_size bytes, the least recently used
    are removed until the rest take no more than `to` (default: max_size)."""
    kept = entries()
    total = sum(e.size for e in kept)
    goal = max_size if to is None else to
    if total <= max_size:
        return [], kept
    n = 0
    while n < len(kept) and total > goal:
        _remove(kept[n].path)
        total -= kept[n].size
        n += 1
    return kept[:n], kept[n:]


def clear() -> list[Entry]:
    """Remove every entry, the temporary files of stores under way (those stores then store
    nothing) and the folders left empty; the removed entries. Other files are left alone."""
    removed = entries()
    for path, _ in _files(TEMPORARY):
        _remove(path)
    for e in removed:
        _remove(e.path)
    for folder in _folders():
        with contextlib.suppress(OSError):      # not empty: someone else's files, or a new entry
            os.rmdir(folder)
    return removed


def _remove(path: Path) -> None:
    """Unlink path within its folder, opened without following a link: a folder swapped for
    a link since it was listed leads nowhere. Already gone is not an error."""
    try:
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.unlink(path.name, dir_fd=fd)
        finally:
            os.close(fd)
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            raise


_sizes: dict[Path, int] = {}     # per cache folder: its bytes at this process's last count,
                                 # plus what this process has stored there since


def _keep_under(cap: int, stored: int) -> None:
    """After a store of `stored` bytes: the entries are counted at a process's first store and
    whenever its own stores since may have passed the cap; past it, eviction goes a tenth
    below, so that counting (a listing of the folder) stays rare."""
    root = cache_dir()
    size = _sizes.get(root)
    if size is not None and size + stored <= cap:
        _sizes[root] = size + stored
        return
    _, kept = prune(cap, to=cap - cap // 10)
    _sizes[root] = sum(e.size for e in kept)
