"""The on-disk compile cache: object code stored under a key that covers everything it
depends on (the LLVM IR, the target CPU and its features, the versions of dslc, llvmlite and
LLVM). `~/.cache/dslc`, or $DSLC_CACHE_DIR. Writes are atomic; an entry whose header or
checksum does not match is ignored and rebuilt, never executed."""
from __future__ import annotations

import hashlib
import os
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

MAGIC = b"dslc-object-v1\n"


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


def _path(k: str) -> Path:
    return cache_dir() / k[:2] / f"{k}.o"


def load(k: str) -> bytes | None:
    """The object code stored under k, or None when absent or not exactly what was stored."""
    try:
        blob = _path(k).read_bytes()
    except OSError:
        return None
    head = MAGIC + k.encode() + b"\n"
    if not blob.startswith(head) or len(blob) < len(head) + 32:
        return None
    digest, data = blob[len(head):len(head) + 32], blob[len(head) + 32:]
    return data if hashlib.sha256(data).digest() == digest else None


def store(k: str, data: bytes) -> None:
    """Store atomically (a reader sees the old entry or the new one, never half of one);
    a cache that cannot be written is not an error."""
    path = _path(k)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + k.encode() + b"\n" + hashlib.sha256(data).digest() + data)
        os.replace(tmp, path)
    except OSError:
        pass
