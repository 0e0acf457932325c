"""The drain process: ``python -m rl_trace_observer.capture.drain --buffer-bytes N``.

One per training process, started by its pump (:mod:`.pump`) with fork+exec, in its own session,
in the background of a ``sh`` that exits at once (or, without ``sh``, forking once itself with
``--detach``): it is nobody's direct child. Ray's ``RAY_kill_child_processes_on_worker_exit``
kills a worker's direct children when the worker exits, and the drain must outlive its training
process to finish writing after a disk thaws.

- stdin is the pipe of frames (:mod:`.frames`). The main thread only reads it into the
  :class:`.sink.Sink` queue, never touching the output disk, so the pipe is emptied even while
  every write hangs; the sink's writer thread does all file I/O.
- stdout is the pipe of messages back, one JSON object per line (``hello`` with the drain's pid,
  ``warn``, ``sync`` and ``closed`` answers with the writer's counts). Written without blocking:
  a message the training process is too slow to read is dropped, not waited for.
- stderr is ``/dev/null``: the training process logs the warnings, once per kind, in its own log.

When stdin ends (the training process closed it, exited or was killed) the writer settles what is
queued — whenever the disk lets it — rewrites the records whose counts changed, and the process
exits. SIGTERM, SIGINT or SIGHUP (:mod:`.ending`) end it the same way, after it read what the pipe
already held: nothing it was handed is lost, no write is cut, and each record it rewrites says
``events.ended_by`` (the signal). The working directory is ``/``, so a drain never keeps a mount busy.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import select
import sys
import threading
from typing import Any

from ..common.encoding import dumps_line
from . import frames
from .ending import Ending
from .sink import Sink

POLL_MS = 250  # how often a reader waiting for frames looks for an ending signal


class _Messages:
    """Lines to the training process; never blocks, stops quietly once nobody reads."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()
        self._closed = False
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)

    def __call__(self, message: dict[str, Any]) -> None:
        line = dumps_line(message)
        with self._lock:
            if self._closed:
                return
            try:
                os.write(self.fd, line)
            except BlockingIOError:
                pass  # the reader is behind: a lost ack only makes one flush() time out
            except OSError:
                self._closed = True


def _detach() -> None:
    """Fork once more and let the first process exit: the drain is then nobody's direct child."""
    if os.fork() != 0:
        os._exit(0)


def _read_frames(sink: Sink, messages: _Messages, ending: Ending) -> None:
    """Frames from stdin into the sink until it ends — or, after an ending signal, until what the
    pipe already holds is read (then the writer settles it all and the drain exits)."""
    parser = frames.Parser()
    ready = select.poll()
    ready.register(0, select.POLLIN)
    while True:
        if ending.signal is not None:
            os.set_blocking(0, False)
        elif not ready.poll(POLL_MS):
            continue  # nothing yet: look at the ending flag again
        try:
            chunk = os.read(0, 1 << 20)
        except (InterruptedError, BlockingIOError):
            if ending.signal is not None:
                break  # the pipe is empty: everything handed over is queued
            continue
        except OSError:
            break
        if not chunk:
            break
        try:
            sink.put(parser.feed(chunk))
        except frames.CorruptStream as exc:
            messages({"warn": "drain", "sid": -1, "msg": f"drain stopped reading: {exc}"})
            break


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rl_trace_observer.capture.drain", description=__doc__)
    ap.add_argument("--buffer-bytes", type=int, default=64 << 20)
    ap.add_argument("--detach", action="store_true", help="fork once more (when not started by sh)")
    args = ap.parse_args(argv)
    if args.detach:
        _detach()
    os.chdir("/")
    ending = Ending().install()  # SIGTERM & co.: write what was handed over, say so, then exit
    messages = _Messages(1)
    messages({"hello": os.getpid()})
    sink = Sink(args.buffer_bytes, messages)
    sink.ending = ending
    writer = sink.start()
    _read_frames(sink, messages, ending)
    sink.finish()
    writer.join()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # no interpreter teardown: nothing is left to flush, and it cannot hang
