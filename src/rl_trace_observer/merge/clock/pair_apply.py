"""What the merge pipeline calls for per-artifact alignment, on its own ``Event`` structs.

:mod:`.pairs` estimates and :mod:`.pair_events` pairs events given as dicts; inside the merge,
events are :class:`.model.Event` structs whose ``ts``/``dur`` are integer ns (or, on the fused fast
path, still the source's µs: ``deferred``) and whose ``args`` are raw JSON. These helpers bridge the
two without parsing more than the few events that pair, and stack the result on the per-host
correction the ``correct_time`` pass applies (:class:`.passes.TimeCorrection`).

Order of corrections: pairs are measured on the reader's raw timeline (anchor + µs, before any
correction), so the pair correction maps B's clock onto A's first and the host correction, shared by
both, follows: ``host(pair(ts))``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

import msgspec
from msgspec import UNSET

from ..timeline.model import Event, Problem, us_to_ns
from ..transform.fastpath import _ROUNDER  # x + R - R rounds x to an integer
from ..transform.flowspace import scope_ids
from ..transform.passes import TimeCorrection
from .pairs import PairAlignment, PairCorrection, chain

__all__ = [
    "as_span_dicts",
    "by_scope",
    "clock_problems",
    "proton_scope_starts_of",
    "proton_scopes",
    "raw_ns",
    "stack",
    "viz_scope_starts_of",
]


class _ScopeArgs(msgspec.Struct, gc=False):
    scope_id: Any = None


_ARGS = msgspec.json.Decoder(_ScopeArgs)


_FAST_US = float(1 << 40)  # below ~12.7 days, ts * 1000 is within 0.25 ns of the decimal written


def _ns(value: Any, anchor_ns: int, deferred: bool) -> int:
    return anchor_ns + us_to_ns(value) if deferred else int(value)


def raw_ns(times: list[Any], anchor_ns: int, deferred: bool) -> list[int]:
    """Reader times (µs after the anchor when ``deferred``, else ns) → exact absolute ns.

    One comprehension without a call per event on the usual range (TokenSpeed files count from
    their own anchor); :func:`.model.us_to_ns` beyond it.
    """
    if not deferred:
        return [int(t) for t in times]
    if times and min(times) > -_FAST_US and max(times) < _FAST_US:
        r = _ROUNDER
        return [anchor_ns + int(t * 1000.0 + r - r) for t in times]
    return [anchor_ns + us_to_ns(t) for t in times]


def proton_scope_starts_of(
    events: Iterable[Event], anchor_ns: int, *, deferred: bool
) -> dict[int, list[int]]:
    """scope_id → raw start ns of the Proton kernel scopes among a file's events (``cat: "scope"``).

    ``deferred``: the events still hold the source's µs (:attr:`..readers.base.ReadResult.deferred`);
    ``anchor_ns`` is then the reader's anchor, else ignored. Events whose ``args`` do not decode, or
    carry no integer ``scope_id``, are not paired (the scope link pass skips them too).
    """
    scoped, ids = proton_scopes(events)
    return by_scope(ids, raw_ns([e.ts for e in scoped], anchor_ns, deferred))


def proton_scopes(events: Iterable[Event]) -> tuple[list[Event], list[int | None]]:
    """A Proton file's kernel scopes (``cat: "scope"`` slices with args and a time) and their
    ``args.scope_id`` s, decoded once: the scope link pass can take them as they are."""
    unset = UNSET
    scoped = [
        e for e in events if e.cat == "scope" and e.ph == "X" and e.args is not unset and e.ts is not unset
    ]
    return scoped, scope_ids(scoped)


def viz_scope_starts_of(events: list[Event], anchor_ns: int, *, deferred: bool) -> dict[int, list[int]]:
    """scope_id → raw ns of a VizTracer report's ``viztracer->proton`` flow starts (their ``id``, which
    the scope link pass matches too; ``args.scope_id`` when the id is not an integer)."""
    timed = [e for e in events if e.ts is not UNSET]
    return by_scope([_flow_scope(e) for e in timed], raw_ns([e.ts for e in timed], anchor_ns, deferred))


def _flow_scope(e: Event) -> Any:
    if e.id.__class__ is int or e.args is UNSET:
        return e.id
    try:
        return _ARGS.decode(e.args).scope_id
    except msgspec.DecodeError:
        return None


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
    unset = UNSET
    for e in [
        e for e in events if e.cat in cats and e.ph == "X" and e.ts is not unset and e.dur is not unset
    ]:
        d: Any = e.dur
        dur = us_to_ns(d) if deferred else int(d)
        out.append(
            {"ph": "X", "cat": e.cat, "name": e.name, "ts_ns": _ns(e.ts, anchor_ns, deferred), "dur_ns": dur}
        )
    return out


def stack(host: TimeCorrection, pair: PairCorrection | None) -> TimeCorrection:
    """The artifact's correction: its pair correction first, then its host's.

    Two constants stay one integer (the fused fast path keeps working); a drift line makes it a
    function (``fn``), which the ``correct_time`` pass applies per event: a caller on the fast path
    must then leave it (see the wiring in the issue-8 report).
    """
    if pair is None:
        return host
    method = f"{host.method}+pairs"
    if host.fn is None and pair.constant_ns is not None:
        return TimeCorrection(offset_ns=host.offset_ns - pair.constant_ns, method=method)
    return TimeCorrection(fn=chain(pair, host), method=method)


def clock_problems(alignment: PairAlignment) -> list[Problem]:
    """The alignment's problems as manifest :class:`.model.Problem` entries (kind ``clock``)."""
    return [Problem("clock", str(p["path"]), str(p["detail"])) for p in alignment.problems]
