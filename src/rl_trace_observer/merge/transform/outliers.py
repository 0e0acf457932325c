"""Events whose time lies far from the rest of their own file: left out, so one absurd timestamp never
stretches the run's window for every other file.

A file records one stretch of one process's life: hours, days, at most weeks. An event more than
:data:`SPREAD_NS` from the median start of its file's events (or a slice that long) is a value in the
wrong unit or garbage — a log line with ``ts_ns`` in µs lands in 1970, one in ns where µs were due
70 years on. Times before 2001 are refused earlier, by every reader (``timeline.times.EARLIEST_NS``);
this catches what lies in range but not with its file. Whole files far from each other (a stale file
in a run directory) are not outliers: each is judged against itself.

Judged on the listed passes' absolute ns; the fused fast path, which converts times as it goes, hands a
file whose starts spread wider than :data:`SPREAD_NS` (or that has a slice over 2**50 ns) to the listed
passes instead (:class:`SpreadOut`), so both paths drop the same events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from msgspec import UNSET

from ..timeline.model import Event

__all__ = ["OUTLIERS", "SPREAD_NS", "SpreadOut", "far_from_the_rest"]

OUTLIERS = "time_outliers"  # the stats key (manifest: counted with the file's dropped events)
SPREAD_NS = 92 * 86_400 * 10**9  # a quarter of a year: longer than any one process's recording


class SpreadOut(Exception):
    """The fused path met a file whose times spread too far to judge as it goes: redo it with the
    listed passes (rare: only files with an outlier, or that really span a quarter of a year)."""


def far_from_the_rest(events: list[Event], ns: Callable[[Any], int] = int) -> set[int]:
    """``id()`` of the events starting more than :data:`SPREAD_NS` from the median start of
    ``events``, or lasting longer than that; nothing when the starts span less and no slice is that long."""
    if ns is int:  # the listed passes' times are int ns already: no call per event
        starts = [e.ts for e in events if e.ts is not UNSET]
        longest = max((e.dur for e in events if e.dur is not UNSET), default=0)
    else:
        starts = [ns(e.ts) for e in events if e.ts is not UNSET]
        longest = max((ns(e.dur) for e in events if e.dur is not UNSET), default=0)
    if not starts:
        return set()
    if max(starts) - min(starts) <= SPREAD_NS and longest <= SPREAD_NS:
        return set()
    starts.sort()
    mid = starts[(len(starts) - 1) // 2]
    return {
        id(e)
        for e in events
        if e.ts is not UNSET
        and (abs(ns(e.ts) - mid) > SPREAD_NS or (e.dur is not UNSET and ns(e.dur) > SPREAD_NS))
    }
