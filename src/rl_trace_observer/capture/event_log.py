"""Append-only JSONL event log: one ``os.write`` per line on an ``O_APPEND`` descriptor.

Why unbuffered: a line that ``write`` has accepted sits in the kernel's page cache, so a SIGKILL of
the process a microsecond later loses nothing; only a cut line can be lost, and only when the
process dies inside the ``write`` call itself. Buffering would save about 1 µs per event and cost
up to a buffer's worth of spans on every killed Ray worker, which is exactly when users need them.
One ``write`` per line on ``O_APPEND`` also keeps concurrent writers (threads, or a parent and a
forked child that inherited the descriptor before we reopened it) from interleaving inside a line.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("rl_trace_observer")


class EventLog:
    """Thread-safe appender; failures are counted as dropped events, never raised."""

    def __init__(self, path: Path, on_problem: Callable[[str], None]) -> None:
        self.path = path
        self.written = 0
        self.dropped = 0
        self._on_problem = on_problem
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._failed = False

    def _open(self) -> int | None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
            self._fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            self._failed = True
            self._on_problem(f"cannot open event log {self.path}: {exc.strerror or exc}; events are dropped")
        return self._fd

    def write_line(self, line: bytes) -> bool:
        """Append one complete line (must end with ``\\n``). Returns False when it was dropped."""
        with self._lock:
            fd = self._fd
            if fd is None:
                fd = None if self._failed else self._open()
                if fd is None:
                    self.dropped += 1
                    return False
            try:
                n = os.write(fd, line)
                if n != len(line):
                    # Disk filled mid-line: end the fragment so later lines stay parseable once
                    # space frees up; the reader skips (and counts) the cut line.
                    try:
                        os.write(fd, b"\n")
                    except OSError:
                        pass
                    raise OSError(errno.ENOSPC, "short write")
            except OSError as exc:
                self.dropped += 1
                self._on_problem(f"cannot append to {self.path}: {exc.strerror or exc}; events are dropped")
                return False
            self.written += 1
            return True

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                try:
                    os.close(self._fd)
                except OSError:
                    pass
                self._fd = None

    def forget_after_fork(self) -> None:
        """In a forked child: drop the parent's descriptor without closing the parent's file twice."""
        self._lock = threading.Lock()
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd = None
