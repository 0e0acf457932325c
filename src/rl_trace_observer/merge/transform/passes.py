"""The merge's passes: small, with one shape, listed in one place (``PASSES``), run in that order.

Each pass takes the events of one artifact and its :class:`PassContext` and returns the events to
keep, in their original order (passes never reorder: per-thread order is what the source wrote).
They mutate the events they are given — the reader made them for this artifact alone — and report
what they did into ``ctx.stats``.

1. ``correct_time``: the artifact's clock correction (``ts_ns -> ts_ns``; identity until clock
   alignment supplies one), applied to start and end so durations follow drift.
2. ``drop_time_outliers``: events far (a quarter of a year) from the rest of their file
   (:mod:`.outliers`): one absurd timestamp never stretches the run's window for the other files.
3. ``filter_events``: time window and minimum duration; a counter track's value held at a window's
   start is kept as a sample there (:func:`held_counter_samples`).
4. ``remap_identity``: source pid/tid to merged pid/tid (see :mod:`..timeline.identity`), declaring tracks;
   a global instant (``"s": "g"``) stays on its owner, declaring nothing.
5. ``move_overlaps``: the slices Perfetto would drop for overlapping their parent go to an overlap
   track beside their thread, with the flow events bound to them (:mod:`.nesting`).
6. ``link_scopes``: TokenSpeed's VizTracer→Proton scope flows, ended on the Proton scope with the
   same ``args.scope_id`` of the same rank; unmatched starts are dropped.
7. ``namespace_ids``: flow and async ids into this artifact's own id space, splitting ids a source
   reuses (Proton launch ids) so Perfetto never sees ``flow_duplicate_id``. A flow is one start and
   every step and end after it with its id, until the next start: Perfetto links each end to the
   start (a CUDA-graph launch has one ``s`` and one ``f`` per kernel of the graph, all with one id).
   The exception is a *run-scoped* ``bind_id`` (a string starting ``rl-trace:``, e.g. a rollout
   request's client and server spans in two processes): it gets the same id in every artifact
   (:func:`run_flow_id`, at or above 2**62, where no artifact namespace below 2**22 reaches).
8. ``drop_unbound_flows``: v1 flow events no slice of their thread can take (:mod:`.flowbind`),
   which Perfetto's JSON importer drops and a protobuf writer would give an instant of their own;
   after the ids are given, as the fused loop gives them, and the flow counts taken again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from msgspec import UNSET

from ...capture.requests import RUN_SCOPE_PREFIX
from ..clock.correction import IDENTITY, TimeCorrection
from ..formats.base import Format, ReadContext, ReadResult
from ..timeline.identity import ProcessDecl, ThreadDecl, fallback_pid, merged_tid, same_thread, sub_slot
from ..timeline.model import BAD_JSON, Event, ProcessKey
from ..timeline.scopes import SCOPE_ARGS, SCOPE_FLOW_CAT, SCOPE_FLOW_NAME
from .flowbind import UNBOUND, first_starts, recount, unbound
from .nesting import by_lane, to_overlap_tracks
from .outliers import OUTLIERS, far_from_the_rest

_FLOW_V1 = frozenset("stf")
# move_overlaps' stats keys (manifest: slices_on_overlap_tracks, overlap_tracks, slices_dropped_overlapping)
OVERLAP_MOVED, OVERLAP_TRACKS, OVERLAP_DROPPED = "overlap_moved", "overlap_tracks", "overlapping_slices"
_ASYNC = frozenset("ben")
_SEQ_BITS = 40
RUN_FLOW_BIT = 1 << 62  # run-scoped flow ids live above every artifact's space (namespaces < 2**22)


def run_flow_id(bind: Any) -> int | None:
    """The id of a run-scoped ``bind_id`` (``"rl-trace:..."``) — the same in every artifact, so a flow
    joins spans of two processes by a key both wrote (a request id), never by their times; ``None``
    for any other bind id. 62 bits of hash: a collision among a million requests is ~1e-7 likely."""
    if type(bind) is not str or not bind.startswith(RUN_SCOPE_PREFIX):
        return None
    digest = hashlib.blake2b(bind.encode(), digest_size=8).digest()
    return RUN_FLOW_BIT | (int.from_bytes(digest, "big") & (RUN_FLOW_BIT - 1))


# stats key: events left out because their pid cannot name a process (manifest ``dropped_why``)
BAD_PID = "bad_pid"
WHY_BAD_PID = "no pid, or a pid that is neither text nor a 64-bit integer"


class BadIdentity(ValueError):
    """An event whose pid is missing, or neither text nor a 64-bit integer: no process can own it
    (Perfetto's importer would put it on pid 0, a process of no file). The event is left out."""


def _names_a_process(spid: Any) -> bool:
    return type(spid) is str or (type(spid) is int and -(1 << 63) <= spid < 1 << 63)


class IdentityMapper:
    """Source (pid, tid) → merged (pid, tid) for one artifact; remembers what it declared."""

    def __init__(
        self,
        reader: Format,
        result: ReadResult,
        ctx: ReadContext,
        host: str,
        owner_merged: int,
        owner_key: ProcessKey | None,
        planned: dict[ProcessKey, int],
        fold_into_owner: bool = False,
    ) -> None:
        self.reader, self.result, self.ctx = reader, result, ctx
        self.host, self.owner_merged, self.owner_key, self.planned = host, owner_merged, owner_key, planned
        self.fold_into_owner = fold_into_owner
        self.processes: dict[int, ProcessDecl] = {}
        self.threads: dict[tuple[int, int], ThreadDecl] = {}
        self._pids: dict[Any, int] = {}

    def pid(self, spid: Any) -> int:
        merged = self._pids.get(spid)
        if merged is not None:
            return merged
        what = self.reader.process_of(spid, self.result, self.ctx)
        source_name = self.result.process_names.get(spid)
        if isinstance(what, str):
            merged = self.owner_merged + sub_slot(what)
            decl = ProcessDecl(merged, self.owner_key, what, source_name)
        elif isinstance(what, tuple):  # (OS pid, sub-process): another process's "GPU 0" on this host
            key = (
                self.owner_key if self.fold_into_owner and self.owner_key else ProcessKey(self.host, what[0])
            )
            merged = (self.planned.get(key) or fallback_pid(key)) + sub_slot(what[1])
            decl = ProcessDecl(merged, key, what[1], None)
        elif self.fold_into_owner:  # an engine worker of the owner (a rollout server): drawn as the owner
            merged = self.owner_merged
            decl = ProcessDecl(merged, self.owner_key, None, None)
        else:
            key = ProcessKey(self.host, what)
            merged = self.planned.get(key) or fallback_pid(key)
            decl = ProcessDecl(merged, key, None, source_name, self.reader.process_role(spid, self.result))
        self._pids[spid] = merged
        self.processes.setdefault(merged, decl)
        return merged

    def resolve(self, spid: Any, stid: Any) -> tuple[int, int]:
        """Raises :class:`BadIdentity` for a pid that names no process."""
        if not _names_a_process(spid):
            raise BadIdentity(spid)
        if isinstance(stid, int) and not 0 <= stid < 1 << 32:  # Perfetto puts these on the pid's thread
            stid = spid if isinstance(spid, int) and 0 <= spid < 1 << 32 else 0
        mpid = self.pid(spid)
        lane = self.reader.lane_of(spid, stid, self.result)
        mtid = merged_tid(self.reader.order, same_thread(stid) if stid is not UNSET else lane)
        if (mpid, mtid) not in self.threads:
            sort = (self.reader.order << 24) + (mtid & 0xFFFFFF)
            self.threads[(mpid, mtid)] = ThreadDecl(mpid, mtid, f"{self.reader.label} · {lane}", sort)
        return mpid, mtid


@dataclass
class PassContext:
    """Everything the passes need to know about one artifact, and what they report back."""

    correction: TimeCorrection = IDENTITY
    windows: tuple[tuple[int | None, int | None], ...] = ()  # keep events overlapping any (absolute ns)
    min_dur_ns: int = 0
    mapper: IdentityMapper | None = None
    namespace: int = 0  # this artifact's id space (< 2**23)
    scope_namespace: int = 0  # its rank group's id space for scope links (TokenSpeed)
    # the scope ids its rank's Proton files recorded; None: this artifact links no scopes
    scopes: set[int] | None = None
    collect_scopes: bool = False
    # a Proton file's scope slices and their scope ids, decoded once already (for its alignment)
    scope_ids: tuple[list[Event], list[int | None]] | None = None
    # when a set: the fused loop adds the ids of v1 flows with a start and more than one end (a protobuf
    # writer gives each extra link an id of its own; see ..output.pftrace_fused.fan_ends)
    fanned: set[int] | None = None
    stats: dict[str, int] = field(default_factory=dict)

    def count(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n


def correct_time(events: list[Event], ctx: PassContext) -> list[Event]:
    corr = ctx.correction
    if corr.is_identity:
        return events
    if corr.fn is None:
        off = corr.offset_ns
        for e in events:
            e.ts += off  # type: ignore[operator]
        return events
    negative = 0  # a correction that is not monotonic (across a wall-clock jump) can invert a span
    for e in events:
        ts: Any = e.ts
        start = corr(ts)
        if e.dur is not UNSET:
            dur = corr(ts + e.dur) - start
            if dur < 0:
                negative += 1
                dur = 0
            e.dur = dur
        e.ts = start
    if negative:
        ctx.count("negative_durations", negative)  # reported by the clock causality checks
    return events


def drop_time_outliers(events: list[Event], ctx: PassContext) -> list[Event]:
    gone = far_from_the_rest(events)
    if not gone:
        return events
    ctx.count(OUTLIERS, len(gone))
    return [e for e in events if id(e) not in gone]


def filter_events(events: list[Event], ctx: PassContext) -> list[Event]:
    min_dur = ctx.min_dur_ns
    if not ctx.windows and min_dur <= 0:
        return events
    spans = [
        (lo if lo is not None else -(1 << 63), hi if hi is not None else 1 << 63) for lo, hi in ctx.windows
    ]
    out = []
    for e in events:
        ph = e.ph
        if ph in ("B", "E"):  # an unmatched B/E would corrupt its thread: kept whole
            out.append(e)
            continue
        ts = e.ts
        end = ts + (e.dur if e.dur is not UNSET else 0)  # type: ignore[operator]
        if ph == "X" and end - ts < min_dur:  # type: ignore[operator]
            continue
        if spans and not any(ts <= hi and end >= lo for lo, hi in spans):  # type: ignore[operator]
            continue
        out.append(e)
    ctx.count("filtered", len(events) - len(out))
    held = held_counter_samples(events, ctx.windows) if spans else []
    return _with_held(out, held, ctx) if held else out


def _with_held(out: list[Event], held: list[Event], ctx: PassContext) -> list[Event]:
    """``out`` with each held sample just before the first later sample of its track (else last), so
    every counter track stays in time order."""
    ctx.count(HELD_COUNTERS, len(held))
    waiting: dict[tuple[Any, ...], list[Event]] = {}
    for c in sorted(held, key=lambda c: c.ts, reverse=True):  # type: ignore[arg-type, return-value]
        waiting.setdefault(_counter_track(c), []).append(c)
    merged: list[Event] = []
    for e in out:
        if e.ph == "C":
            mine = waiting.get(_counter_track(e))
            while mine and mine[-1].ts < e.ts:  # type: ignore[operator]
                merged.append(mine.pop())
        merged.append(e)
    merged += [c for cs in waiting.values() for c in reversed(cs)]
    return merged


HELD_COUNTERS = "held_counter_samples"


def _counter_track(e: Event) -> tuple[Any, ...]:
    return (e.pid, e.tid, e.name, e.cat, e.id)


def held_counter_samples(
    events: list[Event], windows: tuple[tuple[int | None, int | None], ...]
) -> list[Event]:
    """Each counter track's value held at each window's start: a copy of its last sample before the
    window, put at the window's start.

    Why: samplers write a series only when it changes (a gauge, a rate that stays put), so a window
    cut by time would hold no sample of a track that last changed before it, and every reader of
    the cut (the report's telemetry over a step, a view's counter track) would see nothing or only
    the later values — not what the whole run says at those times. A track with a sample exactly at
    the window's start, or whose last earlier sample is kept already (in an earlier window), needs
    no copy."""
    bounds = sorted({lo for lo, _ in windows if lo is not None})
    if not bounds:
        return []
    spans = [(lo if lo is not None else -(1 << 63), hi if hi is not None else 1 << 63) for lo, hi in windows]
    last: dict[tuple[tuple[Any, ...], int], Event] = {}  # (track, window start) -> last sample at or before
    for e in events:
        if e.ph != "C":
            continue
        ts = e.ts
        track = _counter_track(e)
        for lo in bounds:
            if ts <= lo:  # type: ignore[operator]
                prev = last.get((track, lo))
                if prev is None or prev.ts <= ts:  # type: ignore[operator]
                    last[(track, lo)] = e
    held = []
    for (_, lo), e in last.items():
        ts = e.ts
        if ts == lo or any(a <= ts <= b for a, b in spans):  # type: ignore[operator]
            continue
        held.append(msgspec.structs.replace(e, ts=lo))
    return held


def remap_identity(events: list[Event], ctx: PassContext) -> list[Event]:
    mapper = ctx.mapper
    if mapper is None:
        return events
    cache: dict[tuple[Any, Any], tuple[int, int]] = {}
    last_key: tuple[Any, Any] | None = None
    last: tuple[int, int] = (0, 0)
    global_pid = mapper.owner_merged
    gone: set[int] = set()
    for e in events:
        if e.s == "g" and e.ph in ("i", "I"):
            e.pid, e.tid = global_pid, 0
            continue
        key = (e.pid, e.tid)
        if key != last_key:
            found = cache.get(key)
            if found is None:
                try:
                    found = cache[key] = mapper.resolve(e.pid, e.tid)
                except BadIdentity:
                    gone.add(id(e))
                    continue
            last_key, last = key, found
        e.pid, e.tid = last
    if not gone:
        return events
    ctx.count(BAD_PID, len(gone))
    return [e for e in events if id(e) not in gone]


def move_overlaps(events: list[Event], ctx: PassContext) -> list[Event]:
    threads = ctx.mapper.threads if ctx.mapper is not None else {}
    count_overlaps(ctx, *to_overlap_tracks(events, by_lane(events), int, threads))
    return events


def count_overlaps(ctx: PassContext, moved: int, dropped: int, tracks: int) -> None:
    """What :func:`.nesting.to_overlap_tracks` did, for the manifest (``manifest/fill.py``)."""
    if moved:
        ctx.count(OVERLAP_MOVED, moved)
        ctx.count(OVERLAP_TRACKS, tracks)
    if dropped:
        ctx.count(OVERLAP_DROPPED, dropped)


def drop_unbound_flows(events: list[Event], ctx: PassContext) -> list[Event]:
    gone = unbound(events, first_starts(events))
    if not gone:
        return events
    kept = [e for e in events if id(e) not in gone]
    (links, unpaired), (links_now, unpaired_now) = _chain_counts(events), _chain_counts(kept)
    ctx.count("flows", links_now - links)
    ctx.count("unpaired_flow_events", unpaired_now - unpaired)
    ctx.count(UNBOUND, len(gone))
    return kept


def _chain_counts(events: list[Event]) -> tuple[int, int]:
    """(links, unpaired events) of the namespaced v1 flow chains of ``events``, as :func:`_close` counts."""
    links = unpaired = 0
    for st in recount(events).values():
        links, unpaired = _close(st, links, unpaired)
    return links, unpaired


def scope_flow_id(namespace: int, scope_id: int) -> int:
    """A scope link's id in its rank's id space (bit 39 keeps it apart from namespaced flow ids)."""
    return (namespace << _SEQ_BITS) | (1 << (_SEQ_BITS - 1)) | (scope_id & 0x7FFFFFFFFF)


def link_scopes(events: list[Event], ctx: PassContext) -> list[Event]:
    """Proton (``collect_scopes``): end a scope flow on every scope with an ``args.scope_id``, right
    where the scope is (so a protobuf writer can bind it as it writes the slice). VizTracer (``scopes``
    set): keep the flow starts whose scope Proton recorded, in the same id space; drop the others."""
    if ctx.collect_scopes:
        found = ctx.scopes if ctx.scopes is not None else set()
        ends = []
        for e in events:
            if e.cat == "scope" and e.ph == "X" and e.args is not UNSET:
                try:
                    sid = SCOPE_ARGS.decode(e.args).scope_id
                except BAD_JSON:
                    continue
                if sid is not None:
                    found.add(sid)
                    fid = scope_flow_id(ctx.scope_namespace, sid)
                    ends.append(
                        Event(
                            ph="f",
                            name=SCOPE_FLOW_NAME,
                            cat=SCOPE_FLOW_CAT,
                            pid=e.pid,
                            tid=e.tid,
                            ts=e.ts,
                            id=fid,
                            bp="e",
                        )
                    )
        ctx.scopes = found
        ctx.count("scope_ends", len(ends))
        events.extend(ends)
        return events
    if ctx.scopes is None:  # not a TokenSpeed VizTracer report: nothing to link
        return events
    out = []
    linked = 0
    for e in events:
        if e.ph != "s" or e.name != SCOPE_FLOW_NAME or e.cat != SCOPE_FLOW_CAT:
            out.append(e)
        elif isinstance(e.id, int) and e.id in ctx.scopes:
            e.id = scope_flow_id(ctx.scope_namespace, e.id)
            out.append(e)
            linked += 1
        else:
            ctx.count("unlinked_scope_flows")
    ctx.count("flows", linked)
    ctx.count("scope_links", linked)
    return out


def namespace_ids(events: list[Event], ctx: PassContext) -> list[Event]:
    """Flow v1 ids by (cat, name, id) and generation, async ids by (cat, id), bind ids by value."""
    base = ctx.namespace << _SEQ_BITS
    flows: dict[tuple[Any, Any, Any], list[int]] = {}  # key -> [new id, has start, has end, events]
    others: dict[tuple[Any, ...], int] = {}
    links = unpaired = run_ends = 0
    n = 0
    for e in events:
        ph = e.ph
        fid = e.id
        if ph in _FLOW_V1 and fid is not UNSET:
            cat = e.cat
            if cat == SCOPE_FLOW_CAT and e.name == SCOPE_FLOW_NAME:
                continue  # already placed in its rank's scope id space by link_scopes
            key = (cat, e.name, fid)
            st = flows.get(key)
            if st is None:
                n += 1
                st = flows[key] = [base | n, 0, 0, 0]
            elif ph == "s" and st[1]:  # a second start: a new flow (more ends are more links)
                links, unpaired = _close(st, links, unpaired)
                n += 1
                st[0], st[1], st[2], st[3] = base | n, 0, 0, 0
            if ph == "s":
                st[1] = 1
            elif ph == "f":
                st[2] = 1
            st[3] += 1
            e.id = st[0]
        elif ph in _ASYNC and fid is not UNSET:
            e.id = _other(others, ("a", e.cat, fid), base)
        if e.bind_id is not UNSET:
            run_id = run_flow_id(e.bind_id)
            if run_id is not None:  # paired across artifacts: counted apart
                e.bind_id = run_id
                run_ends += 1
                continue
            bid = e.bind_id = _other(others, ("b", e.bind_id), base)
            st = flows.setdefault(("bind", None, bid), [bid, 0, 1, 0])
            st[1] |= e.flow_out is True
            st[3] += 1
    for st in flows.values():
        links, unpaired = _close(st, links, unpaired)
    ctx.count("flows", links)
    ctx.count("unpaired_flow_events", unpaired)
    if run_ends:
        ctx.count("run_flow_endpoints", run_ends)
    return events


def _close(st: list[int], links: int, unpaired: int) -> tuple[int, int]:
    """A finished chain: s → t… → f makes (events − 1) flows in Perfetto; without a start, none."""
    if st[1] and st[3] > 1:
        return links + st[3] - 1, unpaired
    return links, unpaired + st[3]


def _other(table: dict[tuple[Any, ...], int], key: tuple[Any, ...], base: int) -> int:
    new = table.get(key)
    if new is None:
        new = table[key] = base | ((1 << (_SEQ_BITS - 2)) + len(table) + 1)
    return new


PASSES: tuple[Callable[[list[Event], PassContext], list[Event]], ...] = (
    correct_time,
    drop_time_outliers,
    filter_events,
    remap_identity,
    move_overlaps,
    link_scopes,
    namespace_ids,
    drop_unbound_flows,
)


def run_passes(events: list[Event], ctx: PassContext) -> list[Event]:
    for p in PASSES:
        events = p(events, ctx)
    return events
