"""Time on the merged timeline: integer ns, and the one conversion from a source's µs onto it.

A format decides at read time where its times sit: absolute ns already (RL-Insight's ``ts_ns``), or
µs after an anchor (Chrome-trace JSON: ``anchor_ns + ts_us * 1000``). In the second case it may hand
the events over with that conversion still to do (``ReadResult.deferred``), because the fused fast
path (:mod:`..transform.fastpath`) does it inside its one loop over the events; every other path
calls :func:`to_ns` here. Either way each event's time is converted exactly once, and no stage calls
back into a format to do it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from msgspec import UNSET

from .model import Event

KNOWN_PHASES = frozenset("XBEiICstfbenM")
MAX_TS_NS = 1 << 62  # beyond ~146 years of epoch ns a timestamp is garbage, not a time
# No trace of a run is older than 2001-09-09 (10**18 epoch ns): an earlier time is a value in the wrong
# unit (µs, ms or s where ns were due land in January 1970) or garbage. Such an event is its own file's
# invalid value — dropped and counted there — and never moves the timeline's base (the run's window).
EARLIEST_NS = 10**18


def plausible(t: object) -> bool:
    """A wall-clock time in epoch ns that a trace of a run could hold."""
    return type(t) is int and EARLIEST_NS <= t < MAX_TS_NS


ROUNDER = 6755399441055744.0  # 1.5 * 2**52: x + R - R == round(x) for |x| < 2**51


def to_ns(
    events: list[Event], anchor_ns: int, on_metadata: Callable[[Event], None] | None = None
) -> tuple[list[Event], int]:
    """Chrome-trace events in µs after ``anchor_ns`` → absolute integer ns; returns (the events that
    could be placed, how many could not). Metadata (``M``) events are not timeline events: each goes
    to ``on_metadata`` (its names), or is left out when the format has read them already.

    The µs → ns conversion is :func:`.model.us_to_ns`, inlined: this loop runs once per event.
    """
    out: list[Event] = []
    append = out.append
    known = KNOWN_PHASES
    earliest, top = EARLIEST_NS, MAX_TS_NS
    bad = 0
    start, n = 0, len(events)
    while start < n:
        idx = start
        try:
            for idx in range(start, n):
                e = events[idx]
                ph = e.ph
                if ph == "M":
                    if on_metadata is not None:
                        on_metadata(e)
                    continue
                ts: Any = e.ts
                if ts.__class__ is float:
                    w = int(ts)
                    t = anchor_ns + w * 1000 + round((ts - w) * 1000)
                else:
                    t = anchor_ns + ts * 1000
                if not earliest <= t < top or ph not in known:
                    raise ValueError
                e.ts = t
                d: Any = e.dur
                if d is not UNSET:
                    if d.__class__ is float:
                        w = int(d)
                        d = w * 1000 + round((d - w) * 1000)
                    else:
                        d = d * 1000
                    if not 0 <= d < top:
                        raise ValueError
                    e.dur = d
                append(e)
            start = n
        except (ValueError, TypeError, OverflowError):  # drop this one event, go on after it
            bad += 1
            start = idx + 1
    return out, bad
