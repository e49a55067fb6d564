"""Files written whole or not at all: a reader never sees half a checkpoint or half a plot."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replacing(path: Path) -> Iterator[str]:
    """A temporary file beside path for the block to write; synced and renamed over path when
    the block ends, removed when it fails (a full disk, a vanished directory, Ctrl-C)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)        # fsync syncs the file, whichever descriptor
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
