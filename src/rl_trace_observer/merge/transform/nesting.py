"""Slices that Perfetto would drop for overlapping their parent, found (and dropped) before writing.

Perfetto's JSON importer keeps one stack of open slices per thread. It sorts complete (``X``) events by
start, the longer first at equal starts; a slice starting at or after the end of the slice on top of the
stack closes that one; a slice that starts inside the top one but ends after it cannot nest and is
dropped with the import error ``slice_drop_overlapping_complete_event`` (checked in the v52 engine). Real
Kineto traces have such slices (GPU kernels that overlap by a few ns, runtime calls of an invalid tid
that Perfetto puts on the process's main thread). Dropping exactly those ourselves makes the merged
trace import without errors and keeps ``.json`` and ``.pftrace`` outputs equal: the protobuf writer has
no importer to drop them for it.

Times here are integer ns on any common origin. Only ``X`` events take part: ``B``/``E`` pairs are rare
in our sources and Perfetto nests them on the same stack by their order, which cannot overlap partially.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from operator import attrgetter
from typing import Any

from msgspec import UNSET

from ..timeline.model import Event

_BY_TS = attrgetter("ts")


def _dur(e: Event) -> Any:
    return e.dur if e.dur is not UNSET else 0


def victims(lane: list[Event], ns: Callable[[Any], int] = int) -> list[Event]:
    """The ``X`` events of ONE thread that Perfetto would drop, in any input order.

    ``ns`` turns an event's ``ts``/``dur`` into integer ns (the fast path holds µs floats by then)."""
    lane = sorted(lane, key=_dur, reverse=True)  # two stable sorts: start, then the longer first
    lane.sort(key=_BY_TS)
    ends: list[int] = []
    out: list[Event] = []
    for e in lane:
        ts = ns(e.ts)
        end = ts + ns(_dur(e))
        while ends and ends[-1] <= ts:
            ends.pop()
        if ends and end > ends[-1]:
            out.append(e)
        else:
            ends.append(end)
    return out


def by_lane(events: Iterable[Event], lanes: set[tuple[Any, Any]] | None = None) -> dict[Any, list[Event]]:
    """``X`` events per (pid, tid), only for ``lanes`` when given."""
    out: dict[Any, list[Event]] = {}
    for e in events:
        if e.ph == "X":
            key = (e.pid, e.tid)
            if lanes is None or key in lanes:
                out.setdefault(key, []).append(e)
    return out


def drop_victims(events: list[Event], lanes: dict[Any, list[Event]], ns: Callable[[Any], int]) -> int:
    """Remove from ``events`` (in place, order kept) what :func:`victims` finds in ``lanes``."""
    gone: set[int] = set()
    for lane in lanes.values():
        gone.update(map(id, victims(lane, ns)))
    if gone:
        events[:] = [e for e in events if id(e) not in gone]
    return len(gone)


def us_to_exact_ns(us: float) -> int:
    """A fast-path output time (µs float written from integer ns, |t| < 2**47 ns) back to its ns."""
    return round(us * 1000)
