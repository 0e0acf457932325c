"""Exact interval arithmetic on integer nanoseconds (half-open ``[start, end)``), for the report.

Every figure the report gives is a length of a union, intersection or difference of such sets, so
overlapping spans are never counted twice and rounding never enters (all values are ``int``).
"""

from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[int, int]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint, non-touching intervals covering exactly the input; empty ones dropped."""
    out: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def length(intervals: Iterable[Interval]) -> int:
    """Total length of a union (call on ``union(...)`` output, or it over-counts overlaps)."""
    return sum(end - start for start, end in intervals)


def clip(intervals: Iterable[Interval], lo: int, hi: int) -> list[Interval]:
    """The parts of ``intervals`` inside ``[lo, hi)``."""
    return [(max(s, lo), min(e, hi)) for s, e in intervals if s < hi and e > lo]


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Intersection of two unions (sorted, disjoint inputs), by a linear merge."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def covered(intervals: Iterable[Interval], lo: int, hi: int) -> int:
    """Length of ``[lo, hi)`` covered by ``intervals`` (any input: overlaps are merged first)."""
    return length(union(clip(intervals, lo, hi)))


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """``a`` minus ``b`` (both unions: sorted, disjoint), by a linear merge."""
    out: list[Interval] = []
    j = 0
    for start, end in a:
        cur = start
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < end:
            out.append((cur, end))
    return out
