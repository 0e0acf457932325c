"""Each kernel's launch, step and stage: the stage's GPU work is what its CPU work launched.

Rules, in order (the report counts the kernels each one placed):

1. ``launch``: the kernel's ``args.correlation`` equals that of a CPU runtime/driver call of the
   same process (Kineto's launch→kernel link: its ``ac2g`` flow carries the same id, and the ids
   stay in the args where a trace's flows were dropped, as in HTA's sampled traces). The step is
   the step window holding the launch, the stage the innermost stage span of the launching process
   holding it — wherever and whenever the kernel then ran.
2. ``window``: no launch found (a CUDA-graph replay outside the profiled range, a thinned trace):
   the step window and innermost stage span of the kernel's own process at the kernel's start.

A kernel no stage span covers gets stage ``none``; one outside every step window, step ``None``.
Several launches with one id in a process (two profiler sessions): the latest at or before the
kernel. "Same process" in a merged trace: a GPU sub-process's pid with its low 8 bits cleared is
its owner (:mod:`rl_trace_observer.merge.timeline.identity`); a trace we did not merge is one process.
"""

from __future__ import annotations

import bisect
import heapq
from array import array
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from .loops import NATIVE_TWIN, UNKNOWN
from .store import KernelStore

__all__ = ["LAUNCH", "NONE", "RULES", "WINDOW", "Attribution", "StageSpan", "attribute", "owner_of"]

LAUNCH, WINDOW = "launch", "window"
RULES = (LAUNCH, WINDOW)
NONE = "none"


@dataclass(frozen=True)
class StageSpan:
    pid: Any  # the merged pid of the process whose stage it is
    start_ns: int
    end_ns: int
    category: str
    name: str


@dataclass
class Attribution:
    """Per kernel (index into the store): its launch, rule, step window index and stage."""

    launch_ts: array  # type: ignore[type-arg]
    launch_end: array  # type: ignore[type-arg]
    rule: bytearray  # index into RULES
    window: array  # type: ignore[type-arg]  # index into the windows, -1: none
    stage: array  # type: ignore[type-arg]  # index into stages
    stages: list[tuple[str, str]]  # (category, name); stages[0] = (none, none)
    owner: dict[int, Any]  # per stored pid: its owner process's pid


def owner_of(pid: Any, merged: bool) -> Any:
    if not merged:
        return 0
    return pid & ~0xFF if type(pid) is int else pid


class _Segments:
    """A process's stage spans cut into disjoint pieces, each labelled with its innermost span."""

    def __init__(self, spans: list[tuple[int, int, int]]) -> None:  # (start, end, stage id)
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.ids: list[int] = []
        points = sorted({p for s, e, _ in spans for p in (s, e)})
        order = sorted(spans)
        heap: list[tuple[int, int, int, int]] = []  # (-start, end - start, end, id): innermost first
        k = 0
        for lo, hi in pairwise(points):
            while k < len(order) and order[k][0] <= lo:
                s, e, sid = order[k]
                heapq.heappush(heap, (-s, e - s, e, sid))
                k += 1
            while heap and heap[0][2] <= lo:
                heapq.heappop(heap)
            if heap:
                self._add(lo, hi, heap[0][3])

    def _add(self, lo: int, hi: int, sid: int) -> None:
        if self.ends and self.ends[-1] == lo and self.ids[-1] == sid:
            self.ends[-1] = hi
            return
        self.starts.append(lo)
        self.ends.append(hi)
        self.ids.append(sid)

    def at(self, t: int) -> int:
        i = bisect.bisect_right(self.starts, t) - 1
        return self.ids[i] if i >= 0 and t < self.ends[i] else 0


class _Windows:
    """Step windows (start, end, index) sorted by start; where they overlap, the latest started."""

    def __init__(self, spans: list[tuple[int, int, int]]) -> None:
        self.starts = [s for s, _, _ in spans]
        self.spans = spans
        self.reach: list[int] = []  # the latest end among the first k+1 windows
        for _, e, _ in spans:
            self.reach.append(max(e, self.reach[-1]) if self.reach else e)

    def at(self, t: int) -> int:
        k = bisect.bisect_right(self.starts, t) - 1
        while k >= 0 and self.reach[k] > t:
            if t < self.spans[k][1]:
                return self.spans[k][2]
            k -= 1
        return -1


_CODES = 1 << 16  # owner codes per trace (processes); a key is correlation * _CODES + owner code


class _Launches:
    """(correlation, owner) key → launch index. One dict when ids are unique; when a process
    restarted its ids (two profiler sessions), also the first of two, or all of three or more."""

    def __init__(self, store: KernelStore, code_of: dict[int, int]) -> None:
        keys = [c * _CODES + code_of[p] for p, c in zip(store.l_pid, store.l_corr)]  # noqa: B905
        n = len(keys)
        self.last: dict[int, int] = dict(zip(keys, range(n)))  # noqa: B905
        self.first: dict[int, int] | None = None
        self.many: dict[int, tuple[list[int], list[int]]] = {}
        if len(self.last) < n:
            self.first = dict(zip(reversed(keys), range(n - 1, -1, -1)))  # noqa: B905
            l_ts = store.l_ts
            multi = {k for k, count in Counter(keys).items() if count > 2}
            if multi:  # three or more sessions: every launch of those ids, found in one pass
                where: dict[int, list[int]] = defaultdict(list)
                for i, k in enumerate(keys):
                    if k in multi:
                        where[k].append(i)
                for k, which in where.items():
                    which.sort(key=l_ts.__getitem__)
                    self.many[k] = ([l_ts[i] for i in which], which)


def _pick(got: tuple[list[int], list[int]], ts: int) -> int:
    """Of the launches sharing an id: the latest at or before the kernel (else the first)."""
    times, which = got
    k = bisect.bisect_right(times, ts) - 1
    return which[k if k > 0 else 0]


def _of_two(a: int, b: int, l_ts: Any, ts: int) -> int:
    """The later of two launches that is at or before ``ts``; else the earlier one."""
    if l_ts[a] > l_ts[b]:
        a, b = b, a
    return b if l_ts[b] <= ts else a


def _stage_table(
    stage_spans: Sequence[StageSpan], merged: bool
) -> tuple[list[tuple[str, str]], dict[Any, _Segments]]:
    stages: list[tuple[str, str]] = [(NONE, NONE)]
    stage_ids: dict[tuple[str, str], int] = {}
    per_pid: dict[Any, list[tuple[int, int, int]]] = defaultdict(list)
    for s in stage_spans:
        sid = stage_ids.get((s.category, s.name))
        if sid is None:
            sid = stage_ids[(s.category, s.name)] = len(stages)
            stages.append((s.category, s.name))
        if s.end_ns > s.start_ns:
            per_pid[owner_of(s.pid, merged)].append((s.start_ns, s.end_ns, sid))
    return stages, {pid: _Segments(spans) for pid, spans in per_pid.items()}


def place(
    k_pid: Any,
    k_ts: Any,
    k_corr: Any,
    code_of: dict[int, int],
    last: dict[int, int],
    first: dict[int, int] | None,
    many: dict[int, Any],
    l_ts: Any,
    l_dur: Any,
    l_pid: Any,
    wins: list[Any],
    segs: list[Any],
    launch_ts: Any,
    launch_end: Any,
    rule: Any,
    window: Any,
    stage: Any,
    pick: Any,
    codes: int,
) -> None:
    """The per-kernel loop of :func:`attribute` (compiled twin: ``_gpu_native.place``, tested
    equal): its launch (the latest of a repeated id at or before it), then its step window and
    innermost stage at the launch (else at the kernel's start), on the launching process."""  # fmt: skip
    right = bisect.bisect_right
    for i, (p, ts, corr) in enumerate(zip(k_pid, k_ts, k_corr)):  # noqa: B905
        code = code_of[p]
        key = corr * codes + code
        li = last.get(key) if corr >= 0 else None
        if li is not None:
            if first is not None and first[key] != li:
                li = pick(many[key], ts) if key in many else _of_two(first[key], li, l_ts, ts)
            t = l_ts[li]
            code = code_of[l_pid[li]]
            launch_ts[i] = t
            launch_end[i] = t + l_dur[li]
        else:
            t = ts
            rule[i] = 1
        starts, spans, reach = wins[code]
        k = right(starts, t) - 1
        while k >= 0 and reach[k] > t:
            if t < spans[k][1]:
                window[i] = spans[k][2]
                break
            k -= 1
        seg = segs[code]
        if seg is not None:
            k = right(seg[0], t) - 1
            if k >= 0 and t < seg[1][k]:
                stage[i] = seg[2][k]


def attribute(
    store: KernelStore,
    windows: Sequence[tuple[Any, int, int]],
    stage_spans: Sequence[StageSpan],
    merged: bool,
    own_windows: dict[Any, list[tuple[int, int, int]]] | None = None,
) -> Attribution:
    """``own_windows``: per process that marks its own steps, (start, end, window index) — its
    kernels take their step from there rather than from the run's joined windows."""
    owners = {p: owner_of(store.value(p), merged) for p in {*store.k_pid, *store.l_pid}}
    codes: dict[Any, int] = {}
    code_of = {p: codes.setdefault(o, len(codes)) for p, o in owners.items()}
    # a trace without kernels (no Kineto / Proton) needs no stage lookup: skip indexing every span
    stages, segments = _stage_table(stage_spans, merged) if len(store) else ([(NONE, NONE)], {})
    local: dict[Any, list[tuple[int, int, int]]] = defaultdict(list)
    for pid, spans in (own_windows or {}).items():
        local[owner_of(pid, merged)] += spans
    everyone = _Windows([(w[1], w[2], i) for i, w in enumerate(windows)])
    by_code_windows = [everyone] * len(codes)
    by_code_segments: list[_Segments | None] = [None] * len(codes)
    for owner, c in codes.items():
        if owner in local:
            by_code_windows[c] = _Windows(sorted(local[owner]))
        by_code_segments[c] = segments.get(owner)
    n = len(store)
    out = Attribution(
        array("q", [UNKNOWN]) * n, array("q", [UNKNOWN]) * n, bytearray(n),
        array("q", [-1]) * n, array("q", [0]) * n, stages, owners,
    )  # fmt: skip
    from ...common import twins

    twin = twins.twin(NATIVE_TWIN)
    if twin is not None:
        _place_sorted(twin, store, code_of, by_code_windows, by_code_segments, out)
        return out
    launches = _Launches(store, code_of)
    wins = [(w.starts, w.spans, w.reach) for w in by_code_windows]
    segs = [(g.starts, g.ends, g.ids) if g is not None else None for g in by_code_segments]
    place(
        store.k_pid, store.k_ts, store.k_corr, code_of, launches.last, launches.first, launches.many,
        store.l_ts, store.l_dur, store.l_pid, wins, segs,
        out.launch_ts, out.launch_end, out.rule, out.window, out.stage, _pick, _CODES,
    )  # fmt: skip
    return out


def _flat(sets: Sequence[Any], columns: Any) -> tuple[array, list[array]]:  # type: ignore[type-arg]
    """Per code, the index of its set (-1: none); the sets' columns end to end with their offsets."""
    index: dict[int, int] = {}
    which = array("q", [-1]) * len(sets)
    offsets, cols = array("q", [0]), None
    for code, s in enumerate(sets):
        if s is None:
            continue
        if id(s) not in index:
            index[id(s)] = len(offsets) - 1
            got = columns(s)
            cols = (
                [array("q", c) for c in got]
                if cols is None
                else [a + array("q", c) for a, c in zip(cols, got, strict=True)]
            )
            offsets.append(offsets[-1] + len(got[0]))
        which[code] = index[id(s)]
    return which, [offsets, *(cols or [])]


def _place_sorted(
    twin: Any,
    store: KernelStore,
    code_of: dict[int, int],
    wins: list[_Windows],
    segs: list[_Segments | None],
    out: Attribution,
) -> None:
    """:func:`place` through the compiled twin's ``place_sorted`` (tested equal): launches found by a
    binary search of (process, id, time) instead of per-kernel dict lookups of boxed keys."""

    def window_columns(w: _Windows) -> Any:
        return (*zip(*w.spans, strict=True), w.reach) if w.spans else ([], [], [], [])

    code_wins, w_cols = _flat(wins, window_columns)
    code_segs, s_cols = _flat(segs, lambda g: (g.starts, g.ends, g.ids))
    if len(s_cols) == 1:
        s_cols += [array("q")] * 3
    if len(w_cols) == 1:
        w_cols += [array("q")] * 4
    twin.place_sorted(
        twin.codes_of(store.k_pid, code_of), store.k_ts, store.k_corr,
        twin.codes_of(store.l_pid, code_of), store.l_corr, store.l_ts, store.l_dur,
        code_wins, *w_cols, code_segs, *s_cols,
        out.launch_ts, out.launch_end, out.rule, out.window, out.stage,
    )  # fmt: skip
