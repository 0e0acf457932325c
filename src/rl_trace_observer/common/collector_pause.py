"""Bulk object building without Python's cyclic garbage collector running through it.

A report over a 1M-event step builds millions of small objects that all stay alive until it ends
(spans, rows, intervals). Every few hundred allocations the collector wakes and, as the heap grows,
walks every one of them again: 37 % of a 1M-event report's CPU (18.7 → 11.8 s measured on the watch
bench's piece). Nothing the report builds is a reference cycle that must be freed while it runs, so
it runs with the collector paused, and the collector resumes (if it ran before) when the last
pause ends. Reference counting still frees everything that is not a cycle, as always.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_state = {"depth": 0, "resume": False}


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic collector for the block; nested and concurrent pauses (the watch answers
    while its dashboard serves) resume it only when the last one ends, and only if it ran before."""
    with _lock:
        if _state["depth"] == 0:
            _state["resume"] = gc.isenabled()
            gc.disable()
        _state["depth"] += 1
    try:
        yield
    finally:
        with _lock:
            _state["depth"] -= 1
            if _state["depth"] == 0 and _state["resume"]:
                gc.enable()
