"""The report's interval arithmetic against a brute-force model: every set as the integer points it
covers. ``intersect`` and ``subtract`` bisect into their second argument (a live step tests a few
idle gaps against a long union), so jumps past, into and over intervals are what is drawn here."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.analysis.answers import intervals as iv

raw = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=25)


def points(ints: list[tuple[int, int]]) -> set[int]:
    return {x for s, e in ints for x in range(s, e)}


def canonical(ints: list[tuple[int, int]]) -> bool:
    """Sorted, non-empty, disjoint and non-touching: what :func:`iv.union` promises."""
    return all(s < e for s, e in ints) and all(a[1] < b[0] for a, b in pairwise(ints))


@settings(max_examples=300, deadline=None)
@given(raw)
def test_union_is_the_canonical_cover(a: list[tuple[int, int]]) -> None:
    u = iv.union(a)
    assert canonical(u) and points(u) == points(a)
    assert iv.length(u) == len(points(a))


@settings(max_examples=300, deadline=None)
@given(raw, raw, st.integers(0, 60), st.integers(0, 60))
def test_intersect_subtract_clip_match_point_sets(
    a: list[tuple[int, int]], b: list[tuple[int, int]], lo: int, hi: int
) -> None:
    ua, ub = iv.union(a), iv.union(b)
    both = iv.intersect(ua, ub)
    assert canonical(both) and points(both) == points(a) & points(b)
    assert both == iv.intersect(ub, ua)
    rest = iv.subtract(ua, ub)
    assert canonical(rest) and points(rest) == points(a) - points(b)
    assert points(iv.clip(a, lo, hi)) == {x for x in points(a) if lo <= x < hi}
    assert iv.covered(a, lo, hi) == len({x for x in points(a) if lo <= x < hi})
