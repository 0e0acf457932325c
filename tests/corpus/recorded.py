"""Event logs and process records written by the real capture layer (``Recorder``) in-process.

``Recorder`` takes the host and pid to write as, so one test can lay out processes of several
hosts — including equal pids on different hosts — without spawning them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rl_trace_observer.capture import Recorder
from rl_trace_observer.config import Config


class SetClock:
    """The injectable capture clock, with a wall clock the test sets (``None``: the real one)."""

    def __init__(self) -> None:
        self.now: int | None = None

    def wall_ns(self) -> int:
        return time.time_ns() if self.now is None else self.now

    def _shift(self) -> int:  # a set wall clock moves the other clocks along: no fake "jumps"
        return 0 if self.now is None else self.now - time.time_ns()

    def mono_ns(self) -> int:
        return time.monotonic_ns() + self._shift()

    def perf_ns(self) -> int:
        return time.perf_counter_ns() + self._shift()


class FixedClock:
    """Wall and monotonic readings a test sets; they move together, so no jump is seen unless asked."""

    def __init__(self, wall: int) -> None:
        self.wall, self.mono = wall, 10**12

    def wall_ns(self) -> int:
        return self.wall

    def mono_ns(self) -> int:
        return self.mono

    def perf_ns(self) -> int:
        return self.mono


def record_process(
    folder: Path,
    *,
    host: str,
    pid: int,
    spans: list[tuple[str, int, int, str]],
    role: str | None = "actor",
    rank: int | None = None,
    run_id: str = "run-1",
    steps: dict[int, tuple[int, int]] | None = None,
    artifacts: list[dict[str, Any]] | None = None,
    counters: list[tuple[str, float, int]] = (),  # type: ignore[assignment]
) -> Recorder:
    """Write one process's event log and record; ``spans`` are (name, start_ns, end_ns, lane)."""
    clock = SetClock()
    rec = Recorder(Config(output_dir=folder.resolve(), run_id=run_id, role=role), clock, host=host, pid=pid)
    rec.update_identity(role=role, rank=rank, world_size=None if rank is None else 2)
    for step, (begin, end) in (steps or {}).items():
        clock.now = begin
        rec.clock_snapshot("step_begin", step=step)
        clock.now = end
        rec.clock_snapshot("step_end", step=step)
    clock.now = None
    for name, start, end, lane in spans:
        rec.span(name, start, end, lane=lane)
    for name, value, wall in counters:
        rec.counter(name, value, wall_ns=wall)
    for art in artifacts or []:
        rec.register_artifact(folder / art.pop("path"), art.pop("kind"), **art)
    rec.close()
    return rec
