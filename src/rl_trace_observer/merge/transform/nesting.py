"""Slices that Perfetto would drop for overlapping their parent, found before writing and moved to a
track of their own beside their thread.

Perfetto's JSON importer keeps one stack of open slices per thread. It sorts complete (``X``) events by
start, the longer first at equal starts; a slice starting at or after the end of the slice on top of the
stack closes that one; a slice that starts inside the top one but ends after it cannot nest and is
dropped with the import error ``slice_drop_overlapping_complete_event`` (checked in the v52 engine). Real
traces have such slices: consecutive kernels of one stream overlap by ~2 µs on Hopper and Blackwell
(programmatic dependent launch), MTIA and SGLang traces overlap CPU slices, runtime calls of an invalid
tid land on the process's main thread. Dropping them would lose GPU work from the timeline and from every
figure computed on it, so :func:`to_overlap_tracks` moves each to the first *overlap track* of its thread
(``stream 7 (overlap)``, then ``(overlap 2)``, ...) where it nests — the layers Perfetto's rule peels off
one after another — and the flow events bound to it go with it. Every track then imports without errors
and ``.json`` and ``.pftrace`` outputs stay equal: the protobuf writer has no importer to drop them for it.

Times here are integer ns on any common origin. Only ``X`` events take part: ``B``/``E`` pairs are rare
in our sources and Perfetto nests them on the same stack by their order, which cannot overlap partially.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable
from operator import attrgetter
from typing import Any

from msgspec import UNSET

from ..timeline.identity import ThreadDecl, overlap_name, overlap_tid
from ..timeline.model import Event

_BY_TS = attrgetter("ts")
_FLOW_V1 = frozenset("stf")
# overlap tracks per thread: real traces need one (consecutive kernels) or two; past this many, a slice
# is dropped and counted as before (slices that all overlap each other would otherwise make a track each)
MAX_OVERLAP_LAYERS = 32


def _dur(e: Event) -> Any:
    return e.dur if e.dur is not UNSET else 0


def victims(lane: list[Event], ns: Callable[[Any], int] = int) -> list[Event]:
    """The ``X`` events of ONE thread that Perfetto would drop, in any input order.

    ``ns`` turns an event's ``ts``/``dur`` into integer ns (the fast path holds µs floats by then)."""
    lane = sorted(lane, key=_dur, reverse=True)  # two stable sorts: start, then the longer first
    lane.sort(key=_BY_TS)
    ends: list[int] = []
    out: list[Event] = []
    for e in lane:
        ts = ns(e.ts)
        end = ts + ns(_dur(e))
        while ends and ends[-1] <= ts:
            ends.pop()
        if ends and end > ends[-1]:
            out.append(e)
        else:
            ends.append(end)
    return out


def perfetto_order(lane: list[Event]) -> list[Event]:
    """One thread's ``X`` events as Perfetto's importer takes them: by start, the longer first."""
    lane = sorted(lane, key=_dur, reverse=True)
    lane.sort(key=_BY_TS)
    return lane


def layers(order: list[Event], ns: Callable[[Any], int] = int) -> list[int]:
    """The track each slice of one thread (in :func:`perfetto_order`) goes to: 0 the thread itself
    (what Perfetto keeps), ``k`` its ``k``-th overlap track, -1 none (past :data:`MAX_OVERLAP_LAYERS`).

    First fit, in Perfetto's order: a slice takes the first track where it nests. Track 0 is then
    exactly :func:`victims`' survivors, track 1 the survivors among its victims, and so on."""
    stacks: list[list[int]] = []  # per track, the ends of its open slices
    out: list[int] = []
    for e in order:
        ts = ns(e.ts)
        end = ts + ns(_dur(e))
        for k, ends in enumerate(stacks):
            while ends and ends[-1] <= ts:
                ends.pop()
            if not ends or end <= ends[-1]:
                ends.append(end)
                out.append(k)
                break
        else:
            if len(stacks) <= MAX_OVERLAP_LAYERS:
                stacks.append([end])
                out.append(len(stacks) - 1)
            else:
                out.append(-1)
    return out


def to_overlap_tracks(
    events: list[Event],
    lanes: dict[Any, list[Event]],
    ns: Callable[[Any], int],
    threads: dict[tuple[int, int], ThreadDecl],
) -> tuple[int, int, int]:
    """Move the slices of ``lanes`` that do not nest to their thread's overlap tracks (declared in
    ``threads``), with the flow events bound to them; remove from ``events`` (in place, order kept) the
    few past :data:`MAX_OVERLAP_LAYERS`. Returns (slices moved, slices dropped, tracks used)."""
    placed: dict[Any, tuple[list[int], list[int]]] = {}  # lane -> (starts, layers) in Perfetto's order
    gone: set[int] = set()
    moved = 0
    tracks: set[tuple[int, int]] = set()
    for key, lane in lanes.items():
        order = perfetto_order(lane)
        found = layers(order, ns)
        if not any(found):
            continue
        pid, tid = key
        if not isinstance(tid, int):  # not a merged thread (a pass run without identities): as Perfetto
            gone.update(id(e) for e, k in zip(order, found, strict=True) if k)
            continue
        for e, k in zip(order, found, strict=True):
            if k > 0:
                e.tid = _declare(threads, pid, tid, k, tracks)
                moved += 1
            elif k < 0:
                gone.add(id(e))
        placed[key] = ([ns(e.ts) for e in order], found)
    if placed:
        _follow_flows(events, placed, ns)
    if gone:
        events[:] = [e for e in events if id(e) not in gone]
    return moved, len(gone), len(tracks)


def _declare(
    threads: dict[tuple[int, int], ThreadDecl], pid: int, tid: int, level: int, tracks: set[tuple[int, int]]
) -> int:
    """The overlap track's tid, named after its thread and sorted right beside it."""
    new = overlap_tid(tid, level)
    if (pid, new) not in threads:
        own = threads.get((pid, tid))
        name = own.name if own is not None else f"thread {tid}"
        threads[(pid, new)] = ThreadDecl(pid, new, overlap_name(name, level), own.sort_index if own else 0)
    tracks.add((pid, new))
    return new


def _follow_flows(
    events: list[Event], placed: dict[Any, tuple[list[int], list[int]]], ns: Callable[[Any], int]
) -> None:
    """A v1 flow event binds to the slice on top of its thread's stack at its time — the last one to
    start at or before it, ended or not — or, an ``f`` without ``bp: "e"``, to the next one to start
    (Perfetto's JSON importer; :meth:`..output.pftrace.PftraceWriter._flow_v1` does the same). Where
    that slice moved, the flow event moves with it, so every arrow still lands on its slice."""
    for e in events:
        if e.ph not in _FLOW_V1:
            continue
        found = placed.get((e.pid, e.tid))
        if found is None:
            continue
        starts, where = found
        i = bisect_right(starts, ns(e.ts))
        if not (e.ph == "f" and e.bp != "e"):
            i -= 1
        if 0 <= i < len(where) and where[i] > 0:
            e.tid = overlap_tid(e.tid, where[i])  # type: ignore[arg-type]


def by_lane(events: Iterable[Event], lanes: set[tuple[Any, Any]] | None = None) -> dict[Any, list[Event]]:
    """``X`` events per (pid, tid), only for ``lanes`` when given."""
    out: dict[Any, list[Event]] = {}
    for e in events:
        if e.ph == "X":
            key = (e.pid, e.tid)
            if lanes is None or key in lanes:
                out.setdefault(key, []).append(e)
    return out


def us_to_exact_ns(us: float) -> int:
    """A fast-path output time (µs float written from integer ns, |t| < 2**47 ns) back to its ns."""
    return round(us * 1000)
