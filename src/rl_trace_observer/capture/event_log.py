"""Append-only JSONL event log with a time-bounded buffer.

Why buffer at all: one ``write(2)`` per span costs 2-4 µs on a busy 2-core host — as much as all of
RL-Insight's own bookkeeping — and an open-append-close backend costs ~15 µs. Lines are therefore
collected in memory and written in one ``write`` per batch, whole lines only: a daemon thread,
woken by the first line of a batch, writes the batch ~2 ms later; a batch that reaches ``max_bytes``
or whose oldest line is ``max_delay_s`` old is written inline. What a SIGKILL can lose is bounded by
time: typically the last ~2 ms, at most ``max_delay_s`` (100 ms) when the flusher is starved.
Nothing written earlier is ever cut, because every ``write`` carries complete lines on an
``O_APPEND`` descriptor.

After ``fork`` the child drops the parent's pending lines (the parent writes them) and its
descriptor; the recorder then opens the child's own file under the child's pid.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

DEFAULT_MAX_DELAY_S = 0.1
DEFAULT_MAX_BYTES = 64 * 1024
LINGER_S = 0.002


class EventLog:
    """Thread-safe appender; failures are counted as dropped events, never raised."""

    def __init__(
        self,
        path: Path,
        on_problem: Callable[[str], None],
        *,
        max_delay_s: float = DEFAULT_MAX_DELAY_S,
        max_bytes: int = DEFAULT_MAX_BYTES,
        on_tick: Callable[[], None] | None = None,
    ) -> None:
        self.path = path
        self.written = 0
        self.dropped = 0
        self.max_delay_ns = int(max_delay_s * 1e9)
        self.max_bytes = max_bytes
        self._on_problem = on_problem
        self._on_tick = on_tick  # periodic housekeeping of the owner, kept off the hot path
        self._buf: list[bytes] = []
        self._buf_bytes = 0
        self._oldest_ns = 0
        self._buf_lock = threading.Lock()  # guards the buffer: held for a list append only
        self._io_lock = threading.Lock()  # orders flushes: batches reach the file in append order
        self._fd: int | None = None
        self._failed = False
        self._closed = False
        self._flusher: threading.Thread | None = None
        self._wake = threading.Event()

    # ------------------------------------------------------------------ append
    def write_line(self, line: bytes) -> None:
        """Queue one complete line (ending in ``\\n``); flushes inline when the batch is due."""
        now = time.monotonic_ns()
        with self._buf_lock:
            first = not self._buf
            if first:
                self._oldest_ns = now
            self._buf.append(line)
            self._buf_bytes += len(line)
            due = self._buf_bytes >= self.max_bytes or now - self._oldest_ns >= self.max_delay_ns
        if first:  # once per batch: the flusher lingers a moment, then writes what has gathered
            if self._flusher is None and not self._closed:
                self._start_flusher()
            self._wake.set()
        if due:
            self.flush()

    def _start_flusher(self) -> None:
        with self._buf_lock:
            if self._flusher is not None:
                return
            self._flusher = threading.Thread(target=self._flush_loop, name="rl-trace-flush", daemon=True)
        self._flusher.start()

    def _flush_loop(self) -> None:
        while not self._closed:
            if self._wake.wait(self.max_delay_ns / 2e9):
                self._wake.clear()
                # Sparse spans (RL stages: a few per second) reach the disk within ~LINGER_S;
                # bursts still batch, so the per-span cost stays one list append.
                time.sleep(LINGER_S)
            try:
                self.flush()
                if self._on_tick is not None:
                    self._on_tick()
            except Exception:  # the flusher must outlive any single failure
                pass

    # ------------------------------------------------------------------- flush
    def flush(self) -> None:
        with self._io_lock:
            with self._buf_lock:
                lines, self._buf, self._buf_bytes = self._buf, [], 0
            if lines:
                self._write_batch(lines)

    def _open(self) -> int | None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
            self._fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            self._failed = True
            self._on_problem(f"cannot open event log {self.path}: {exc.strerror or exc}; events are dropped")
        return self._fd

    def _write_batch(self, lines: list[bytes]) -> None:
        fd = self._fd if self._fd is not None else (None if self._failed else self._open())
        if fd is None:
            self.dropped += len(lines)
            return
        data = b"".join(lines)
        try:
            n = os.write(fd, data)
        except OSError as exc:
            self.dropped += len(lines)
            self._on_problem(f"cannot append to {self.path}: {exc.strerror or exc}; events are dropped")
            return
        if n == len(data):
            self.written += len(lines)
            return
        # Short write (disk filled mid-batch): count whole lines that made it, end the fragment so
        # later batches stay parseable once space frees up; the reader skips the cut line.
        whole = data.count(b"\n", 0, n)
        self.written += whole
        self.dropped += len(lines) - whole
        try:
            os.write(fd, b"\n")
        except OSError:
            pass
        self._on_problem(f"cannot append to {self.path}: disk full (short write); events are dropped")

    # --------------------------------------------------------------- lifecycle
    def close(self) -> None:
        self.flush()
        self._closed = True
        self._wake.set()
        with self._io_lock:
            if self._fd is not None:
                try:
                    os.close(self._fd)
                except OSError:
                    pass
                self._fd = None

    def forget_after_fork(self) -> None:
        """In a forked child: drop the parent's pending lines, locks, flusher and descriptor."""
        self._buf_lock = threading.Lock()
        self._io_lock = threading.Lock()
        self._buf, self._buf_bytes = [], 0
        self._flusher = None
        self._closed = True
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd = None
