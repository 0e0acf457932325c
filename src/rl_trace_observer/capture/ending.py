"""How a capture helper process (a drain, the metric sampler) is started and how it is ended.

Started **detached**: through a ``sh`` that puts it in the background and exits at once, so within
a millisecond it is nobody's direct child. Measured with Ray 2.60's defaults on a local cluster
(issue 34): when a worker exits (its actor returns from ``exit_actor``, or is ``ray.kill``-ed) the
worker SIGKILLs its direct children within 6–18 ms, with no SIGTERM first; a detached grandchild in
its own session is left alone (a worker that crashes kills nobody). A Python launcher would need its
whole start-up before it could detach itself, and a worker that exits in that window takes it along.

Ended by a **catchable signal** (SIGTERM, SIGINT, SIGHUP: ``kill``, ``ray stop``, a terminal that
closes), such a process notes the signal (:class:`Ending`) and ends as it would have anyway — what it
was handed is written, the file says how it ended (the sampler's ``stop`` line, the drain's record)
— instead of dying mid-write. SIGKILL cannot be caught: a file without that mark ended that way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def detached_command(argv: list[str]) -> list[str]:
    """``argv`` run in the background of a ``sh`` that exits at once (``argv`` itself without one).
    The background job's stdin would be /dev/null: the caller's stdin goes through fd 3."""
    if os.path.exists("/bin/sh"):
        return ["/bin/sh", "-c", 'exec 3<&0; exec "$0" "$@" <&3 3<&- &', *argv]
    return argv


def start_detached(argv: list[str], **popen: Any) -> subprocess.Popen[bytes]:
    """Start ``argv`` detached (own session, nobody's direct child); returns the launcher, which has
    exited or exits within milliseconds (reap it with ``wait``)."""
    return subprocess.Popen(detached_command(argv), start_new_session=True, **popen)


class Ending:
    """The first catchable ending signal this process got (its name), and an event set by it.

    The handler only records: the process's own loop decides when to stop (it is never interrupted
    in the middle of a write)."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self.event = threading.Event()

    def install(self) -> Ending:
        """Handle :data:`SIGNALS` (main thread only; elsewhere nothing is installed)."""
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.signal is None:
            self.signal = signal.Signals(signum).name
        self.event.set()


def python_module(module: str, *args: str) -> list[str]:
    """The command line of ``python -m module args`` with this interpreter."""
    return [sys.executable, "-m", module, *args]
