"""Atomic file replacement: readers (the merger, a collector copying mid-run) never see half a file."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def temp_path(path: Path) -> Path:
    """The hidden temp file beside ``path`` (collectors and the merger skip ``.<name>.<pid>.tmp``)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _discard(tmp: Path) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass


def write_atomic(path: Path, data: bytes, *, durable: bool = False) -> None:
    """Write ``data`` to a hidden temp file beside ``path``, then rename it over ``path``.

    The rename alone protects readers and survives a killed process (the page cache is kept);
    ``durable`` adds an fsync for outputs that must also survive a machine crash. Training-side
    process records skip it: an fsync can take milliseconds on a busy disk.
    """
    tmp = temp_path(path)
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
        _discard(tmp)
        raise


@contextmanager
def atomic_output(path: Path) -> Iterator[BinaryIO]:
    """A large output streamed into :func:`temp_path`, fsync'ed and renamed over ``path`` when the block
    ends normally; on any exception the temp file is removed and ``path`` is left as it was."""
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _discard(tmp)
        raise
