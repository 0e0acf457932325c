"""An output file that goes to disk while the merge runs, instead of all at once at the end.

Why: the merged output is fsync'ed before its atomic rename, so a crash never leaves a half-written
file under the output's name. Left to the kernel, a 2 GB ``.json`` was still mostly in the page cache
when the merge finished, and that one fsync took 2.2 s on its own. Every ``KICK_BYTES`` this wrapper
asks the kernel to start writing back what was written since the last time, and to drop the pages it
has already written (the merger never reads them back): the disk works while the CPUs do, and the final
fsync has little left to do. Where ``posix_fadvise`` is missing it is a plain file.
"""

from __future__ import annotations

import os
from typing import BinaryIO

KICK_BYTES = 64 << 20
_ADVISE = getattr(os, "posix_fadvise", None)
_DONTNEED = getattr(os, "POSIX_FADV_DONTNEED", 0)


class WritebackFile:
    """Wraps a binary file opened for writing: ``write``, ``flush`` and ``fileno`` pass through."""

    def __init__(self, f: BinaryIO, kick_bytes: int = KICK_BYTES) -> None:
        self._f = f
        self._kick_bytes = kick_bytes
        self._written = 0
        self._kicked = 0  # bytes handed to the kernel for writeback
        self._dropped = 0  # bytes whose (written) pages were let go

    def write(self, data: bytes | bytearray | memoryview) -> int:
        n = self._f.write(data)
        self._written += n
        if _ADVISE is not None and self._written - self._kicked >= self._kick_bytes:
            self._kick()
        return n

    def _kick(self) -> None:
        self._f.flush()
        fd = self._f.fileno()
        try:
            # DONTNEED starts writeback of the dirty pages in the range and drops the clean ones
            assert _ADVISE is not None
            if self._kicked > self._dropped:  # (a length of 0 would mean "to the end of the file")
                _ADVISE(fd, self._dropped, self._kicked - self._dropped, _DONTNEED)  # written by now
            _ADVISE(fd, self._kicked, self._written - self._kicked, _DONTNEED)  # start writing these
        except OSError:  # advice is optional: some filesystems refuse it
            pass
        self._dropped, self._kicked = self._kicked, self._written

    def note_written(self, n: int) -> None:
        """``n`` bytes were written to :meth:`fileno` directly (a kernel copy, :mod:`.spill`)."""
        self._written += n
        if _ADVISE is not None and self._written - self._kicked >= self._kick_bytes:
            self._kick()

    def flush(self) -> None:
        self._f.flush()

    def fileno(self) -> int:
        return self._f.fileno()
