"""The step markers of one torch.profiler trace, read while planning: the steps of a run that has
no RL-Insight logs (the step rule itself is :mod:`...timeline.steps`, the report's too). Its markers
are the CPU ranges whose whole name is one of the rule's (``ProfilerStep#N``, and a
``record_function`` named ``global_step`` or ``train_batch``, which the rule prefers, as the report
does), matched without case as the report matches them.

Why a byte scan and not the format's read: planning must stay cheap, and the markers are a few
events among millions. The file is inflated once more and searched for the marker's name; only the
small objects around each hit are decoded. Times are placed as the read places them: after the
file's ``baseTimeNanoseconds``, or as absolute epoch µs (torch < 2.4), as exact decimals; relative
times with no anchor give none. (A trace a process record anchors belongs to a captured run, whose
RL-Insight logs give the steps instead: :attr:`..base.MarksSteps.markers_rank`.)
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

from ...files.sources import Source, read_content
from ...timeline.steps import NAMED_MARKERS, Marker, marker
from ...timeline.times import plausible
from ..base.chrome_hints import ABSOLUTE_US

_NAME = re.compile(
    rb'"name"\s*:\s*"(?i:ProfilerStep\s*#\s*\d+|' + b"|".join(n.encode() for n in NAMED_MARKERS) + rb')"'
)
_BASE = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)')
_TS = re.compile(rb'"ts"\s*:\s*(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)')
_DUR = re.compile(rb'"dur"\s*:\s*(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)')
_CPU = "user_annotation"  # the CPU range; a gpu_user_annotation copy is on the device clock
_MAX_OBJECT = 1 << 16  # a marker's event is a few hundred bytes
_MAX_TRIES = 64  # opening braces tried backwards from a hit (nested args, braces in strings)


def read_markers(src: Source) -> tuple[Marker, ...]:
    """The CPU step-marker ranges of one trace, in absolute ns (none when it cannot be placed)."""
    try:
        data = read_content(src).data
    except Exception:  # unreadable here: its read reports it; no windows from it
        return ()
    hits = [m.start() for m in _NAME.finditer(data)]
    if not hits:
        return ()
    base = _BASE.search(data)
    anchor = int(base.group(1)) if base else None
    out = []
    for at in hits:
        found = _event(data, at, anchor)
        if found is not None:
            out.append(found)
    return tuple(out)


def _event(data: bytes, at: int, anchor: int | None) -> Marker | None:
    """The marker whose ``"name"`` key starts at ``at``: the innermost object around it, decoded alone
    (its keys may come in any order, after a nested ``args`` too)."""
    floor, start = max(0, at - _MAX_OBJECT), at
    for _ in range(_MAX_TRIES):
        start = data.rfind(b"{", floor, start)
        if start < 0:
            return None
        end = _object_end(data, start)
        if end is None or end <= at:  # an object that closes before the name: not around it
            continue
        raw = data[start:end]
        try:
            ev = orjson.loads(raw)
        except orjson.JSONDecodeError:  # a brace inside a string: look further back
            continue
        return _marker(ev, raw, anchor) if isinstance(ev, dict) else None
    return None


def _marker(ev: dict[str, Any], raw: bytes, anchor: int | None) -> Marker | None:
    if ev.get("ph") != "X" or ev.get("cat") != _CPU or not isinstance(ev.get("name"), str):
        return None
    ts, dur = _ns(_TS.search(raw)), _ns(_DUR.search(raw))
    if ts is None or dur is None:
        return None
    if anchor is None:
        if ts < ABSOLUTE_US * 1000:  # relative µs with no anchor: the read leaves it unplaced
            return None
        anchor = 0
    if not plausible(anchor + ts):  # its reader drops it: no step window from it either
        return None
    args: dict[str, Any] = ev["args"] if isinstance(ev.get("args"), dict) else {}
    return marker(ev["name"], anchor + ts, anchor + ts + max(dur, 0), args)


def _ns(m: re.Match[bytes] | None) -> int | None:
    """A JSON number of µs as exact integer ns (the read's decimals, not a double's)."""
    if m is None:
        return None
    try:
        return int((Decimal(m.group(1).decode()) * 1000).to_integral_value())
    except (InvalidOperation, ValueError):
        return None


def _object_end(data: bytes, start: int) -> int | None:
    """The end (exclusive) of the JSON object opening at ``start``: braces counted outside strings."""
    depth, in_string, escaped = 0, False, False
    limit = min(len(data), start + _MAX_OBJECT)
    for i in range(start, limit):
        c = data[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:  # backslash
                escaped = True
            elif c == 0x22:
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c == 0x7B:
            depth += 1
        elif c == 0x7D:
            depth -= 1
            if depth == 0:
                return i + 1
    return None
