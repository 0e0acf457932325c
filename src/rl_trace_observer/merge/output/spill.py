"""Big job outputs travel through a file beside the output, not through the worker's pipe.

Why: an uncompressed ``.json`` (or ``.pftrace``) job returns tens of MB. Through the pool's pipe each
byte is copied five times — pickled, written to the pipe, read, unpickled, written to the output —
and the parent holds a few jobs' worth while it keeps the output in order: for a 2 GB ``.json`` that
was 7 s of the parent's CPU and 360 MB of its memory (and, for ``.json.gz``, a few ms per job that the
worker waited on the parent). Instead a worker appends its pieces to a hidden part file in the
output's folder and returns a :class:`Spilled` note; the parent copies the part into the output inside
the kernel (``copy_file_range``) and deletes it.

Part files are named ``.<output name>.<owner>.part<job>`` (:mod:`.owned`: the merge process, so the
next merge can prove a killed one's parts stale): hidden (the merger never reads hidden files back as
inputs) and removed on success, and by :func:`remove_parts` when a merge fails.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import owned

_COPY_BLOCK = 16 << 20


@dataclass(frozen=True)
class Spilled:
    """``size`` bytes of output waiting in the part file ``path``; for ``.json.gz``, deflate pieces
    one after another, with each piece's (crc32, uncompressed length) in ``deflated``."""

    path: str
    size: int
    deflated: tuple[tuple[int, int], ...] = ()


def part_path(out: Path, sequence: int) -> str:
    return str(owned.temp_path(out, f"part{sequence}"))


def append(path: str, pieces: list[Any], first: bool, deflated: list[tuple[int, int]]) -> int:
    """Worker side: pieces onto the part file (a new one when ``first``); the bytes written. A deflate
    piece ``(bytes, crc32, length)`` adds its crc32 and length to ``deflated``."""
    size = 0
    with open(path, "wb" if first else "ab") as f:
        for piece in pieces:
            if isinstance(piece, tuple):
                size += f.write(piece[0])
                deflated.append((piece[1], piece[2]))
            else:
                size += f.write(piece)
    return size


def copy_into(f: Any, piece: Spilled) -> int:
    """Parent side: the part's bytes at the end of the binary file ``f``, then the part is deleted."""
    f.flush()  # the kernel copy writes at the file descriptor's offset: the buffer goes first
    dst = f.fileno()
    src = os.open(piece.path, os.O_RDONLY)
    try:
        left = piece.size
        kernel = hasattr(os, "copy_file_range")
        while left > 0:
            done = 0
            if kernel:
                try:
                    done = os.copy_file_range(src, dst, min(left, 1 << 30))
                except OSError:  # another file system, an old kernel: copy through user space
                    kernel = False
            if not kernel:
                done = _user_copy(src, dst, min(left, _COPY_BLOCK))
            if done <= 0:
                raise OSError(f"{piece.path}: ended {left} bytes early")
            left -= done
    finally:
        os.close(src)
        os.unlink(piece.path)
    noted = getattr(f, "note_written", None)
    if noted is not None:
        noted(piece.size)
    return piece.size


def _user_copy(src: int, dst: int, size: int) -> int:
    block = os.read(src, size)
    view = memoryview(block)
    while view:
        view = view[os.write(dst, view) :]
    return len(block)


def remove_parts(out: Path) -> None:
    """After a failed merge: the part files this process's workers left."""
    for part in out.parent.glob(f".{out.name}.{owned.owner()}.part*"):
        try:
            part.unlink()
        except OSError:
            pass
