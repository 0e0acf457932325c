"""The common case in ONE loop: the source's time conversion, a constant clock offset, the identity
remap, the JSON writer's µs conversion, phase counts, flow/async id namespacing and TokenSpeed's scope
links — for Chrome-JSON output with no time filters.

Why: each pass over a file costs ~0.1-0.5 µs per event in Python, as much as decoding it; the general
path (:func:`..timeline.times.to_ns` → :data:`.passes.PASSES` → writer) walks the events
five times and ``collections.Counter`` a sixth. For the same reason :func:`to_output` is one long
function with the hot cases inlined (a call per event costs as much as the event's work) and the rare
ones in :mod:`.flowspace`. The result is identical — ``tests/merge/test_merge_properties.py`` checks the two
paths against each other — and it stays exact: with ``anchor + offset - base = q * 1000 + r``,
``y = (ts_us + q) * 1000 + r`` recovers the integer ns the source wrote (both operands are within
2**43 µs, the sum within ``_EXACT_NS``), rounded half-to-even like ``round()`` by adding and
subtracting ``_ROUNDER`` (1.5 * 2**52, with ``r`` folded into it: the sum has a spacing of exactly 1,
so the FPU rounds for us, without a function call); ``y / 1000`` then prints with at most 3 decimals.
Events outside that range take the exact integer route. The compiled twin
(``_fastpath_native.pyx``) repeats this loop on C doubles and an event's slots, and hands this function
every file it cannot take exactly: a change here is made there too (``tests/merge/test_native_twins.py``
compares the two on random events). Metadata events were read by the format
(wherever the file puts them: a thread's or device's name decides its merged track); here they are
skipped.
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from ..formats.base import ReadResult
from ..timeline.model import FLOAT_US_EXACT_NS, Event, us_to_ns
from ..timeline.scopes import SCOPE_FLOW_CAT, SCOPE_FLOW_NAME
from ..timeline.times import KNOWN_PHASES, MAX_TS_NS, ROUNDER
from .flowbind import UNBOUND, recount
from .flowspace import SCOPE_ID_MASK, FlowSpace, scope_ends
from .nesting import by_lane, to_overlap_tracks, us_to_exact_ns
from .outliers import SPREAD_NS, SpreadOut
from .passes import _FLOW_V1, _SEQ_BITS, BAD_PID, BadIdentity, IdentityMapper, PassContext, count_overlaps

_EXACT_NS = 1 << 47  # ~39 h after the base: (ts + q) * 1000 keeps sub-ns accuracy below this
FAR_NS = FLOAT_US_EXACT_NS  # ~101.8 days: from here on the µs double cannot hold the ns
_ROUNDER = ROUNDER
_FAST_DUR = 1 << 50  # durations below this round with _ROUNDER; above, with round()
_OTHER_FLOWS = frozenset("ben")
_NO_CHAIN = object()
_NO_LANE = object()


def to_output(
    events: list[Event],
    result: ReadResult,
    *,
    source_ns: bool,
    shift_ns: int,
    mapper: IdentityMapper,
    ctx: PassContext,
    unit_ns: int = 1000,
    hold: list[Event] | None = None,
    in_order: dict[tuple[int, int], bool] | None = None,
    far: dict[int, int] | None = None,
    low_ns: int = -MAX_TS_NS,
) -> tuple[list[Event], dict[str, int], int | None, int | None]:
    """Events in source units (µs, or ns when ``source_ns``) → output units relative to the base:
    µs for Chrome JSON (``unit_ns=1000``), ns for protobuf (``unit_ns=1``, integer-valued).

    ``shift_ns`` = anchor + clock offset − base. Returns (kept events, their phase counts, min and max
    start in ns relative to the base); ``ctx.stats`` gets what the namespacing and scope passes count.
    ``hold``: TokenSpeed's scope flow starts go there untouched (their links are known only once the
    rank's Proton files are read), as :meth:`..formats.proton.pairing.RankLinks.hold_flows` would set
    them aside.
    ``in_order`` (a dict): filled with, per merged thread, whether its slices came in Perfetto's order
    (by start, the longer first), so that a writer that needs that order can skip sorting them.
    ``far`` (a dict, Chrome JSON): filled with ``id(event) -> ns`` for the events ``FAR_NS`` or more
    from the base, whose µs double no longer holds the exact ns (:data:`..timeline.model.FLOAT_US_EXACT_NS`):
    the span shards and the clock checks take their time from there; the JSON keeps the double, as
    Perfetto reads it (its nesting is checked on that value, so the output imports without errors).
    ``low_ns``: the earliest plausible time relative to the base (:data:`..timeline.times.EARLIEST_NS`):
    an event before it is dropped as an invalid value, as the other paths' :func:`..timeline.times.to_ns`
    drops it.
    """
    q, rr, scale = _time_constants(shift_ns, source_ns)
    known, unset, rounder = KNOWN_PHASES, UNSET, _ROUNDER
    exact, fast_dur, k = float(_EXACT_NS), float(_FAST_DUR), float(unit_ns)
    lower = max(-exact, float(low_ns))  # below it: the exact route, which drops what is implausible
    # a source that writes a slice when it returns (VizTracer) starts its threads in exit order
    first_mode = 2 if mapper.reader.slice_order == "exit" else 0
    out: list[Event] = []
    append = out.append
    counts: dict[str, int] = {}
    n_s = n_t = n_f = 0
    by_tid: dict[object, tuple[object, int, int, list[Any]]] = {}  # tid -> (pid, merged pid, tid, lane)
    # no lane yet: a value no event's pid or tid equals (an event without ids must still be resolved)
    last_pid: object = _NO_LANE
    last_tid: object = _NO_LANE
    prev_pid: object = _NO_LANE  # the lane before: sources often alternate between two
    prev_tid: object = _NO_LANE
    mpid = mtid = prev_mpid = prev_mtid = 0
    # nesting (see .nesting): per merged thread [mode, y, dur, end, stack, stack, first start]; mode 0
    # empty, 4 one slice, 1 slices in start order, 2 in exit order (VizTracer), 3 unsure: checked exactly
    # afterwards. The earliest start of an X or B slice tells which flow events can bind (.flowbind):
    # in start order it is the first slice's, so the common lane pays nothing for it.
    # Start order keeps the open slices' ends (stack 1); exit order the starts and ends of the slices
    # no later one has enclosed yet (stacks 1 and 2), ``end`` the last end (exit order never lowers it).
    lanes: dict[tuple[int, int], list[Any]] = {}
    unsure: set[tuple[int, int]] = set()
    lane: list[Any] = []
    prev_lane: list[Any] = []
    global_pid = mapper.owner_merged
    lo, hi = exact, -exact
    bad = long_slices = no_pid = 0
    # namespace_ids' v1 chains, inlined: {(cat, name): {id: [new id, has start, has end, events]}}
    v1, other_flows, space = _FLOW_V1, _OTHER_FLOWS, FlowSpace(ctx)
    scope_cat, scope_name, viz_scopes = SCOPE_FLOW_CAT, SCOPE_FLOW_NAME, space.viz_scopes
    scope_prefix, scope_mask, linked, unlinked = space.scope_prefix(), SCOPE_ID_MASK, 0, 0
    chains: dict[Any, dict[Any, list[int]]] = {}
    # v1 flow events that started before every slice of their lane seen so far: maybe unbound (.flowbind)
    early: list[tuple[Event, Any, list[Any]]] = []
    chain: dict[Any, list[int]] = {}
    lcat: Any = _NO_CHAIN
    lname: Any = _NO_CHAIN
    base, n, links, unpaired = ctx.namespace << _SEQ_BITS, 0, 0, 0
    scoped: list[Event] | None = [] if ctx.collect_scopes else None
    for e in events:
        ph = e.ph
        is_x = ph == "X"
        if not is_x:
            if ph == "M":
                continue
            if ph not in known:
                bad += 1
                continue
            if hold is not None and ph == "s" and e.name == scope_name and e.cat == scope_cat:
                hold.append(e)  # as it came: time, ids and links are decided when it is written
                continue
        try:
            ts: Any = e.ts
            y: Any = (ts + q) * scale + rr - rounder  # round((ts + q) * 1000 + r), see the docstring
            if lower < y < exact:
                e.ts = y / k  # (a dropped event's ts may change: it is not written)
            else:
                y = _exact(ts, shift_ns, source_ns, low_ns)
                e.ts = y / 1000 if unit_ns == 1000 else y  # int / int: correctly rounded whatever the size
                if far is not None and not -FAR_NS < y < FAR_NS:
                    far[id(e)] = y
            d: Any = e.dur
            if d is not unset:
                dn = d * scale + rounder - rounder
                if not 0.0 <= dn < fast_dur:
                    dn = round(d * scale)
                    if not 0 <= dn < MAX_TS_NS:
                        raise ValueError
                    long_slices += 1  # maybe an outlier (.outliers): the caller decides
                    e.dur = dn / 1000 if unit_ns == 1000 else dn
                else:
                    e.dur = dn / k
            else:
                dn = 0
        except (ValueError, TypeError, OverflowError):
            bad += 1
            continue
        if y < lo:
            lo = y
        if y > hi:
            hi = y
        if not is_x and e.s == "g" and (ph == "i" or ph == "I"):  # a global instant: no process of its own
            e.pid, e.tid = global_pid, 0
            counts[ph] = counts.get(ph, 0) + 1
            append(e)
            continue
        pid = e.pid
        tid = e.tid
        if tid != last_tid or pid != last_pid:
            if tid == prev_tid and pid == prev_pid:  # back to the other lane (CPU <-> GPU, say)
                last_pid, prev_pid = prev_pid, last_pid
                last_tid, prev_tid = prev_tid, last_tid
                mpid, prev_mpid = prev_mpid, mpid
                mtid, prev_mtid = prev_mtid, mtid
                lane, prev_lane = prev_lane, lane
            else:
                found = by_tid.get(tid)
                if found is None or found[0] != pid:
                    try:
                        m_pid, m_tid = mapper.resolve(pid, tid)
                    except BadIdentity:  # no process can own it: left out, counted
                        no_pid += 1
                        continue
                    state = lanes.get((m_pid, m_tid))
                    if state is None:
                        state = lanes[(m_pid, m_tid)] = [first_mode, 0, 0, -exact, [], [], exact]
                    found = by_tid[tid] = (pid, m_pid, m_tid, state)
                prev_pid, prev_tid, prev_mpid, prev_mtid = last_pid, last_tid, mpid, mtid
                prev_lane = lane
                last_pid, last_tid = pid, tid
                _, mpid, mtid, lane = found
        e.pid = mpid
        e.tid = mtid
        if is_x:
            mode = lane[0]
            if mode != 3:  # nesting, inlined (.nesting has the rule): certify the lane as it streams
                end = y + dn
                if mode == 1:
                    stk = lane[4]
                    if y > lane[1] or (y == lane[1] and dn <= lane[2]):
                        while stk and stk[-1] <= y:
                            stk.pop()
                        if stk and end > stk[-1]:
                            lane[0] = 3
                            unsure.add((mpid, mtid))
                        else:
                            stk.append(end)
                            lane[1], lane[2] = y, dn
                    else:
                        lane[0] = 3
                        unsure.add((mpid, mtid))
                        if y < lane[6]:
                            lane[6] = y
                elif mode == 2:  # exit order: this slice encloses the earlier ones that start in it
                    if y < lane[6]:
                        lane[6] = y
                    if end < lane[3]:
                        lane[0] = 3
                        unsure.add((mpid, mtid))
                    else:
                        stk = lane[4]
                        ends = lane[5]
                        while stk and stk[-1] >= y:
                            stk.pop()
                            ends.pop()
                        if ends and ends[-1] > y:
                            lane[0] = 3
                            unsure.add((mpid, mtid))
                        else:
                            stk.append(y)
                            ends.append(end)
                            lane[3] = end
                elif mode == 4:
                    _nest_other(lane, y, dn, end, mode)
                    if lane[0] == 3:
                        unsure.add((mpid, mtid))
                else:
                    lane[0], lane[1], lane[2], lane[3], lane[6] = 4, y, dn, end, y
            elif y < lane[6]:
                lane[6] = y
            if e.bind_id is not unset:
                space.bind(e)
            if scoped is not None and e.cat == "scope" and e.args is not unset:
                scoped.append(e)
            append(e)
            continue
        fid = e.id
        if ph in v1 and fid is not unset:
            cat = e.cat
            name = e.name
            if cat == scope_cat and name == scope_name:  # a scope link: in its rank's id space, not ours
                if viz_scopes is not None and ph == "s":  # link_scopes, VizTracer side
                    if isinstance(fid, int) and fid in viz_scopes:
                        e.id = scope_prefix | (fid & scope_mask)
                        linked += 1
                    else:
                        unlinked += 1
                        continue
                counts[ph] = counts.get(ph, 0) + 1
                append(e)
                continue
            if cat != lcat or name != lname:
                chain = chains.setdefault((cat, name), {})
                lcat, lname = cat, name
            # a chain: [new id, has start, has end, events]; a second start begins a new flow, more
            # ends are more links from the same start (CUDA-graph launches), as Perfetto reads them
            st = chain.get(fid)
            if ph == "s":
                n_s += 1
                if st is None or st[1]:
                    if st is not None:
                        if st[3] > 1:
                            links += st[3] - 1
                        else:
                            unpaired += st[3]
                    n += 1
                    st = chain[fid] = [base | n, True, False, 1]
                else:
                    st[1] = True
                    st[3] += 1
            elif ph == "f":
                n_f += 1
                if st is None:
                    n += 1
                    st = chain[fid] = [base | n, False, True, 1]
                else:
                    st[2] = True
                    st[3] += 1
            else:
                n_t += 1
                if st is None:
                    n += 1
                    st = chain[fid] = [base | n, False, False, 1]
                else:
                    st[3] += 1
            e.id = st[0]
            if e.bind_id is not unset:
                space.bind(e)
            if y < lane[6]:  # no slice of its lane at or before it yet: judged at the end
                early.append((e, y, lane))
            append(e)
            continue
        if (ph in v1 or ph in other_flows or e.bind_id is not unset) and not space.add(e, ph):
            continue
        if ph == "B" and y < lane[6]:  # a B slice binds flows too
            lane[6] = y
        counts[ph] = counts.get(ph, 0) + 1
        append(e)
    if long_slices or hi - lo > SPREAD_NS:  # times too far apart to judge here (.outliers)
        raise SpreadOut
    result.dropped += bad
    if no_pid:
        ctx.count(BAD_PID, no_pid)
    if in_order is not None:
        for key, st in lanes.items():
            in_order[key] = st[0] == 1 or st[0] == 4 or st[0] == 0
    if unsure:  # lanes not in start or exit order, or with an overlap: Perfetto's rule, exactly
        ns = us_to_exact_ns if unit_ns == 1000 else int
        count_overlaps(ctx, *to_overlap_tracks(out, by_lane(out, unsure), ns, mapper.threads))
    phases = {"s": n_s, "t": n_t, "f": n_f}
    gone = {id(e) for e, t, st in early if t < st[6] and (e.ph != "f" or e.bp == "e")}
    if gone:  # flow events no slice of their thread can take (.flowbind): left out, counted again
        out = _without(out, gone, phases, ctx)
        chains, links, unpaired = {None: recount(out)}, 0, 0
    space.finish(chains, links, unpaired, linked, unlinked)
    for flow_ph, c in phases.items():
        counts[flow_ph] = counts.get(flow_ph, 0) + c
    counts["X"] = len(out) - sum(counts.values())
    if scoped is not None:
        scope_ends(scoped, out, counts, ctx)
    counts = {ph: c for ph, c in counts.items() if c}
    if not out:
        return out, counts, None, None
    return out, counts, int(lo), int(hi)


def _without(out: list[Event], gone: set[int], phases: dict[str, int], ctx: PassContext) -> list[Event]:
    """``out`` without the events ``gone`` names (v1 flow events), their phases uncounted."""
    kept = []
    for e in out:
        if id(e) in gone:
            phases[e.ph] -= 1
        else:
            kept.append(e)
    ctx.count(UNBOUND, len(gone))
    return kept


def _nest_other(lane: list[Any], y: Any, dn: Any, end: Any, mode: int) -> None:
    """The rarer nesting states: a lane's second slice (which decides its order) and exit order.

    Exit order (ends never decrease: VizTracer writes a call when it returns) nests when every slice
    contains the ones before it that start inside it and starts after the end of the others."""
    if y < lane[6]:  # the lane's earliest start (.flowbind): its first slice's, unless this one's
        lane[6] = y
    if mode == 4:
        fy, fd, fe = lane[1], lane[2], lane[3]
        if y > fy or (y == fy and dn <= fd):  # start order: replay the first slice, then this one
            stk = lane[4]
            stk.append(fe)
            while stk and stk[-1] <= y:
                stk.pop()
            if stk and end > stk[-1]:
                lane[0] = 3
            else:
                stk.append(end)
                lane[0], lane[1], lane[2] = 1, y, dn
            return
        if end < fe:
            lane[0] = 3
            return
        lane[4].append(fy)
        lane[5].append(fe)
        lane[0] = 2
    elif end < lane[3]:
        lane[0] = 3
        return
    starts, ends = lane[4], lane[5]
    while starts and starts[-1] >= y:
        starts.pop()
        ends.pop()
    if ends and ends[-1] > y:
        lane[0] = 3
        return
    starts.append(y)
    ends.append(end)
    lane[3] = end


def _time_constants(shift_ns: int, source_ns: bool) -> tuple[Any, Any, Any]:
    """(q, r + _ROUNDER, scale) for ``y = (ts + q) * scale + (r + _ROUNDER) - _ROUNDER``.

    Floats for µs sources: float-with-int arithmetic and comparisons take CPython's slow paths.
    Ints for ns sources (absolute epoch ns exceed 2**53): ``ts + shift`` stays exact.
    """
    if source_ns:
        return shift_ns, _ROUNDER, 1
    q, r = divmod(shift_ns, 1000)
    return float(q), r + _ROUNDER, 1000.0


def _exact(ts: float | int, shift_ns: int, source_ns: bool, low_ns: int) -> int:
    """The integer route for values far from the base (or garbage, or implausibly early: raises)."""
    y = int(ts) + shift_ns if source_ns else us_to_ns(ts) + shift_ns
    if not (low_ns <= y < MAX_TS_NS and y > -MAX_TS_NS):
        raise ValueError
    return y
