"""Clocks as an injectable object, so tests can give a process a shifted or drifting clock.

Every timestamp in the capture layer is an integer nanosecond count that names its clock:
``wall_ns`` (``time.time_ns``, the merged timeline's clock), ``mono_ns`` (``time.monotonic_ns``,
VizTracer's clock) and ``perf_ns`` (``time.perf_counter_ns``). A snapshot reads all three together
so the merger can later see wall-clock jumps (NTP steps) between two snapshots.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


class Clock(Protocol):
    def wall_ns(self) -> int: ...

    def mono_ns(self) -> int: ...

    def perf_ns(self) -> int: ...


class SystemClock:
    """The real clocks of this host."""

    wall_ns = staticmethod(time.time_ns)
    mono_ns = staticmethod(time.monotonic_ns)
    perf_ns = staticmethod(time.perf_counter_ns)


@dataclass
class ShiftedClock:
    """A wall clock that is ``offset_ns`` ahead of the real one and drifts by ``drift_ppm``.

    Drift accumulates from the moment the clock is created, as a slow or fast oscillator would.
    Monotonic and perf counters are left untouched: only the wall clock is ever wrong across hosts.
    """

    offset_ns: int = 0
    drift_ppm: float = 0.0

    def __post_init__(self) -> None:
        self._origin_mono = time.monotonic_ns()
        self.origin_wall_ns = time.time_ns()  # the real wall clock when drift started accumulating

    def wall_ns(self) -> int:
        elapsed = time.monotonic_ns() - self._origin_mono
        return time.time_ns() + self.offset_ns + int(elapsed * self.drift_ppm * 1e-6)

    def offset_at(self, real_wall_ns: int) -> int:
        """The true offset (this clock − the real wall clock) when the real clock reads ``real_wall_ns``.

        Tests compare measured offsets against this; it is exact up to the real clock's own slewing.
        """
        return self.offset_ns + int((real_wall_ns - self.origin_wall_ns) * self.drift_ppm * 1e-6)

    def jump(self, delta_ns: int) -> None:
        """Step the wall clock by ``delta_ns`` now (an NTP step, an operator, a VM resume)."""
        self.offset_ns += delta_ns

    mono_ns = staticmethod(time.monotonic_ns)
    perf_ns = staticmethod(time.perf_counter_ns)


SYSTEM_CLOCK: Clock = SystemClock()


def snapshot(clock: Clock, reason: str, **extra: Any) -> dict[str, Any]:
    """Read the three clocks back to back; ``read_ns`` is how long the reading itself took.

    Keys in ``extra`` win over the fresh readings: ``Recorder.clock_snapshot(**earlier)`` stores a
    snapshot read earlier, e.g. on the training thread, from a thread that can afford the record
    write (``integrations.ray.clock_sync.on_step_boundary``).
    """
    p0 = clock.perf_ns()
    mono = clock.mono_ns()
    wall = clock.wall_ns()
    p1 = clock.perf_ns()
    return {
        "reason": reason,
        "wall_ns": wall,
        "mono_ns": mono,
        "perf_ns": p0,
        "read_ns": p1 - p0,
        **extra,
    }


def wall_minus_mono_ns(
    reads: int = 3,
    wall: Callable[[], int] = time.time_ns,
    mono: Callable[[], int] = time.monotonic_ns,
) -> int:
    """``time.time_ns() - time.monotonic_ns()`` at one instant, for turning monotonic stamps (vLLM's
    engine times) into wall ns. Two plain reads are off by however long the thread was paused between
    them; a bracket (monotonic, wall, monotonic) bounds that pause, and the tightest of ``reads``
    brackets is kept (seen: a 450 µs pause on a loaded 2-core machine put a request's engine phases
    before the request began)."""
    best_gap = best = 0
    for n in range(max(1, reads)):
        m0 = mono()
        w = wall()
        m1 = mono()
        if n == 0 or m1 - m0 < best_gap:
            best_gap, best = m1 - m0, w - (m0 + m1) // 2
    return best
