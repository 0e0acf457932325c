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
from operator import attrgetter
from typing import Any

from .model import StepWindow, WorkSpan, natural

_end = attrgetter("end_ns")
_start = attrgetter("start_ns")

GAP = "gap"
WHAT_IF_PCT = (10, 25, 50)
MAX_SEGMENTS = 200


def _path(spans: list[WorkSpan], w: StepWindow) -> list[dict[str, Any]]:
    lo, hi = w.start_ns, w.end_ns
    order = {lane: i for i, lane in enumerate(sorted({(s.role, s.lane) for s in spans}, key=_lane_key))}
    lane_first: dict[str, dict[str, int]] = defaultdict(dict)  # order by role, then lane: no tuple a span
    for (role, lane), i in order.items():
        lane_first[role][lane] = i

    def rank(s: WorkSpan) -> tuple[int, int, tuple[int, int, str]]:
        """Among spans of one end: the longest, then the first lane, then the first track — never the
        spans' order, which differs between a merge of the whole run and a live watch's piece."""
        return (min(s.end_ns, hi) - max(s.start_ns, lo), -order[(s.role, s.lane)], _track(s))

    # zero-length spans wait for nothing; sorted by end alone (clipping keeps that order): ties are
    # settled by ``rank`` only among the few spans of the end the walk reaches, not for every span
    live = [s for s in spans if s.start_ns < hi and s.end_ns > lo and s.end_ns > s.start_ns]
    live.sort(key=_end)
    ends = [e if e < hi else hi for e in map(_end, live)]
    segments: list[dict[str, Any]] = []
    t = hi
    while t > lo:
        k = bisect.bisect_right(ends, t) - 1
        if k < 0:
            segments.append(_segment(None, lo, t))
            break
        end = ends[k]
        first = bisect.bisect_left(ends, end, 0, k)
        s = max(reversed(_contenders(live[first : k + 1], lo, lane_first)), key=rank)  # the last of equals
        if end < t:
            segments.append(_segment(None, end, t))
        start = max(s.start_ns, lo)
        segments.append(_segment(s, start, end))
        t = start
        del live[first:], ends[first:]  # anything ending after ``start`` ran concurrently: never on the path
    segments.reverse()
    return segments


def _contenders(ending: list[WorkSpan], lo: int, lane_first: dict[str, dict[str, int]]) -> list[WorkSpan]:
    """Of spans that end together, those ``rank`` can put first, in their order: the longest
    (clipped at ``lo``), then of those the lane named first. When a step's lanes end their spans at
    one instant (a synchronous barrier, 64 lanes in the watch bench) ranking each one in full was 4 s
    of a 1M-span report; these two cheap passes leave ``rank`` a few."""
    if len(ending) < 16:
        return ending
    first = max(min(map(_start, ending)), lo)
    longest = [s for s in ending if (s.start_ns if s.start_ns > lo else lo) == first]
    if len(longest) < 16:
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
