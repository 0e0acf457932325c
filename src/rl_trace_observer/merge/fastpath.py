"""The common case in ONE loop: reader time conversion + constant clock offset + identity remap + the
JSON writer's µs conversion, for Chrome-JSON output with no time filters.

Why: each pass over a file costs ~0.1-0.3 µs per event in Python, as much as decoding it; the
general path (:func:`..readers.chrome_json.normalise` → :data:`..passes.PASSES` → writer) walks the
events four times. The result is identical — ``tests/test_merge_properties.py`` checks the two
paths against each other — and it stays exact: ``y = (ts_us + q) * 1000 + r`` with
``anchor + offset - base = q * 1000 + r`` recovers the integer ns the source wrote (both
operands are within 2**43 µs, the sum within ``_EXACT_NS``), then ``y / 1000`` is printed with at most
3 decimals. Events outside that range take the exact integer route.
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from .model import Event, us_to_ns
from .passes import IdentityMapper
from .readers.base import ReadResult
from .readers.chrome_json import KNOWN_PHASES, MAX_TS_NS, _metadata

_EXACT_NS = 1 << 47  # ~39 h after the base: (ts + q) * 1000 keeps sub-ns accuracy below this
_FLOWS = frozenset("stfben")


def to_output(
    events: list[Event],
    result: ReadResult,
    *,
    source_ns: bool,
    shift_ns: int,
    mapper: IdentityMapper,
) -> tuple[list[Event], list[Event], int | None, int | None]:
    """Events in source units (µs, or ns when ``source_ns``) → output µs relative to the base.

    ``shift_ns`` = anchor + clock offset − base. Returns (kept events, the flow/async ones among
    them for :func:`..passes.namespace_ids`, min and max start in ns relative to the base).
    """
    q, r = divmod(shift_ns, 1000)
    known, flows_ph, unset, exact, top = KNOWN_PHASES, _FLOWS, UNSET, _EXACT_NS, MAX_TS_NS
    out: list[Event] = []
    flows: list[Event] = []
    append, append_flow = out.append, flows.append
    cache: dict[tuple[object, object], tuple[int, int]] = {}
    last_pid: object = unset
    last_tid: object = unset
    mpid = mtid = 0
    lo, hi = exact, -exact
    bad = 0
    for e in events:
        ph = e.ph
        if ph == "M":
            result.metadata += 1
            _metadata(e, result)
            continue
        try:
            ts: Any = e.ts
            y: int = ts + shift_ns if source_ns else round((ts + q) * 1000 + r)
            if not -exact < y < exact:
                y = _exact(ts, shift_ns, source_ns)
            d: Any = e.dur
            if d is not unset:
                if not source_ns:
                    d = round(d * 1000)
                if not 0 <= d < top:
                    raise ValueError
                e.dur = d / 1000
            if ph not in known:
                raise ValueError
        except (ValueError, TypeError, OverflowError):
            bad += 1
            continue
        if y < lo:
            lo = y
        if y > hi:
            hi = y
        e.ts = y / 1000
        pid = e.pid
        tid = e.tid
        if tid != last_tid or pid != last_pid:
            key = (pid, tid)
            found = cache.get(key)
            if found is None:
                found = cache[key] = mapper.resolve(pid, tid)
            last_pid, last_tid = pid, tid
            mpid, mtid = found
        e.pid = mpid
        e.tid = mtid
        append(e)
        if ph in flows_ph or e.bind_id is not unset:
            append_flow(e)
    result.dropped += bad
    if not out:
        return out, flows, None, None
    return out, flows, lo, hi


def _exact(ts: float | int, shift_ns: int, source_ns: bool) -> int:
    """The integer route for values far from the base (or garbage, which raises)."""
    y = int(ts) + shift_ns if source_ns else us_to_ns(ts) + shift_ns
    if not -MAX_TS_NS < y < MAX_TS_NS:
        raise ValueError
    return y
