"""Atomic file replacement: readers (the merger, a collector copying mid-run) never see half a file."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, data: bytes, *, durable: bool = False) -> None:
    """Write ``data`` to a hidden temp file beside ``path``, then rename it over ``path``.

    The rename alone protects readers and survives a killed process (the page cache is kept);
    ``durable`` adds an fsync for outputs that must also survive a machine crash. Training-side
    process records skip it: an fsync can take milliseconds on a busy disk.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
