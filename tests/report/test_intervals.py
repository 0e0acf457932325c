"""The report's interval arithmetic against a brute-force model: every set as the integer points it
covers. ``intersect`` and ``subtract`` bisect into their second argument (a live step tests a few
idle gaps against a long union), so jumps past, into and over intervals are what is drawn here."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.analysis.answers import interval_arrays as ia
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


# ------------------------------------------------------------------ the numpy twin (interval_arrays)
# numpy comes with the shards extra; the light install (.[test,viztracer]) takes the Python path
needs_numpy = pytest.mark.skipif(ia.np is None, reason="numpy not installed (the shards extra)")


def _arrays(ints: list[tuple[int, int]]) -> tuple[object, object]:
    return ia.as_arrays(ints) if ints else ia.as_arrays([])


@needs_numpy
@settings(max_examples=300, deadline=None)
@given(raw, raw)
def test_array_union_and_measure_equal_the_reference(
    a: list[tuple[int, int]], b: list[tuple[int, int]]
) -> None:
    s, e = ia.union(*_arrays(a))
    assert list(zip(s.tolist(), e.tolist(), strict=True)) == iv.union(a)
    ub = iv.union(b)
    measure = ia.Measure(*ia.union(*_arrays(b)))
    assert measure.total == iv.length(ub)
    ua = iv.union(a)
    assert measure.overlap(*_arrays(ua)) == iv.length(iv.intersect(ua, ub))
    for x in range(-2, 63):  # F(x): the union's length before x
        assert int(measure.below(ia.as_arrays([(x, x + 1)])[0])[0]) == len({p for p in points(b) if p < x})


@needs_numpy
def test_hostile_windows_take_the_python_path() -> None:
    assert ia.available(0, 10) and not ia.available(10, 10) and not ia.available(0, 2**62)
    assert not ia.available(-(2**63), 0)


@needs_numpy
@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 600), st.integers(0, 600)), min_size=260, max_size=400),
    st.integers(0, 600),
    st.integers(0, 600),
)
def test_long_lists_through_arrays_equal_the_reference(a: list[tuple[int, int]], lo: int, hi: int) -> None:
    assert ia.union_list(a) == iv.union(a)
    assert ia.clipped_union(a, lo, hi) == iv.union(iv.clip(a, lo, hi))
    assert ia.covered(a, lo, hi) == iv.covered(a, lo, hi)


@needs_numpy
@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(-50, 500), st.integers(0, 60)), max_size=20), max_size=12))
def test_a_union_accumulated_part_by_part_equals_the_union_of_all(parts: list[list[tuple[int, int]]]) -> None:
    """Parts joined in as they come (every few intervals here: a batch of 3) give the union of all
    of them at once, whatever the batches."""
    import numpy as np

    arrays = [
        ia.ArrayUnion(
            np.array([s for s, _ in p], dtype=np.int64), np.array([s + d for s, d in p], dtype=np.int64)
        )
        for p in parts
    ]
    batch = ia.BATCH
    ia.BATCH = 3
    try:
        acc = ia.Accumulated()
        for a in arrays:
            acc.add(a)
        got = acc.union().intervals()
    finally:
        ia.BATCH = batch
    assert got == ia.joined(arrays).intervals() == iv.union((s, s + d) for p in parts for s, d in p)
