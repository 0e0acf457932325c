"""The two ends the pump writes to: a drain process over two pipes, or the writer as a thread.

:class:`Pipe` starts the drain (fork+exec of ``sys.executable -m rl_trace_observer.capture.drain``
through ``sh``, never a bare fork of the training process) and speaks to it over a non-blocking
pipe of frames out and a pipe of JSON messages back; :class:`Local` runs the same writer
(:class:`.sink.Sink`) as a thread of this process when no drain can run. Both are driven by the pump
(:mod:`.pump`), which decides when to start, replace or finish them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import subprocess
import sys
import time
from collections import deque
from typing import Any

from ..common.encoding import loads
from . import frames
from .ending import detached_command
from .sink import Sink

PIPE_BYTES = 1 << 20  # asked for (Linux caps it at /proc/sys/fs/pipe-max-size, 1 MiB by default)
DRAIN_MODULE = "rl_trace_observer.capture.drain"


class Pipe:
    """The drain process at the other end of two pipes (frames out, messages back)."""

    def __init__(self, buffer_bytes: int) -> None:
        if not sys.executable:
            raise OSError("sys.executable is empty (embedded interpreter)")
        r, w = os.pipe()
        mr, mw = os.pipe()
        try:
            with contextlib.suppress(OSError):
                fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
            launcher = subprocess.Popen(
                _launch_command(buffer_bytes),
                stdin=r,
                stdout=mw,
                stderr=subprocess.DEVNULL,
                close_fds=True,
                start_new_session=True,  # out of the training process's group and session
                cwd="/",
            )
        except BaseException:
            for fd in (w, mr):
                os.close(fd)
            raise
        finally:
            os.close(r)
            os.close(mw)
        for fd in (w, mr):
            os.set_blocking(fd, False)
        self.w: int | None = w
        self.mr: int | None = mr
        self.pid: int | None = None  # the drain's, from its hello (the launcher exits at once)
        self._out = frames.PipeOut(w)
        self._tail = b""
        self._launcher: subprocess.Popen[bytes] | None = launcher  # reaped without waiting for it

    def send(self, outbox: frames.Outbox) -> bool:
        """Write what the pipe takes; False when the drain is gone."""
        if self.w is None:
            return False
        try:
            self._out.write(outbox)
        except OSError:  # EPIPE: the drain exited
            return False
        return True

    def messages(self) -> tuple[list[dict[str, Any]], bool]:
        """Messages that arrived, and whether the drain has closed its end (exited)."""
        out: list[dict[str, Any]] = []
        if self._launcher is not None and self._launcher.poll() is not None:
            self._launcher = None
        if self.mr is None:
            return out, True
        eof = False
        while True:
            try:
                chunk = os.read(self.mr, 65536)
            except BlockingIOError:
                break
            except OSError:
                eof = True
                break
            if not chunk:
                eof = True
                break
            self._tail += chunk
        if self._tail:
            *lines, self._tail = self._tail.split(b"\n")
            for line in lines:
                with contextlib.suppress(ValueError):
                    out.append(loads(line))
        return out, eof

    def finish(self, deadline: float, outbox: frames.Outbox, on_messages: Any) -> None:
        """Exit: hand over the outbox, close our end, let the drain settle — until ``deadline``."""
        while outbox and self.w is not None and time.monotonic() < deadline:
            if not self.send(outbox):
                break
            if outbox:
                _poll(self.w, select.POLLOUT, deadline)
        self.close_write()
        while self.mr is not None and time.monotonic() < deadline:
            _poll(self.mr, select.POLLIN, deadline)
            msgs, eof = self.messages()
            on_messages(msgs)
            if eof:
                break
        self.close()

    def close_write(self) -> None:
        if self.w is not None:
            with contextlib.suppress(OSError):
                os.close(self.w)
            self.w = None

    def close(self) -> None:
        self.close_write()
        if self.mr is not None:
            with contextlib.suppress(OSError):
                os.close(self.mr)
            self.mr = None


def _launch_command(buffer_bytes: int) -> list[str]:
    """The drain's command line. Through ``sh``, which starts it in the background and exits at
    once: within a millisecond the drain is nobody's direct child (Ray kills a worker's direct
    children when the worker exits, and a Python launcher would take its start-up time to detach).
    A background job's stdin is /dev/null, before its own redirections: the pipe goes through fd 3."""
    drain = [sys.executable, "-m", DRAIN_MODULE, "--buffer-bytes", str(buffer_bytes)]
    command = detached_command(drain)
    return command if command is not drain else [*drain, "--detach"]  # no shell: it forks itself


class Local:
    """The writer as a thread of this process: the fallback when no drain process can run."""

    pid = None

    def __init__(self, buffer_bytes: int) -> None:
        self._inbox: deque[dict[str, Any]] = deque()
        self._parser = frames.Parser()
        self.sink = Sink(buffer_bytes, self._inbox.append)
        self.sink.start()

    def send(self, outbox: frames.Outbox) -> bool:
        self.sink.put(self._parser.feed(outbox.take_all()))
        return True

    def messages(self) -> tuple[list[dict[str, Any]], bool]:
        out = []
        while self._inbox:
            out.append(self._inbox.popleft())
        return out, False

    def finish(self, deadline: float, outbox: frames.Outbox, on_messages: Any) -> None:
        self.send(outbox)
        self.sink.finish()
        if self.sink.thread is not None:
            self.sink.thread.join(max(0.0, deadline - time.monotonic()))
        on_messages(self.messages()[0])

    def close(self) -> None:
        self.sink.finish()


def _poll(fd: int, event: int, deadline: float) -> None:
    p = select.poll()
    p.register(fd, event)
    with contextlib.suppress(InterruptedError):
        p.poll(max(0.0, min(deadline - time.monotonic(), 0.05)) * 1000)
