"""The bridge from the merge's own ``Event`` structs to the pair estimator, for the formats' pairing rules.

:mod:`.pairs` estimates and :mod:`.pair_events` pairs events given as dicts; inside the merge,
events are :class:`..timeline.model.Event` structs whose ``ts``/``dur`` are integer ns (or, on the
fused fast path, still the source's µs: ``deferred``) and whose ``args`` are raw JSON. These helpers
bridge the two without parsing more than the few events that pair. Which events pair is each format's
own rule (``formats/proton/pairing.py``, ``formats/kineto/pairing.py``); the result is stacked on the
per-host correction (:func:`.correction.stack`).

Order of corrections: pairs are measured on the reader's raw timeline (anchor + µs, before any
correction), so the pair correction maps B's clock onto A's first and the host correction, shared by
both, follows: ``host(pair(ts))``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from ..timeline.model import Event, Problem, us_to_ns
from ..timeline.select import pick
from ..timeline.times import ROUNDER  # x + R - R rounds x to an integer
from .pairs import PairAlignment

__all__ = ["as_span_dicts", "by_scope", "clock_problems", "raw_ns"]


_FAST_US = float(1 << 40)  # below ~12.7 days, ts * 1000 is within 0.25 ns of the decimal written


def _ns(value: Any, anchor_ns: int, deferred: bool) -> int:
    return anchor_ns + us_to_ns(value) if deferred else int(value)


def raw_ns(times: list[Any], anchor_ns: int, deferred: bool) -> list[int]:
    """Reader times (µs after the anchor when ``deferred``, else ns) → exact absolute ns.

    One comprehension without a call per event on the usual range (TokenSpeed files count from
    their own anchor); :func:`..timeline.model.us_to_ns` beyond it.
    """
    if not deferred:
        return [int(t) for t in times]
    if times and min(times) > -_FAST_US and max(times) < _FAST_US:
        r = ROUNDER
        return [anchor_ns + int(t * 1000.0 + r - r) for t in times]
    return [anchor_ns + us_to_ns(t) for t in times]


def by_scope(ids: list[Any], times: list[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for sid, ns in zip(ids, times, strict=True):
        if sid.__class__ is int:
            found = out.get(sid)
            if found is None:
                out[sid] = [ns]
            else:
                found.append(ns)
    return out


def as_span_dicts(
    events: Iterable[Event], anchor_ns: int, *, deferred: bool, cats: Collection[str]
) -> list[dict[str, Any]]:
    """Complete events of ``cats`` as ``{"ph", "cat", "name", "ts_ns", "dur_ns"}`` for
    :func:`.pair_events.stage_pairs` (e.g. ``{"user_annotation"}`` of a Torch trace, ``{"rl_insight"}``
    of an event log). Only those events are converted: a few per stage, not the whole file."""
    out = []
    for e in pick(events, "X", cats, ("ts", "dur")):
        d: Any = e.dur
        dur = us_to_ns(d) if deferred else int(d)
        out.append(
            {"ph": "X", "cat": e.cat, "name": e.name, "ts_ns": _ns(e.ts, anchor_ns, deferred), "dur_ns": dur}
        )
    return out


def clock_problems(alignment: PairAlignment) -> list[Problem]:
    """The alignment's problems as manifest :class:`..timeline.model.Problem` entries (kind ``clock``)."""
    return [Problem("clock", str(p["path"]), str(p["detail"])) for p in alignment.problems]
