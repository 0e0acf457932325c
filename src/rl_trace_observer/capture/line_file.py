"""One append-only file of whole lines: what the writer guarantees about every byte it leaves on disk.

- **Only whole lines, even when killed mid-write.** Batches are written in pieces a kill cannot cut
  inside a line (:func:`kill_safe_pieces`). A batch that the disk cannot take whole (``ENOSPC``
  midway, a short write) is cut back to its last complete line with ``ftruncate`` — shrinking a
  file needs no free space — so the next batch never glues onto a fragment. When even that fails,
  the descriptor is dropped and the next open repairs the tail the same way. Opening an existing
  file repairs its tail too (a writer killed between a short write and the truncate).
- **Honest counts.** ``lines`` counts this stream's complete lines in the file the path names now:
  lines that went into a file that was later removed or replaced are not counted (``gone``).

The few system calls go through ``ops`` so the framing can be tested against a simulated disk.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from typing import Any, Protocol

_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)  # read: the tail repair
_CHUNK = 1 << 20
PAGE = 4096  # the page size a buffered write is copied by (a larger folio only merges pages)


class FileOps(Protocol):
    """The system calls a :class:`LineFile` makes (``os`` itself satisfies it)."""

    def open(self, path: str, flags: int, mode: int = ...) -> int: ...
    def write(self, fd: int, data: Any, /) -> int: ...
    def ftruncate(self, fd: int, length: int, /) -> None: ...
    def pread(self, fd: int, length: int, offset: int, /) -> bytes: ...
    def fstat(self, fd: int) -> os.stat_result: ...
    def stat(self, path: str) -> os.stat_result: ...
    def close(self, fd: int) -> None: ...
    def makedirs(self, path: str, exist_ok: bool = ...) -> None: ...


class LineFile:
    """Owned by one writer thread; never shared."""

    def __init__(self, path: str, ops: FileOps | None = None) -> None:
        self.path = path
        self.ops: Any = ops if ops is not None else os
        self.fd: int | None = None
        self.size = 0
        self.lines = 0
        self.ident: tuple[int, int] | None = None  # (st_dev, st_ino) of the file ``lines`` counts

    # ------------------------------------------------------------------ open
    def open(self, *, existing_lines_are_ours: bool = False) -> bool:
        """Open (creating folders and file); True when the file is new (empty). Raises ``OSError``.

        ``existing_lines_are_ours``: a restarted writer resuming its own file counts what is there.
        """
        ops = self.ops
        parent = os.path.dirname(self.path)
        if parent:
            ops.makedirs(parent, exist_ok=True)
        fd: int = ops.open(self.path, _FLAGS, 0o644)
        try:
            st = ops.fstat(fd)
            size = self._repair_tail(fd, st.st_size) if st.st_size else 0
            ident = (st.st_dev, st.st_ino)
            if ident != self.ident:  # a different file than the one counted so far
                self.lines = _count_lines(ops, fd, size) if existing_lines_are_ours and size else 0
        except BaseException:
            ops.close(fd)
            raise
        self.fd, self.size, self.ident = fd, size, ident
        return size == 0

    def _repair_tail(self, fd: int, size: int) -> int:
        """Cut a partial last line (one without its ``\\n``); the new size."""
        end = size
        while end > 0:
            start = max(0, end - 65536)
            chunk: bytes = self.ops.pread(fd, end - start, start)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            end = start
        else:
            keep = 0
        if keep != size:
            self.ops.ftruncate(fd, keep)
        return keep

    # ---------------------------------------------------------------- append
    def append(self, data: bytes, nlines: int) -> tuple[int, OSError | None]:
        """Write ``data`` (``nlines`` whole lines); how many of them are on disk, and why not all.

        In pieces that a kill cannot cut inside a line (:func:`kill_safe_pieces`)."""
        fd = self.fd
        if fd is None:
            return 0, OSError(errno.EBADF, "not open")
        done, err = 0, None
        view = memoryview(data)
        for end in kill_safe_pieces(data, self.size):
            while done < end:
                try:
                    n = self.ops.write(fd, view[done:end])
                except OSError as exc:
                    err = exc
                    break
                if n <= 0:  # a regular file never does this; treat it as full rather than spin
                    err = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                    break
                done += n
            if err is not None:
                break
        if err is None:
            self.size += done
            self.lines += nlines
            return nlines, None
        cut = data.rfind(b"\n", 0, done) + 1
        if cut < done:
            try:
                self.ops.ftruncate(fd, self.size + cut)
            except OSError:
                self.close()  # the fragment stays until the next open repairs the tail
        whole = data.count(b"\n", 0, cut)
        self.size += cut
        self.lines += whole
        return whole, err

    # ------------------------------------------------------------- liveness
    def gone(self) -> bool:
        """True when the path no longer names the open file (removed, or replaced by another)."""
        if self.fd is None:
            return False
        try:
            if self.ops.fstat(self.fd).st_nlink == 0:
                return True
            st = self.ops.stat(self.path)
        except FileNotFoundError:
            return True
        except OSError as exc:
            return exc.errno == errno.ESTALE
        return (st.st_dev, st.st_ino) != self.ident

    def forget(self) -> int:
        """After :meth:`gone`: close, and stop counting the lost file's lines (returned)."""
        lost, self.lines, self.ident = self.lines, 0, None
        self.close()
        return lost

    def close(self) -> None:
        if self.fd is not None:
            try:
                self.ops.close(self.fd)
            except OSError:
                pass
            self.fd = None


def kill_safe_pieces(data: bytes, offset: int, page: int = PAGE) -> Iterator[int]:
    """Where to split ``data`` (whole lines, landing at file ``offset``) into ``write`` calls: the
    end index of each piece, in order.

    Why: the kernel copies a buffered write page by page and gives up between two pages once the
    process has a fatal signal (SIGKILL, or SIGTERM without a handler); the pages copied stay in
    the file. A 4 MiB write killed that way left a file ending inside a line (measured after a
    frozen disk thawed, issue 34). A write that lies within one page is copied in one go, all or
    nothing. So every piece is either whole lines within one page, or the one line that crosses a
    page boundary: the only place a kill can still cut, between its two page copies — a point that
    preemption or dirty-page throttling widens under load (3 of 25 kills after a thaw, two busy
    cores beside), so the file may end in that one torn line, at a page boundary; :meth:`open`
    repairs it. Two writes per page, about; each a few µs.
    """
    n = len(data)
    i = 0
    while i < n:
        boundary = i + page - (offset + i) % page  # the data index where the next page starts
        if boundary >= n:
            yield n
            return
        last = data.rfind(b"\n", i, boundary)
        if last >= i:  # whole lines before the boundary
            i = last + 1
            yield i
            if i == boundary:
                continue
        end = data.find(b"\n", i)  # the line that crosses the boundary, alone
        i = n if end < 0 else end + 1
        yield i


def _count_lines(ops: Any, fd: int, size: int) -> int:
    count = 0
    for offset in range(0, size, _CHUNK):
        chunk: bytes = ops.pread(fd, min(_CHUNK, size - offset), offset)
        count += chunk.count(b"\n")
    return count
