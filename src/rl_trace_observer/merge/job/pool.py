"""The one memory-bounded pool both executors run jobs in (this machine's merge, a Ray node's share).

Why bounded by bytes, not by count: a job holds its file's events while it runs, so at most
``INFLIGHT_BYTES`` of estimated decompressed input (and at most ``workers + 1`` jobs) are handed out
at once; a job bigger than the budget still runs, alone. Memory therefore never grows with the
number or total size of the inputs. Its workers die with the merge (:mod:`.lifeline`).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from .lifeline import init_pool_worker
from .spec import INFLIGHT_BYTES

T = TypeVar("T")
R = TypeVar("R")


class BoundedPool(Generic[T, R]):
    """``items`` through ``call`` in ``workers`` processes (``start``: the multiprocessing start method).

    ``ordered``: results come back in the items' order (the local stitcher writes in job order);
    else as they finish. ``heartbeat_s``: while nothing finishes for that long, ``None`` is yielded
    (a Ray node's driver must not think it stalled).
    """

    def __init__(
        self,
        call: Callable[[T], R],
        weight: Callable[[T], int],
        workers: int,
        start: str | None,
        *,
        ordered: bool,
        heartbeat_s: float | None = None,
        budget: int = INFLIGHT_BYTES,
    ) -> None:
        self.call, self.weight, self.workers, self.start = call, weight, workers, start
        self.ordered, self.heartbeat_s, self.budget = ordered, heartbeat_s, budget

    def run(self, items: list[T]) -> Iterator[tuple[T, R] | None]:
        mp = multiprocessing.get_context(self.start)
        queue = deque(items)
        parent = os.getpid() if self.start == "fork" else None  # else the forkserver is their parent
        with mp.Pool(self.workers, initializer=init_pool_worker, initargs=(parent,)) as pool:
            pending: deque[tuple[T, Any]] = deque()
            inflight = 0
            last = time.monotonic()
            while queue or pending:
                while (
                    queue
                    and len(pending) < self.workers + 1
                    and (not pending or inflight + self.weight(queue[0]) <= self.budget)
                ):
                    item = queue.popleft()
                    pending.append((item, pool.apply_async(self.call, (item,))))
                    inflight += self.weight(item)
                ready = pending[0] if self.ordered else next((p for p in pending if p[1].ready()), None)
                if self.heartbeat_s is not None and (ready is None or not ready[1].ready()):
                    (ready or pending[0])[1].wait(0.05)
                    if time.monotonic() - last >= self.heartbeat_s:
                        last = time.monotonic()
                        yield None
                    continue
                if ready is None:
                    pending[0][1].wait(0.05)
                    continue
                last = time.monotonic()
                pending.remove(ready)
                inflight -= self.weight(ready[0])
                yield ready[0], ready[1].get()


def start_method(*prefer: str) -> str | None:
    """The first of ``prefer`` this platform has (None: its default)."""
    methods = multiprocessing.get_all_start_methods()
    return next((m for m in prefer if m in methods), None)


__all__ = ["BoundedPool", "start_method"]
