"""The step markers of one RL-Insight event log, read while planning (the step rule itself is
:mod:`...timeline.steps`, shared with the report).

Only lines that name a marker are parsed, so a long log costs one byte search."""

from __future__ import annotations

import orjson

from ...files.sources import Source
from ...timeline.steps import NAMED_MARKERS, Marker, marker
from ...timeline.times import plausible

_NEEDLES = tuple(f'"name":"{name}"'.encode() for name in NAMED_MARKERS)


def read_markers(src: Source) -> tuple[Marker, ...]:
    """The step markers of one event log (``capture``'s JSONL: ``ts_ns``/``dur_ns`` exact); a line
    that does not parse (cut by a kill) is skipped, as the log's reader skips it."""
    try:
        with src.open() as f:
            data = f.read()
    except Exception:  # unreadable here: its reader reports it; no windows from it
        return ()
    if not any(needle in data for needle in _NEEDLES):
        return ()
    out = []
    for line in data.splitlines():
        if not any(needle in line for needle in _NEEDLES):
            continue
        try:
            ev = orjson.loads(line)
            name, ts, dur = ev["name"], ev["ts_ns"], ev["dur_ns"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue
        if (
            ev.get("ph") != "X"
            or not isinstance(name, str)
            or not plausible(ts)  # a time its reader drops (a unit read wrong): no step window from it
            or not isinstance(dur, int)
        ):
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        found = marker(name, ts, ts + max(dur, 0), args)
        if found is not None:
            out.append(found)
    return tuple(out)
