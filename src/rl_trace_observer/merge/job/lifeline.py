"""A merge's pool workers die with it, quietly.

Why: after ``kill -9`` of a merge its workers lived on, finished their jobs, printed a BrokenPipeError
traceback each when the result could not go back, and left their part files. Now each worker asks the
kernel for SIGKILL when its parent dies (Linux ``PR_SET_PDEATHSIG``, through ctypes), exits at once if
the parent died before it asked (the parent pid check), takes the default action for SIGTERM (a
handler inherited from its parent, e.g. the watch's, would ignore ``Pool.terminate``) and for SIGPIPE —
ending without a word — instead of raising BrokenPipeError where a pipe's reader is gone. What the
killed merge left on disk carries its owner's name (:mod:`..output.owned`) and the next merge removes it.
"""

from __future__ import annotations

import ctypes
import os
import signal

from .run import init_worker

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int | None) -> None:
    """In a fresh worker: be killed when its parent dies; exit if ``parent`` (the forking merge, when
    known: a forkserver's children have the server as their parent) already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the checks below and SIGPIPE still hold
        pass
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    # a merge run inside a process with its own SIGTERM handler (``rl-trace watch``) forks workers that
    # inherit it: they then ignore the SIGTERM of ``Pool.terminate`` and the merge hangs on its exit
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if (
        parent is not None and os.getppid() != parent
    ):  # died between fork and prctl: nobody will read what we make
        os._exit(0)


def init_pool_worker(parent: int | None) -> None:
    """The pool's initializer: tied to ``parent``, then the worker's own set-up."""
    die_with_parent(parent)
    init_worker()
