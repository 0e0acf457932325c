"""A perf trace with no anchor, placed on its own process's session file: an offset and its bound.

AReaL's perf trace counts ``ts`` from ``perf_counter_ns()`` at ``configure()``: no absolute time. Its
session file, written by the same process, is wall clock. What both files carry: AReaL's rollout
batch spans (``workflow_executor.rollout_batch`` / ``rollout_controller.rollout_batch``, perf
trace) submit their sessions and wait for them, so every session of that process — from submit to
finalize (session file) — lies inside one of them. Each session ``s`` then allows the offsets ``d``
(wall − perf) with ``start_j + d <= submit_s`` and ``finalize_s <= end_j + d`` for some batch ``j``;
the offsets every session allows form the answer. Its middle is the estimate and its half-width the
bound: the true offset is within it whenever the containment holds (it cannot be tighter than how
soon the first session was submitted after its batch began plus how soon the last one finished
before its batch returned). No batch span, sessions no offset can fit into batches, or several
separate offsets that fit are each said in the manifest (``clock``), never silently guessed.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

CONTAINER_SUFFIX = ".rollout_batch"  # AReaL's synchronous rollout: submit every task, wait for them

Interval = tuple[int, int]


@dataclass(frozen=True)
class Bracket:
    ranges: tuple[Interval, ...]  # the separate offset ranges (wall − perf, ns) every session allows
    sessions: int
    containers: int

    def pick(self, guess: int) -> Interval:
        """The range holding ``guess``, else the nearest one (only asked when there are several)."""
        return min(
            self.ranges,
            key=lambda r: 0 if r[0] <= guess <= r[1] else min(abs(r[0] - guess), abs(r[1] - guess)),
        )


def middle(r: Interval) -> tuple[int, int]:
    """(estimate, bound): the middle of a range and its half-width."""
    return (r[0] + r[1]) // 2, (r[1] - r[0] + 1) // 2


def _intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _merge(intervals: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _allowed(
    session: Interval, starts: list[int], spans: list[Interval], longest: int, near: Interval
) -> list[Interval]:
    """The offsets at which ``session`` lies inside one of the containers, near ``near`` only."""
    sub, fin = session
    lo_d, hi_d = near
    out = []
    # a container j can only help if start_j <= sub - lo_d and end_j >= fin - hi_d
    top = bisect.bisect_right(starts, sub - lo_d) if lo_d > -(1 << 62) else len(starts)
    floor = fin - hi_d - longest if hi_d < (1 << 62) else -(1 << 63)
    for j in range(top - 1, -1, -1):
        start, end = spans[j]
        if start < floor:
            break
        lo, hi = fin - end, sub - start
        if lo <= hi:
            out.append((lo, hi))
    return _merge(out)


def bracket(containers: Sequence[Interval], sessions: Sequence[Interval]) -> Bracket | None:
    """The offsets (wall − perf, ns) that put every session inside a container; None when there are
    no containers or sessions; ``ranges`` empty when no offset fits them all."""
    spans = sorted(c for c in containers if c[1] >= c[0])
    done = sorted(s for s in sessions if s[1] >= s[0])
    if not spans or not done:
        return None
    starts = [s for s, _ in spans]
    longest = max(e - s for s, e in spans)
    feasible: list[Interval] = [(-(1 << 62), 1 << 62)]
    for session in done:
        near = (feasible[0][0], feasible[-1][1])
        feasible = _intersect(feasible, _allowed(session, starts, spans, longest, near))
        if not feasible:
            return Bracket((), len(done), len(spans))
    return Bracket(tuple(feasible), len(done), len(spans))
