"""Append lines to a file in the output directory without ever waiting on that file's disk.

The API every capture writer uses (the RL-Insight event log, and any other per-process line file,
e.g. metric samples):

.. code-block:: python

    from rl_trace_observer.capture.streams import open_stream

    stream = open_stream(output_dir / "my-samples-host-pid-7.jsonl")
    stream.append(b'{"t": 1, "v": 2.5}\\n')    # one whole line; never waits on I/O, never raises
    stream.append_header(b'{"ph": "M"}\\n')    # also repeated at the top of any later new file
    stream.flush(5.0)                          # tests, tools: wait until it is on disk (or False)
    stream.written, stream.dropped             # as the writer last said (every ~0.5 s, no flush needed)

``open_stream(..., record=path, record_source=fn, record_interval_s=1.0)`` also keeps a JSON
record beside it: ``fn()`` returns the record's JSON bytes, and the writer rewrites ``path``
atomically, in order with the lines, with ``"events": {"written", "dropped"}`` filled in from what
is really on disk. ``stream.record_changed()`` asks for a rewrite; counts alone refresh it at most
every ``record_interval_s``.

How (see docs/capture.md): ``append`` is a deque append — all a training thread does, but for a
busy stream's batches of ``pump.INLINE_LINES``, which it writes to the pipe itself (non-blocking; at
most once per pump period it also waits ≤ 1 ms for the pump's cycle, lending it the GIL); a pump
thread (:mod:`.pump`) moves the other batches through a non-blocking pipe to a drain process
(:mod:`.drain`) that holds a bounded buffer and does every file operation. At exit the process
waits at most ``RL_TRACE_EXIT_WAIT_S`` for the drain, then leaves it to finish on its own.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from .. import config as config_mod
from ..common.encoding import dumps_line
from .pump import Channel

MAX_PENDING = 1 << 18  # lines waiting for the pump in one stream; beyond, a starved pump drops
OFFER_LINES = 128  # every this many waiting lines, the appending thread offers them (see append)
MAX_HEADERS = 1 << 16  # header lines kept in process for a restarted drain
DEFAULT_FLUSH_S = 5.0

Problem = Callable[[str, str], None]  # (kind, message): the owner's warn-once


_monotonic = time.monotonic


def _noop() -> None:
    return None


class Stream:
    """One line file of this process; see the module docstring for the API."""

    def __init__(
        self,
        channel: Channel,
        path: Path,
        *,
        record: Path | None = None,
        record_source: Callable[[], bytes] | None = None,
        record_interval_s: float = 1.0,
        on_problem: Problem | None = None,
    ) -> None:
        self.path = path
        self.record = record
        self.record_source = record_source
        self.record_interval_s = record_interval_s
        self.on_problem = on_problem
        self.buf: deque[bytes] = deque()
        self._notify = channel.notify
        self._channel = channel
        self.inline_until = 0.0  # while monotonic() is below, a new batch wakes no pump (see append)
        # pump-side bookkeeping (written under the channel's cycle lock: the pump, or send_inline)
        self.emitted = 0
        self.sent_emitted = 0
        self.dropped_here = 0
        self.new_headers: list[bytes] = []
        self.all_headers: list[bytes] = []
        self.record_due = record_source is not None
        self._record_next = 0.0
        self._record_emitted = -1
        self.closing = False
        self.announced = False
        self.resume = False  # set once closed: a later append reopens the same file and counts it
        # the writer's answers
        self.written = 0
        self.dropped = 0
        self._overflow = 0
        self._overflow_lock = threading.Lock()
        self.sid = channel.add(self)
        if self.record_due:
            self._notify()  # the first record within ~2 ms, not at the pump's next idle tick

    # ------------------------------------------------------------- training threads
    def append(self, line: bytes) -> None:
        """Hand over one whole line (ending in ``\\n``). A deque append; never waits on I/O.

        The first line of a batch wakes the pump, unless this stream wrote a batch itself within
        the pump's idle period; every ``OFFER_LINES``-th line waiting offers the batch to
        :meth:`Channel.send_inline` (a non-blocking pipe write from this thread once
        ``pump.INLINE_LINES`` wait; ≤ 1 ms of waiting if the pump wants the GIL lent)."""
        buf = self.buf
        buf.append(line)
        n = len(buf)
        if n == 1:
            if self.inline_until < _monotonic():
                self._notify()
        elif n > MAX_PENDING:
            self._drop_newest()
        elif not n % OFFER_LINES:
            self._channel.send_inline(self)

    write_line = append

    def append_header(self, line: bytes) -> None:
        """A line that must head every file of this stream (e.g. a lane's name)."""
        self.append(line)
        with self._overflow_lock:
            self.new_headers.append(line)

    def record_changed(self) -> None:
        """Ask for the record to be rewritten (within ~2 ms unless the disk lags)."""
        self.record_due = self.record_source is not None
        self._notify()

    def flush(self, timeout_s: float = DEFAULT_FLUSH_S) -> bool:
        """Wait until every line handed over so far is on disk or counted; False on timeout.

        For tests and tools: a training thread never needs it (and on a hung disk it waits).
        """
        return self._channel.sync(timeout_s)

    def close(self, timeout_s: float = DEFAULT_FLUSH_S) -> bool:
        """Final record, close the file; waits at most ``timeout_s`` for the writer to confirm."""
        self.record_due = self.record_source is not None
        self.closing = True
        self._channel.notify()
        return self._channel.sync(timeout_s)

    def _drop_newest(self) -> None:
        """The pump has not run for a long while (starved): drop rather than grow without bound."""
        with self._overflow_lock:
            try:
                self.buf.pop()
            except IndexError:
                return
            self._overflow += 1

    # ------------------------------------------------------------------ pump thread
    def take(self) -> tuple[bytes, int]:
        """The lines handed over since the last take, joined; counts them as emitted."""
        buf = self.buf
        n = len(buf)
        if n:
            pop = buf.popleft
            data = b"".join([pop() for _ in range(n)])
        else:
            data = b""
        if self._overflow:
            with self._overflow_lock:
                over, self._overflow = self._overflow, 0
            self.emitted += over
            self.dropped_here += over
        self.emitted += n
        return data, n

    def take_headers(self) -> list[bytes]:
        """Header lines named since the last take (their lines were taken before them); kept for
        a replacement drain, which may need them at the top of a new file."""
        with self._overflow_lock:
            heads, self.new_headers = self.new_headers, []
        room = MAX_HEADERS - len(self.all_headers)
        if room > 0:
            self.all_headers += heads[:room]
        return heads

    def record_wanted(self, now: float) -> bool:
        return self.record_due or (now >= self._record_next and self.emitted != self._record_emitted)

    def record_sent(self, now: float) -> None:
        self.record_due = False
        self._record_next = now + self.record_interval_s
        self._record_emitted = self.emitted

    def open_spec(self, resume: bool) -> bytes:
        record = str(self.record) if self.record is not None else None
        return dumps_line({"path": str(self.path), "record": record, "resume": resume})

    def confirm(self, written: int, dropped: int) -> None:
        self.written, self.dropped = written, dropped

    def closed_by_pump(self) -> None:
        """The writer was told to close this stream; a later append or record reopens it."""
        self.resume = True
        self.inline_until = 0.0  # its next line must reach _reopen, however recently it was busy
        self._notify = self._reopen

    def _reopen(self) -> None:
        with self._overflow_lock:
            if self._notify == self._reopen:
                self.closing = self.announced = False
                self._notify = self._channel.notify
                self.sid = self._channel.add(self)
        self._channel.notify()

    def abandon(self) -> None:
        """In a forked child: this stream belongs to the parent; appends now vanish."""
        self.buf = deque(maxlen=1)
        self._notify = _noop


# ------------------------------------------------------------------ process singleton
_CHANNEL: Channel | None = None
_LOCK = threading.Lock()
_HOOKS_INSTALLED = False


def channel(config: config_mod.Config | None = None) -> Channel:
    """This process's channel, created on first use (settings from ``config`` or the environment)."""
    global _CHANNEL, _HOOKS_INSTALLED
    ch = _CHANNEL
    if ch is not None and ch.pid == os.getpid():
        return ch
    with _LOCK:
        if _CHANNEL is None or _CHANNEL.pid != os.getpid():
            cfg = config if config is not None else config_mod.load()
            _CHANNEL = Channel(int(cfg.buffer_mb * 2**20), cfg.exit_wait_s)
            if not _HOOKS_INSTALLED:
                os.register_at_fork(after_in_child=_after_fork_in_child)
                atexit.register(_shutdown_at_exit)
                _HOOKS_INSTALLED = True
        return _CHANNEL


def open_stream(
    path: Path,
    *,
    record: Path | None = None,
    record_source: Callable[[], bytes] | None = None,
    record_interval_s: float = 1.0,
    on_problem: Problem | None = None,
    config: config_mod.Config | None = None,
) -> Stream:
    """A new stream appending to ``path`` (absolute; created with its folders on the first line)."""
    return Stream(
        channel(config),
        path,
        record=record,
        record_source=record_source,
        record_interval_s=record_interval_s,
        on_problem=on_problem,
    )


def _after_fork_in_child() -> None:
    global _CHANNEL, _LOCK
    _LOCK = threading.Lock()
    ch, _CHANNEL = _CHANNEL, None
    if ch is not None:
        ch.abandon_in_child()


def _shutdown_at_exit() -> None:
    ch = _CHANNEL
    if ch is not None and ch.pid == os.getpid():
        ch.shutdown()
