"""The on-disk compile cache: object code, and the pickled products of the stages before it
(syntax trees, lowered IR, kernel plans), stored under a key that covers everything they depend on (the
source, the code that made them, the target CPU and its features, the versions of dslc,
llvmlite and LLVM). `~/.cache/dslc`, or $DSLC_CACHE_DIR. Writes are atomic; an entry whose
header or checksum does not match is ignored and rebuilt, never executed or unpickled."""
from __future__ import annotations

import functools
import gc
import hashlib
import os
import pickle
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable

MAGIC = b"dslc-object-v1\n"
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


def load(k: str, kind: str = "o") -> bytes | None:
    """The bytes stored under k, or None when absent or not exactly what was stored."""
    try:
        blob = _path(k, kind).read_bytes()
    except OSError:
        return None
    head = MAGIC + k.encode() + b"\n"
    if not blob.startswith(head) or len(blob) < len(head) + 32:
        return None
    digest, data = blob[len(head):len(head) + 32], blob[len(head) + 32:]
    return data if hashlib.sha256(data).digest() == digest else None


def store(k: str, data: bytes, kind: str = "o") -> None:
    """Store atomically (a reader sees the old entry or the new one, never half of one);
    a cache that cannot be written is not an error."""
    path = _path(k, kind)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + k.encode() + b"\n" + hashlib.sha256(data).digest() + data)
        os.replace(tmp, path)
    except OSError:
        pass


def load_pickled(k: str) -> Any | None:
    """The Python value stored under k by store_pickled, or None. Unpickled with the cycle
    collector paused: the many objects it makes are all alive, and collections triggered by
    their number would each walk the whole heap."""
    data = load(k, "pkl")
    if data is None:
        return None
    collecting = gc.isenabled()
    gc.disable()
    try:
        return pickle.loads(data)
    finally:
        if collecting:
            gc.enable()


def store_pickled(k: str, value: Any) -> None:
    store(k, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), "pkl")


def pickled(k: str, make: Callable[[], Any]) -> Any:
    """The value stored under k, or make()'s, stored there for next time."""
    value = load_pickled(k)
    if value is None:
        value = make()
        store_pickled(k, value)
    return value
