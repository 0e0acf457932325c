"""The critical path of each step across processes, and what shortening a stage would buy.

Walk back from the step's end: at each point ``t``, the span (any lane, any role) that finished last
at or before ``t`` is what the step was waiting for — it joins the path and ``t`` moves to its start
(ties: the longest span, then the lane named first, then the lowest merged pid and tid). Time
between that span's end and ``t`` in which no span finished is a ``gap`` (the driver or nothing
ran). Spans that finished while the chosen one still ran were concurrent, so not critical. The
segments tile the window: their sum is the step's wall time, exactly.

Why not follow flows: a request's client span already encloses its server span, and a weight-sync
chain (trainer ``update_weights`` → replica phases) lies on the path through its span ends; the
latest-finisher rule finds both without ids, and works on traces whose flows were lost.

What-if, per stage on the path: ``on_path_ns`` × X % is the first-order saving when that stage is
X % shorter everywhere on the path — an upper bound, reached while the path stays critical (a
concurrent branch that finished just before a path span may take over first).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

from . import interval_arrays as ia
from .model import RowTable, StepWindow, WorkSpan, natural

_end = attrgetter("end_ns")
_start = attrgetter("start_ns")

GAP = "gap"
WHAT_IF_PCT = (10, 25, 50)
MAX_SEGMENTS = 200
_FEW = 16  # spans ending together that :func:`_contenders` hands to ``rank`` without narrowing


def _path(spans: Sequence[WorkSpan], w: StepWindow) -> list[dict[str, Any]]:
    lo, hi = w.start_ns, w.end_ns
    seen = spans.lanes_seen() if isinstance(spans, RowTable) else {(s.role, s.lane) for s in spans}
    order = {lane: i for i, lane in enumerate(sorted(seen, key=_lane_key))}
    lane_first: dict[str, dict[str, int]] = defaultdict(dict)  # order by role, then lane: no tuple a span
    for (role, lane), i in order.items():
        lane_first[role][lane] = i

    def rank(s: WorkSpan) -> tuple[int, int, tuple[int, int, str]]:
        """Among spans of one end: the longest, then the first lane, then the first track — never the
        spans' order, which differs between a merge of the whole run and a live watch's piece."""
        return (min(s.end_ns, hi) - max(s.start_ns, lo), -order[(s.role, s.lane)], _track(s))

    # zero-length spans wait for nothing; sorted by end alone (clipping keeps that order): ties are
    # settled by ``rank`` only among the few spans of the end the walk reaches, not for every span
    live = _by_end(spans, lo, hi, order)
    segments: list[dict[str, Any]] = []
    t = hi
    while t > lo:
        k = live.last_ending_by(t)
        if k < 0:
            segments.append(_segment(None, lo, t))
            break
        end = live.end(k)
        first = live.first_ending_at(end, k)
        s = max(
            reversed(_contenders(live.rows(first, k + 1, lo), lo, lane_first)), key=rank
        )  # the last of equals
        if end < t:
            segments.append(_segment(None, end, t))
        start = max(s.start_ns, lo)
        segments.append(_segment(s, start, end))
        t = start
        live.keep(first)  # anything ending after ``start`` ran concurrently: never on the path
    segments.reverse()
    return segments


class _Listed:
    """The spans of a window sorted by end (stable), their ends clipped at the window's: the walk
    looks at the last ones only and drops them as it goes back."""

    def __init__(self, spans: Sequence[WorkSpan], lo: int, hi: int) -> None:
        self.live = [s for s in spans if s.start_ns < hi and s.end_ns > lo and s.end_ns > s.start_ns]
        self.live.sort(key=_end)
        self.ends = [e if e < hi else hi for e in map(_end, self.live)]

    def last_ending_by(self, t: int) -> int:
        return bisect.bisect_right(self.ends, t) - 1

    def end(self, k: int) -> int:
        return self.ends[k]

    def first_ending_at(self, end: int, k: int) -> int:
        return bisect.bisect_left(self.ends, end, 0, k)

    def rows(self, first: int, stop: int, lo: int) -> list[WorkSpan]:
        return self.live[first:stop]

    def keep(self, n: int) -> None:
        del self.live[n:], self.ends[n:]


class _Columns:
    """:class:`_Listed` over a :class:`.model.RowTable`'s arrays: the same order (numpy's stable sort),
    and rows made only for the spans :func:`_contenders` would keep of those the walk reaches (its
    two narrowings done on the columns first; they keep order, and running them again on what they
    kept keeps it all) — a 1M-span step made every row before."""

    def __init__(self, table: RowTable, lo: int, hi: int, order: dict[tuple[str, str], int]) -> None:
        import numpy as np

        self.np, self.table = np, table
        starts, ends, self.ids = table.arrays()
        picked = np.flatnonzero((starts < hi) & (ends > lo) & (ends > starts))
        self.order = picked[np.argsort(ends[picked], kind="stable")]
        del picked
        self.ends = np.minimum(ends[self.order], hi)
        self.starts = starts  # the table's, looked up for the few rows the walk reaches
        # each context's lane, as its place in ``order`` (contexts no row uses never look it up)
        self.places = np.array([order.get((c[0], c[1]), -1) for c in table.contexts] or [0], dtype=np.int64)
        self.n = len(self.order)

    def last_ending_by(self, t: int) -> int:
        return int(self.np.searchsorted(self.ends[: self.n], t, side="right")) - 1

    def end(self, k: int) -> int:
        return int(self.ends[k])

    def first_ending_at(self, end: int, k: int) -> int:
        return int(self.np.searchsorted(self.ends[:k], end, side="left"))

    def rows(self, first: int, stop: int, lo: int) -> list[WorkSpan]:
        rows = self.order[first:stop]
        if len(rows) >= _FEW:  # the longest (clipped at ``lo``), then of those the first lane
            starts = self.np.maximum(self.starts[rows], lo)
            rows = rows[starts == starts.min()]
            if len(rows) >= _FEW:
                places = self.places[self.ids[rows]]
                rows = rows[places == places.min()]
        return [self.table[i] for i in rows.tolist()]

    def keep(self, n: int) -> None:
        self.n = n


def _by_end(
    spans: Sequence[WorkSpan], lo: int, hi: int, order: dict[tuple[str, str], int]
) -> _Listed | _Columns:
    if isinstance(spans, RowTable) and spans.columnar() and ia.available(lo, hi):
        return _Columns(spans, lo, hi, order)
    return _Listed(spans, lo, hi)


def _contenders(ending: list[WorkSpan], lo: int, lane_first: dict[str, dict[str, int]]) -> list[WorkSpan]:
    """Of spans that end together, those ``rank`` can put first, in their order: the longest
    (clipped at ``lo``), then of those the lane named first. When a step's lanes end their spans at
    one instant (a synchronous barrier, 64 lanes in the watch bench) ranking each one in full was 4 s
    of a 1M-span report; these two cheap passes leave ``rank`` a few."""
    if len(ending) < _FEW:
        return ending
    first = max(min(map(_start, ending)), lo)
    longest = [s for s in ending if (s.start_ns if s.start_ns > lo else lo) == first]
    if len(longest) < _FEW:
        return longest
    places = [lane_first[s.role][s.lane] for s in longest]
    best = min(places)
    return [s for s, place in zip(longest, places, strict=True) if place == best]


def _track(s: WorkSpan) -> tuple[int, int, str]:
    """Ties after the lane: the lowest (pid, tid) wins (negated: the sort takes the last of equals),
    then the name that sorts last."""
    pid = s.pid if isinstance(s.pid, int) else 0
    tid = s.tid if isinstance(s.tid, int) else 0
    return (-pid, -tid, s.name)


def _lane_key(lane: tuple[str, str]) -> tuple[object, ...]:
    return (lane[0], natural(lane[1]))


def _segment(s: WorkSpan | None, start: int, end: int) -> dict[str, Any]:
    if s is None:
        return {
            "role": None,
            "lane": None,
            "name": GAP,
            "stage": GAP,
            "start_ns": start,
            "dur_ns": end - start,
            "trace_pid": None,
            "trace_tid": None,
        }
    return {
        "role": s.role,
        "lane": s.lane,
        "name": s.name,
        "stage": s.stage,
        "start_ns": start,
        "dur_ns": end - start,
        "trace_pid": s.pid,
        "trace_tid": s.tid,
    }


def critical_paths(spans: list[WorkSpan], windows: list[StepWindow]) -> list[dict[str, Any]]:
    """The report's ``critical_path`` section: one entry per step."""
    out = []
    for w in windows:
        segments = _path(spans, w)
        by_stage: dict[str, int] = defaultdict(int)
        for seg in segments:
            by_stage[seg["stage"]] += seg["dur_ns"]
        wall = w.end_ns - w.start_ns
        what_if = [
            {
                "stage": stage,
                "on_path_ns": ns,
                "share_pct": round(100.0 * ns / wall, 2) if wall else None,
                "saving_ns": {str(p): ns * p // 100 for p in WHAT_IF_PCT},
            }
            for stage, ns in sorted(by_stage.items(), key=lambda kv: (-kv[1], kv[0]))
            if stage != GAP
        ]
        for seg in segments:
            seg["start_ns"] -= w.start_ns  # offsets inside the step, like the gantt
        out.append(
            {
                "step": w.step,
                "start_ns": w.start_ns,
                "dur_ns": wall,
                "segments": segments[:MAX_SEGMENTS],
                "segments_total": len(segments),
                "by_stage_ns": dict(sorted(by_stage.items())),
                "what_if": what_if,
            }
        )
    return out


def sentence(step: dict[str, Any], row: dict[str, Any], pct: int = 10) -> str:
    return (
        f"step {step['step']}: if {row['stage']} were {pct} % shorter the step would be "
        f"{row['saving_ns'][str(pct)] / 1e6:.1f} ms shorter ({row['on_path_ns'] / 1e6:.1f} ms on the path)"
    )
