"""The pump: one thread per training process that moves handed-over lines to the drain process.

Training threads only append to a stream's deque (:mod:`.streams`). The pump thread, woken by the
first line of a batch, waits ~2 ms for the batch to gather, frames every stream's lines, headers and
due records (:mod:`.frames`) into one outbox and writes as much of it as the pipe takes — the pipe
is non-blocking, so the pump never waits on the drain, let alone on the disk. If the pipe is full
(the drain is starved or stopped) the outbox is kept up to ``backlog_bytes``; later batches are
then dropped and counted (they still count as handed over, so the writer reports them dropped).

The drain is started lazily by this thread (fork+exec of ``sys.executable -m
rl_trace_observer.capture.drain``: never a bare fork of the training process). If it dies, the next
cycle starts another (at most :data:`MAX_SPAWNS` in all) that resumes the same files; if none can be
started, the writer runs as a thread of this process instead (:class:`.drain_link.Local`) — then, and only
then, a hung disk can hold up this process's exit.

Everything that touches a pipe runs on this thread, with SIGPIPE blocked in it (a process that
restored SIGPIPE's default action is not killed by a drain that died) — but for a busy stream's
batches, which the thread that filled them writes while SIGPIPE is ignored (:meth:`Channel.send_inline`).
The two ends (a drain process, or the writer as a thread) are in :mod:`.drain_link`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import threading
import time
from typing import Any

from . import frames
from .drain_link import Local, Pipe

_getsignal = signal.getsignal
Stream = Any  # a streams.Stream (that module imports this one, so not imported back)


log = logging.getLogger("rl_trace_observer")

LINGER_S = 0.002  # a woken pump waits this long for the batch to gather
IDLE_S = 0.1  # an idle pump still wakes this often: periodic records, messages from the drain
INLINE_LINES = 512  # a busy stream's batch this long is written by the thread that filled it
LEND_S = 0.001  # the most one _lend waits for the pump's cycle
LEND_MAX_S = 0.005  # the most all _lends wait per pump period (a stuck pump costs this, once)
NEVER = float("inf")
MAX_SPAWNS = 4  # the first drain and up to three replacements
RESPAWN_AFTER_S = 1.0


class Channel:
    """This process's connection to its writer: the streams, the pump thread, the drain."""

    def __init__(self, buffer_bytes: int, exit_wait_s: float) -> None:
        self.pid = os.getpid()
        self.buffer_bytes = buffer_bytes
        self.backlog_bytes = buffer_bytes  # only used while the drain lags (CPU-starved, stopped)
        self.exit_wait_s = exit_wait_s
        self.streams: dict[int, Stream] = {}
        self._closed: dict[int, Stream] = {}
        self._sids = itertools.count(1)
        self._seq = itertools.count(1)
        self._lock = threading.Lock()  # the stream table and sync tokens; held for a few lines only
        self._cycle_lock = threading.Lock()  # the outbox and pump-side counts: a cycle, or send_inline
        self._cycled = threading.Event()  # set when the pump's cycle is done: see _lend
        self._due = NEVER  # when the pump's wait ends (monotonic): from then it wants the GIL
        self._lent = 0.0  # seconds lent to the pump in this period
        self._wake = threading.Event()
        self.awake = False
        self._outbox = frames.Outbox()
        self._transport: Pipe | Local | None = None
        self._spawns = 0
        self._spawn_at = 0.0
        self._thread: threading.Thread | None = None
        self._dead = False
        self._stop_deadline: float | None = None
        self._stopped = threading.Event()
        self._sync_cond = threading.Condition()
        self._sync_asked = 0
        self._sync_sent = 0
        self._synced = 0
        self._warned: set[str] = set()

    # ------------------------------------------------------------ any thread
    def add(self, stream: Stream) -> int:
        with self._lock:
            sid = next(self._sids)
            self.streams[sid] = stream
        if self._thread is None:
            self._start()
        return sid

    def notify(self) -> None:
        """A stream got the first line of a batch (the hot path calls this once per batch)."""
        if not self.awake:
            self.awake = True
            self._wake.set()

    def send_inline(self, s: Stream) -> None:
        """From a thread whose append left a multiple of ``streams.OFFER_LINES`` lines waiting: once
        ``INLINE_LINES`` wait, frame and write them now; in any case lend the pump the GIL if it
        wants it (:meth:`_lend`, checked this often so that its wait stays short).

        Why: a pump thread that wants the GIL while a training thread runs Python and releases it
        for short syscalls (one per request, say) is woken by every release and almost never wins
        it — the release is over before the pump runs, and each release restarts the interpreter's
        5 ms switch timer. The pump then waits for tens of ms, and every release costs both threads
        a futex and a context switch: in a request-serving loop that cost more CPU than the request
        hooks. So a busy stream is written by the thread that fills it, in batches, never waiting on I/O:
        the pipe is non-blocking and the lock only tried. Anything not simple (no drain yet, a
        backlog, a header or close pending, SIGPIPE not ignored) stays with the pump. For ``IDLE_S``
        after, a new batch wakes no pump; its periodic cycle takes the tail of a burst, and that
        thread lends it the GIL (:meth:`_lend`).
        """
        if self._write_own(s):
            s.inline_until = time.monotonic() + IDLE_S
        self._lend()  # whether or not it wrote: a batch it left waits for the pump

    def _write_own(self, s: Stream) -> bool:
        t = self._transport
        if (
            len(s.buf) < INLINE_LINES
            or type(t) is not Pipe
            or self._outbox
            or not s.announced
            or s.closing
            or s.new_headers
            or self._stop_deadline is not None
            or _getsignal(signal.SIGPIPE) is not signal.SIG_IGN  # a write to a dead drain would kill
            or not self._cycle_lock.acquire(blocking=False)
        ):
            return False
        try:
            if self._transport is not t or self._outbox or self._stop_deadline is not None:
                return False
            data, n = s.take()
            self._outbox.add(frames.LINES, s.sid, data, a=s.emitted, b=n)
            s.sent_emitted = s.emitted
            if t.send(self._outbox):
                return True
            self.notify()  # the drain is gone: the pump's next cycle starts another
        except Exception as exc:  # never raised on a training thread; the pump's cycle tries again
            self.warn_once("inline", f"capture: a batch written by its own thread failed ({exc!r})")
        finally:
            self._cycle_lock.release()
        return False

    def _lend(self) -> None:
        """If the pump's wait is over (it wants the GIL), block up to ``LEND_S`` until its cycle is
        done: the GIL is free meanwhile, so the pump takes it at once (and its own syscalls do not
        start new waits). What CPython's switch interval would do, were it not restarted by every
        short release. Typically 0.1-0.3 ms per ``IDLE_S``; at most ``LEND_MAX_S`` per pump period
        however long its cycle (a stuck pump: ``_due`` is cleared once that is spent)."""
        now = time.monotonic()
        if now > self._due and not self._cycled.is_set():
            self._cycled.wait(LEND_S)
            self._lent += time.monotonic() - now
            if self._lent >= LEND_MAX_S:
                self._due = NEVER

    def sync(self, timeout_s: float) -> bool:
        """Wait until everything handed over before this call is settled by the writer."""
        if self._dead or self._stop_deadline is not None:
            return False
        with self._sync_cond:
            self._sync_asked += 1
            token = self._sync_asked
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        with self._sync_cond:
            while self._synced < token:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._sync_cond.wait(left)
        return True

    def shutdown(self) -> None:
        """At exit: final records, close every stream, hand everything over; at most ``exit_wait_s``."""
        if self._dead or self._thread is None or self._stop_deadline is not None:
            return
        for s in list(self.streams.values()):
            s.closing = True
            s.record_due = s.record_source is not None
        self._stop_deadline = time.monotonic() + self.exit_wait_s
        self._wake.set()
        self._stopped.wait(self.exit_wait_s + 0.25)

    @property
    def drain_pid(self) -> int | None:
        t = self._transport
        return t.pid if t is not None else None

    def abandon_in_child(self) -> None:
        """After fork, in the child: the parent's pipes and pump are not ours; drop quietly."""
        self._dead = True
        t = self._transport
        if isinstance(t, Pipe):
            t.close()
        self._transport = None
        for s in self.streams.values():
            s.abandon()

    # ----------------------------------------------------------- pump thread
    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="rl-trace-pump", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(Exception):
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPIPE})
        try:  # at once, not after a linger: lines are safe from a kill only once the drain holds the pipe
            self._connect()
        except Exception as exc:
            self.warn_once("pump", f"capture pump error (events may be lost): {exc!r}")
        while True:
            self._due = time.monotonic() + IDLE_S  # before the clear: _lend never waits on a set one
            self._lent = 0.0
            self._cycled.clear()
            woke = self._wake.wait(IDLE_S)
            self._wake.clear()
            if woke and self._stop_deadline is None:
                self._due = time.monotonic() + LINGER_S
                time.sleep(LINGER_S)  # sparse events reach the pipe within ~2 ms; bursts still batch
            try:
                with self._cycle_lock:
                    self._cycle()
            except Exception as exc:  # the pump must outlive any single failure
                self.warn_once("pump", f"capture pump error (events may be lost): {exc!r}")
            self._due = NEVER
            self._cycled.set()
            if self._stop_deadline is not None:
                self._finish()
                return
            self.awake = False
            if self._pending():
                self.awake = True
                self._wake.set()

    def _pending(self) -> bool:
        return (
            bool(self._outbox)
            or self._sync_sent < self._sync_asked
            or any(s.buf or s.closing or s.record_due for s in list(self.streams.values()))
        )

    def _cycle(self) -> None:
        t = self._transport if self._transport is not None else self._connect()
        self._take_messages(t)
        t = self._transport
        if t is None:
            return  # lines wait in their deques (bounded) for the next drain
        now = time.monotonic()
        with self._sync_cond:  # read before taking lines: a sync covers what was handed over before it
            asked = self._sync_asked
        room = True
        for sid, s in list(self.streams.items()):
            room = self._frame(sid, s, room, now) and room
        if asked > self._sync_sent:
            self._outbox.add(frames.SYNC, 0, a=asked)
            self._sync_sent = asked
        if self._outbox and not t.send(self._outbox):
            self._lost(t)

    def _frame(self, sid: int, s: Stream, room: bool, now: float) -> bool:
        """Frame one stream's news into the outbox; False once the outbox is over its cap."""
        outbox = self._outbox
        if not s.announced and self._transport is not None:  # the writer learns the stream first
            outbox.add(frames.OPEN, sid, s.open_spec(self._spawns > 1 or s.resume))
            if self._spawns > 1 and s.all_headers:  # a replacement drain: it may need them for a new file
                outbox.add(frames.HEADER, sid, b"".join(s.all_headers), b=len(s.all_headers))
            s.announced = True
        room = room and len(outbox) < self.backlog_bytes
        closing = s.closing  # before the take: lines handed over before close() are all in it
        data, n = s.take()
        if n or s.emitted != s.sent_emitted:
            if room:
                outbox.add(frames.LINES, sid, data, a=s.emitted, b=n)
                s.sent_emitted = s.emitted
            elif n:
                s.dropped_here += n
                self._warn_dropping()
        if s.new_headers and room:
            heads = s.take_headers()
            outbox.add(frames.HEADER, sid, b"".join(heads), b=len(heads))
        if s.record_source is not None and room and s.record_wanted(now):
            try:
                outbox.add(frames.RECORD, sid, s.record_source(), a=s.emitted, b=next(self._seq))
            except Exception as exc:  # this record only: the other streams and the lines go on
                if s.on_problem is not None:
                    s.on_problem("record", f"cannot build the process record: {exc!r}")
            s.record_sent(now)
        if closing and room:
            outbox.add(frames.CLOSE, sid)
            with self._lock:
                self.streams.pop(sid, None)
            self._closed[sid] = s  # until the writer's "closed" answer brings its last counts
            s.closed_by_pump()
        return room

    def _connect(self) -> Pipe | Local | None:
        now = time.monotonic()
        if now < self._spawn_at and self._stop_deadline is None:
            return None
        self._spawns += 1
        try:
            if self._spawns > MAX_SPAWNS:
                raise OSError(f"the drain process exited {MAX_SPAWNS} times")
            t: Pipe | Local = Pipe(self.buffer_bytes)
        except Exception as exc:
            self.warn_once(
                "local_writer",
                f"cannot run the drain process ({exc}); writing from a thread of this process "
                "instead: a hung output disk can then delay this process's exit",
            )
            t = Local(self.buffer_bytes)
        self._transport = t
        self._outbox.clear()
        for s in list(self.streams.values()):
            s.announced = False  # OPEN (resuming its file, after a lost drain) in the next _frame
            s.sent_emitted = -1  # restate the count to the new writer
            s.record_due = s.record_source is not None
        self._sync_sent = min(self._sync_sent, self._synced)
        return t

    def _lost(self, t: Pipe | Local) -> None:
        """The drain died: what it had not written is gone (and reported dropped by the next one)."""
        t.close()
        self._transport = None
        self._outbox.clear()
        self._closed.clear()
        self._spawn_at = time.monotonic() + RESPAWN_AFTER_S * (self._spawns - 1)  # the first at once
        self.warn_once(
            "drain_exit",
            f"the capture drain process {t.pid} exited; starting another (lines it had not written "
            "yet are counted as dropped)",
        )

    def _take_messages(self, t: Pipe | Local | None) -> None:
        if t is None:
            return
        msgs, eof = t.messages()
        self._on_messages(msgs)
        if eof and self._stop_deadline is None:
            self._lost(t)

    def _on_messages(self, msgs: list[dict[str, Any]]) -> None:
        synced = None
        for m in msgs:
            if "hello" in m and self._transport is not None:
                self._transport.pid = m["hello"]
            elif "sync" in m:
                for key, (w, d) in m.get("counts", {}).items():
                    s = self.streams.get(int(key))
                    if s is not None:
                        s.confirm(w, d)
                synced = m["sync"]
            elif "closed" in m:
                s = self._closed.pop(m["closed"], None)
                if s is not None:
                    s.confirm(*m["counts"])
                    if m.get("record_error"):
                        self._say_counts(s, str(m["record_error"]))
            elif "counts" in m:
                for key, (w, d) in m["counts"].items():
                    s = self.streams.get(int(key)) or self._closed.get(int(key))
                    if s is not None:
                        s.confirm(w, d)
            elif "warn" in m:
                self._route_warning(m)
        if synced is not None:
            with self._sync_cond:
                self._synced = max(self._synced, synced)
                self._sync_cond.notify_all()

    def _say_counts(self, s: Stream, record_error: str) -> None:
        """The stream's record could not be written: its final counts go to stderr instead (once)."""
        log.warning(
            "[rl-trace-observer] pid %s: %s: %d events written, %d dropped; the record that would say "
            "so could not be written (%s)",
            self.pid,
            s.path,
            s.written,
            s.dropped,
            record_error,
        )

    def _route_warning(self, m: dict[str, Any]) -> None:
        sid, kind, msg = m.get("sid", -1), str(m.get("warn")), str(m.get("msg"))
        s = self.streams.get(sid) or self._closed.get(sid)
        if s is not None and s.on_problem is not None:
            s.on_problem(kind, msg)
        else:
            self.warn_once(kind, msg)

    def _finish(self) -> None:
        deadline = self._stop_deadline or time.monotonic()
        try:
            with self._cycle_lock:  # no batch written in place from here on (send_inline tries it)
                with contextlib.suppress(Exception):
                    self._cycle()
                t = self._transport
                if t is not None:
                    t.finish(deadline, self._outbox, self._on_messages)
        finally:
            self._stopped.set()

    def _warn_dropping(self) -> None:
        self.warn_once(
            "backlog",
            f"the capture drain process is not keeping up (pipe full, {self.backlog_bytes >> 20} MiB "
            "waiting); newer events are dropped and counted",
        )

    def warn_once(self, kind: str, message: str) -> None:
        if kind in self._warned:
            return
        self._warned.add(kind)
        log.warning("[rl-trace-observer] pid %s: %s", self.pid, message)
