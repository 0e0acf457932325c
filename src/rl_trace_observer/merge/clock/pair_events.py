"""Partner pairs for :mod:`.pairs`, taken from events already parsed (dicts as read from the files).

Two kinds of partners exist inside one process:

- TokenSpeed: before entering each Proton kernel scope, its VizTracer report gets a flow start
  ``{"ph": "s", "name": "viztracer->proton", "cat": "tokenspeed.proton", "id": <scope_id>}`` (real
  builds also put ``args.scope_id``); Proton's ``chrome_trace`` has the scope (``cat: "scope"``, ``ph:
  "X"``, ``args.scope_id``). Pair: VizTracer flow start (A) → Proton scope start (B), B after A.
- VERL: ``DistProfiler.annotate`` opens the RL-Insight stage span (``trace_state``) and INSIDE it the
  Torch ``record_function`` region of the same name (``cat: "user_annotation"`` in the Kineto trace).
  Pairs: stage start (A) → region start (B), B after A; region end (B) → stage end (A), B before A.

Times: an event's ``ts_ns`` when it has one (our own JSONL, normalised merge events), else
``anchor_ns + ts`` (µs, exact: :func:`.model.us_to_ns`). A scope id seen several times is paired in
time order, n-th with n-th. :func:`scan_viztracer_scope_starts` takes the flow starts from a
VizTracer report's raw bytes with a typed decode of six fields, so a merger can align a Proton file
before it has read the VizTracer report.
"""

from __future__ import annotations

import gc
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..timeline.model import BAD_JSON, us_to_ns
from .pairs import AFTER, BEFORE, Pair

__all__ = [
    "SCOPE_FLOW_CAT",
    "SCOPE_FLOW_NAME",
    "ScopeScan",
    "event_ns",
    "match_keyed",
    "proton_scope_starts",
    "scan_viztracer_scope_starts",
    "stage_pairs",
    "tokenspeed_pairs",
    "viztracer_scope_starts",
]

SCOPE_FLOW_NAME = "viztracer->proton"
SCOPE_FLOW_CAT = "tokenspeed.proton"


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def event_ns(e: Mapping[str, Any], anchor_ns: int, key: str = "ts") -> int | None:
    """Absolute ns of ``ts`` (or ``dur`` with ``key="dur"``, then ``anchor_ns`` is ignored)."""
    exact = _int(e.get(f"{key}_ns"))
    if exact is not None:
        return exact
    us = e.get(key)
    if not isinstance(us, int | float) or isinstance(us, bool) or us != us:
        return None
    return us_to_ns(us) + (anchor_ns if key == "ts" else 0)


def _scope_id(e: Mapping[str, Any], fallback_id: bool) -> int | None:
    args = e.get("args")
    sid = _int(args.get("scope_id")) if isinstance(args, Mapping) else None
    return sid if sid is not None or not fallback_id else _int(e.get("id"))


def _collect(pairs: Iterable[tuple[int | None, int | None]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for sid, ts in pairs:
        if sid is not None and ts is not None:
            out[sid].append(ts)
    return dict(out)


def viztracer_scope_starts(events: Iterable[Mapping[str, Any]], anchor_ns: int) -> dict[int, list[int]]:
    """scope_id → start ns of TokenSpeed's ``viztracer->proton`` flow starts in a VizTracer report."""
    return _collect(
        (_scope_id(e, True), event_ns(e, anchor_ns))
        for e in events
        if e.get("ph") == "s" and e.get("name") == SCOPE_FLOW_NAME and e.get("cat") == SCOPE_FLOW_CAT
    )


def proton_scope_starts(events: Iterable[Mapping[str, Any]], anchor_ns: int) -> dict[int, list[int]]:
    """scope_id → start ns of the kernel scopes in a Proton ``chrome_trace``."""
    return _collect(
        (_scope_id(e, False), event_ns(e, anchor_ns))
        for e in events
        if e.get("ph") == "X" and e.get("cat") == "scope"
    )


def match_keyed(a: Mapping[Any, list[int]], b: Mapping[Any, list[int]], order: str = AFTER) -> list[Pair]:
    """Pairs of the keys both sides have, n-th occurrence with n-th (each side in time order)."""
    out: list[Pair] = []
    append, new = out.append, tuple.__new__  # Pair's own __new__ is a Python function: 2x slower
    for key, b_times in b.items():
        a_times = a.get(key)
        if not a_times:
            continue
        if len(a_times) == 1 and len(b_times) == 1:  # the usual case: one scope per id
            append(new(Pair, (a_times[0], b_times[0], order, key)))
            continue
        for n, (ta, tb) in enumerate(zip(sorted(a_times), sorted(b_times), strict=False)):
            append(Pair(ta, tb, order, key if n == 0 else (key, n)))
    return out


def tokenspeed_pairs(viztracer_doc: Mapping[str, Any], proton_doc: Mapping[str, Any]) -> list[Pair]:
    """VizTracer flow start → Proton scope start, from the two parsed documents of one rank.

    Each document's own anchor is used (``viztracer_metadata.baseTimeNanoseconds``, top-level
    ``baseTimeNanoseconds``); a document without one raises ``ValueError``.
    """
    meta = viztracer_doc.get("viztracer_metadata")
    v_anchor = _int(meta.get("baseTimeNanoseconds")) if isinstance(meta, Mapping) else None
    p_anchor = _int(proton_doc.get("baseTimeNanoseconds"))
    if v_anchor is None or p_anchor is None:
        which = "VizTracer report" if v_anchor is None else "Proton trace"
        raise ValueError(f"{which} has no baseTimeNanoseconds: its events cannot be placed")
    viz = viztracer_scope_starts(viztracer_doc.get("traceEvents") or (), v_anchor)
    proton = proton_scope_starts(proton_doc.get("traceEvents") or (), p_anchor)
    return match_keyed(viz, proton)


@dataclass(frozen=True, slots=True)
class _Span:
    name: str
    start: int
    end: int


def _spans(events: Iterable[Mapping[str, Any]], anchor_ns: int, cats: Collection[str] | None) -> list[_Span]:
    out = []
    for e in events:
        if e.get("ph") != "X" or (cats is not None and e.get("cat") not in cats):
            continue
        ts, dur, name = event_ns(e, anchor_ns), event_ns(e, 0, "dur"), e.get("name")
        if ts is not None and dur is not None and dur >= 0 and isinstance(name, str):
            out.append(_Span(name, ts, ts + dur))
    return out


def stage_pairs(
    stages: Iterable[Mapping[str, Any]],
    regions: Iterable[Mapping[str, Any]],
    *,
    stages_anchor_ns: int = 0,
    regions_anchor_ns: int = 0,
    name_of: Callable[[str], str | None] | None = None,
    stage_cats: Collection[str] | None = None,
    region_cats: Collection[str] | None = ("user_annotation",),
) -> list[Pair]:
    """RL-Insight stage spans (A) ↔ Torch regions of the same name (B): two pairs per region.

    ``name_of`` maps a region name to its stage name (None: no partner), e.g. for renamed stages.
    A region's partner is the same-named stage it overlaps most, else the one starting nearest.
    """
    by_name: dict[str, list[_Span]] = defaultdict(list)
    for s in _spans(stages, stages_anchor_ns, stage_cats):
        by_name[s.name].append(s)
    out: list[Pair] = []
    seen: dict[str, int] = defaultdict(int)
    for r in _spans(regions, regions_anchor_ns, region_cats):
        name = name_of(r.name) if name_of is not None else r.name
        candidates = by_name.get(name) if name is not None else None
        if not candidates:
            continue

        def rank(s: _Span, r: _Span = r) -> tuple[int, int]:
            return (min(s.end, r.end) - max(s.start, r.start), -abs(s.start - r.start))

        stage = max(candidates, key=rank)
        n = seen[r.name]
        seen[r.name] += 1
        out.append(Pair(stage.start, r.start, AFTER, (r.name, n, "start")))
        out.append(Pair(stage.end, r.end, BEFORE, (r.name, n, "end")))
    return out


# ----------------------------------------------------------------------------------- raw bytes
class _Event(msgspec.Struct, gc=False):
    """Only what a flow start needs; msgspec skips every other field without building it."""

    ph: str = ""
    name: Any = None
    cat: Any = None
    ts: Any = None
    id: Any = None
    args: Any = None


class _Report(msgspec.Struct, gc=False):
    traceEvents: list[_Event] = msgspec.field(default_factory=list)
    viztracer_metadata: Any = None


_REPORT = msgspec.json.Decoder(_Report)


@dataclass
class ScopeScan:
    """What :func:`scan_viztracer_scope_starts` found: starts relative to the anchor (ns)."""

    relative: dict[int, list[int]] = field(default_factory=dict)
    anchor_ns: int | None = None
    unusable: int = 0  # flow starts without an integer scope id or a numeric ts

    def absolute(self, anchor_ns: int | None = None) -> dict[int, list[int]]:
        """Starts in absolute ns, with the file's anchor (or ``anchor_ns`` when it has none)."""
        base = self.anchor_ns if self.anchor_ns is not None else anchor_ns
        if base is None:
            raise ValueError("VizTracer report without baseTimeNanoseconds and no anchor given")
        return {k: [base + t for t in v] for k, v in self.relative.items()}


def scan_viztracer_scope_starts(data: bytes) -> ScopeScan:
    """The ``viztracer->proton`` flow starts of a VizTracer report's bytes, and its anchor.

    Why: a merger that writes a rank's Proton file first needs these few events (one per kernel
    scope) before it reads the report itself. A typed decode that keeps six fields costs a fraction
    of a full parse (~0.16 s for a 33 MB, 1M-event report). Raises ``ValueError`` on bytes that are
    not a JSON object with ``traceEvents``.
    """
    was_enabled = gc.isenabled()
    gc.disable()  # a million small objects: the collector would rescan them again and again
    try:
        report = _REPORT.decode(data)
    except BAD_JSON as exc:
        raise ValueError(f"not a readable VizTracer report: {exc}") from exc
    finally:
        if was_enabled:
            gc.enable()
    meta = report.viztracer_metadata
    scan = ScopeScan(anchor_ns=_int(meta.get("baseTimeNanoseconds")) if isinstance(meta, dict) else None)
    found: dict[int, list[int]] = {}
    name, cat, unusable = SCOPE_FLOW_NAME, SCOPE_FLOW_CAT, 0
    for e in report.traceEvents:  # one loop over every event: checks inlined (exact classes, no bools)
        if e.ph != "s" or e.name != name or e.cat != cat:
            continue
        args, ts = e.args, e.ts
        sid = args.get("scope_id") if args.__class__ is dict else None
        if sid.__class__ is not int:
            sid = e.id
        if sid.__class__ is not int or (ts.__class__ is not float and ts.__class__ is not int) or ts != ts:
            unusable += 1
            continue
        whole = int(ts)
        ns = whole * 1000 + round((ts - whole) * 1000)  # model.us_to_ns, inlined
        times = found.get(sid)
        if times is None:
            found[sid] = [ns]
        else:
            times.append(ns)
    scan.relative, scan.unusable = found, unusable
    return scan
