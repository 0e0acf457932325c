"""The writer side: a bounded queue of frames and the one thread that does every file operation.

It runs inside the drain process (:mod:`.drain`), or — only when no drain can be started — as a
thread of the training process. ``put`` (the reader) never touches the disk: it queues frames and,
past ``cap_bytes`` of queued lines, turns further line batches into drop marks (counted, one
warning). The writer thread takes frames in order, so everything the process handed over before a
record or a sync is settled — on disk or counted as dropped — when that record is written or that
sync is answered:

- event streams are appended through :class:`.line_file.LineFile` (whole lines only);
- a stream's record (the process record) is rewritten atomically with ``events`` set to the
  stream's ``written`` (its lines in the live file) and ``dropped`` (every other line it was
  handed); of several queued versions of a record only the newest is written;
- about once a second every open file is checked: a file that was removed or replaced is
  forgotten (its lines become dropped), one warning is sent, and the stream goes on in a new file
  whose first lines are the stream's header lines (lane names), so the new file reads on its own.

Messages back (acks, warnings, and — at most every ``COUNTS_S`` — streams' changed counts) go
through ``emit``; warnings once per kind of problem per stream. A stream closed while its record
could not be written says why in its ``closed`` answer, so the process can state the counts itself.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..common.atomic import write_atomic
from ..common.encoding import dumps_pretty, loads
from . import frames
from .line_file import FileOps, LineFile

DROPPED = 100  # a frame kind of this module only: lines the reader could not queue
CHECK_S = 1.0  # how often open files are checked for removal, failed opens retried
COUNTS_S = 0.5  # at most this often the writer tells the process its streams' changed counts
MAX_WRITE = 4 << 20  # consecutive batches of one stream are joined into writes of at most this
MAX_HEADER_BYTES = 4 << 20  # per stream: header lines kept for replay beyond this are not kept
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)

Emit = Callable[[dict[str, Any]], None]


class _Stream:
    """What the writer knows about one stream."""

    def __init__(self, path: str, record: str | None, resume: bool, ops: FileOps | None) -> None:
        self.file = LineFile(path, ops)
        self.record = record
        self.resume = resume
        self.opened = False
        self.retry_at = 0.0
        self.emitted = 0
        self.replayed = 0
        self.headers: list[bytes] = []
        self.header_bytes = 0
        self.record_doc: bytes | None = None
        self.record_counts: tuple[int, int] | None = None
        self.record_error: str | None = None  # why the last record write failed (None: it did not)
        self.told: tuple[int, int] = (0, 0)  # the counts last sent to the process

    def counts(self) -> tuple[int, int]:
        written = self.file.lines
        return written, max(0, self.emitted + self.replayed - written)


class Sink:
    """Bounded queue + writer thread. ``put``/``finish`` from the reader, ``run`` in the writer."""

    def __init__(self, cap_bytes: int, emit: Emit, ops: FileOps | None = None) -> None:
        self.cap_bytes = cap_bytes
        self.emit = emit
        self.ops = ops
        self._q: deque[frames.Frame] = deque()
        self._queued = 0
        self._cond = threading.Condition()
        self._eof = False
        self._newest_record: dict[int, int] = {}
        self._streams: dict[int, _Stream] = {}
        self._warned: set[tuple[int, str]] = set()
        self._next_check = 0.0
        self._next_counts = 0.0
        self.thread: threading.Thread | None = None
        self.ending: Any = None  # the drain's ending.Ending: a signal it got is named in each record

    # ---------------------------------------------------------------- reader side
    def put(self, batch: list[frames.Frame]) -> None:
        """Queue frames in order; line batches beyond the cap become drop marks (never blocks)."""
        over = False
        with self._cond:
            for f in batch:
                if f.kind == frames.LINES:
                    size = len(f.payload)
                    if self._queued + size > self.cap_bytes:
                        f = frames.Frame(DROPPED, f.sid, f.a, f.b, 0, b"")
                        over = True
                    else:
                        self._queued += size
                elif f.kind == frames.RECORD:
                    self._newest_record[f.sid] = f.b
                self._q.append(f)
            self._cond.notify()
        if over:
            mb = self.cap_bytes / 2**20
            self.warn(
                -1,
                "buffer",
                f"output buffer full ({mb:g} MiB, RL_TRACE_BUFFER_MB): the output disk is not taking "
                "writes; newer events are dropped and counted until it does",
            )

    def finish(self) -> None:
        """No more frames will come: the writer settles what is queued, then ends."""
        with self._cond:
            self._eof = True
            self._cond.notify()

    def start(self) -> threading.Thread:
        self.thread = threading.Thread(target=self.run, name="rl-trace-writer", daemon=True)
        self.thread.start()
        return self.thread

    # ---------------------------------------------------------------- writer side
    def run(self) -> None:
        while True:
            with self._cond:
                if not self._q and not self._eof:
                    self._cond.wait(CHECK_S)
                batch = list(self._q)
                self._q.clear()
                self._queued -= sum(len(f.payload) for f in batch if f.kind == frames.LINES)
                eof = self._eof and not batch
            try:
                self.handle(batch)
                if time.monotonic() >= self._next_check:
                    self.check_files()
                if time.monotonic() >= self._next_counts:
                    self.tell_counts()
            except Exception as exc:  # the writer must outlive any one failure
                self.warn(-1, "writer", f"writer error: {exc!r}")
            if eof:
                self.settle()
                return

    def handle(self, batch: list[frames.Frame]) -> None:
        """Process frames in order (consecutive line batches of one stream in one write)."""
        i, n = 0, len(batch)
        while i < n:
            f = batch[i]
            if f.kind == frames.LINES:
                j, size = i + 1, len(f.payload)
                while j < n and batch[j].kind == frames.LINES and batch[j].sid == f.sid and size < MAX_WRITE:
                    size += len(batch[j].payload)
                    j += 1
                run = batch[i:j]
                self._lines(f.sid, b"".join(g.payload for g in run), sum(g.b for g in run), run[-1].a)
                i = j
                continue
            self._one(f)
            i += 1

    def _one(self, f: frames.Frame) -> None:
        kind = f.kind
        if kind == frames.OPEN:
            spec = loads(f.payload)
            new = _Stream(spec["path"], spec.get("record"), bool(spec.get("resume")), self.ops)
            self._streams[f.sid] = new
            if new.resume and os.path.exists(new.file.path):  # count what is there before any news
                self._ensure_open(f.sid, new)
            return
        if kind == frames.SYNC:
            self.emit({"sync": f.a, "counts": {str(k): s.counts() for k, s in self._streams.items()}})
            return
        s = self._streams.get(f.sid)
        if s is None:
            return
        if kind == DROPPED:
            s.emitted = f.a
        elif kind == frames.HEADER:
            if s.header_bytes + len(f.payload) <= MAX_HEADER_BYTES:
                s.headers.append(f.payload)
                s.header_bytes += len(f.payload)
        elif kind == frames.RECORD:
            s.emitted = max(s.emitted, f.a)
            s.record_doc = f.payload
            if f.b >= self._newest_record.get(f.sid, 0):  # an older version: a newer one is queued
                self._write_record(f.sid, s)
        elif kind == frames.CLOSE:
            if s.record_doc is not None and s.record_counts != s.counts():
                self._write_record(f.sid, s)
            s.file.close()
            del self._streams[f.sid]
            closed: dict[str, Any] = {"closed": f.sid, "counts": s.counts()}
            if s.record_error is not None:  # the process says the counts itself (stderr, once)
                closed["record_error"] = f"{s.record}: {s.record_error}"
            self.emit(closed)

    # ------------------------------------------------------------------- streams
    def _lines(self, sid: int, data: bytes, nlines: int, emitted: int) -> None:
        s = self._streams.get(sid)
        if s is None:
            return
        s.emitted = emitted
        if not data or not self._ensure_open(sid, s):  # a count alone: the file waits for a line
            return
        _, err = s.file.append(data, nlines)
        if err is not None:
            self._write_failed(sid, s, err)

    def _ensure_open(self, sid: int, s: _Stream) -> bool:
        if s.file.fd is not None:
            return True
        now = time.monotonic()
        if now < s.retry_at:
            return False
        try:
            fresh = s.file.open(existing_lines_are_ours=s.resume and not s.opened)
        except OSError as exc:
            s.retry_at = now + CHECK_S
            self.warn(
                sid, "event_log", f"cannot open event log {s.file.path}: {_why(exc)}; events are dropped"
            )
            return False
        if fresh and (s.opened or s.resume) and s.headers:  # a new file after a lost one: names first
            written, err = s.file.append(b"".join(s.headers), len(s.headers))
            s.replayed += written
            if err is not None:
                self._write_failed(sid, s, err)
        s.opened = True
        return s.file.fd is not None

    def _write_failed(self, sid: int, s: _Stream, err: OSError) -> None:
        path = s.file.path
        if err.errno in _FULL:
            self.warn(sid, "event_log", f"cannot append to {path}: disk full; events are dropped and counted")
            return
        s.file.close()  # reopened (and its tail repaired) on a later batch
        s.retry_at = time.monotonic() + CHECK_S
        self.warn(sid, "event_log", f"cannot append to {path}: {_why(err)}; events are dropped")

    def check_files(self) -> None:
        """Find event logs removed or replaced under us; go on in a new file (or count drops)."""
        self._next_check = time.monotonic() + CHECK_S
        for sid, s in list(self._streams.items()):
            if not s.file.gone():
                continue
            lost = s.file.forget()
            self.warn(
                sid,
                "removed",
                f"event log {s.file.path} was removed or replaced; its {lost} lines are lost (now counted "
                "as dropped), later events go to a new file",
            )
            s.retry_at = 0.0
            self._ensure_open(sid, s)
            if s.record_doc is not None:
                self._write_record(sid, s)

    def _write_record(self, sid: int, s: _Stream) -> None:
        if s.record is None or s.record_doc is None:
            return
        counts = s.counts()
        try:
            doc = loads(s.record_doc)
            doc["events"] = {"written": counts[0], "dropped": counts[1]}
            ended_by = self.ended_by()
            if ended_by is not None:
                doc["events"]["ended_by"] = ended_by
            data = dumps_pretty(doc)
            os.makedirs(os.path.dirname(s.record), exist_ok=True)
            write_atomic(Path(s.record), data)
        except Exception as exc:
            s.record_error = _why(exc)
            self.warn(sid, "record", f"cannot write process record {s.record}: {s.record_error}")
            return
        s.record_counts, s.record_error = counts, None

    def settle(self) -> None:
        """At the end: records whose counts changed since last written, then close every file."""
        for sid, s in self._streams.items():
            if s.record_doc is not None and (s.record_counts != s.counts() or self.ended_by() is not None):
                self._write_record(sid, s)
            s.file.close()

    def tell_counts(self) -> None:
        """Streams whose counts changed since last told, to the process (its ``written``/``dropped``
        stay current without a flush, even when no record can be written)."""
        self._next_counts = time.monotonic() + COUNTS_S
        changed = {}
        for sid, s in self._streams.items():
            now = s.counts()
            if now != s.told:
                s.told = now
                changed[str(sid)] = now
        if changed:
            self.emit({"counts": changed})

    def ended_by(self) -> str | None:
        """The catchable signal that asked the drain to end (it still writes what it holds)."""
        signal: str | None = getattr(self.ending, "signal", None)
        return signal

    def warn(self, sid: int, kind: str, message: str) -> None:
        if (sid, kind) in self._warned:
            return
        self._warned.add((sid, kind))
        self.emit({"warn": kind, "sid": sid, "msg": message})


def _why(exc: BaseException) -> str:
    return (exc.strerror if isinstance(exc, OSError) and exc.strerror else None) or str(exc) or repr(exc)
