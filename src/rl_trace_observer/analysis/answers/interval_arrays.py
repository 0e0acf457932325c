"""The interval lengths the report needs most, over numpy arrays: one lane's idle time per cause.

:mod:`.intervals` is the reference (exact, pure Python, any ``int``); this module gives the same
integers faster where numpy is installed (the ``shards`` extra) and every value fits in int64. The
idle causes cost 64 lanes × 5 causes × an intersect and a subtract over every gap of the lane, in
Python ~0.45 s of a 100k-event step's report; here each is two ``searchsorted`` over the cause's
union, by a prefix sum of its lengths (:class:`Measure`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any, NamedTuple

try:  # optional: without it the idle causes take the pure-Python path (same integers)
    import numpy as np
except ImportError:  # pragma: no cover - numpy is in the shards extra the tests install
    np = None  # type: ignore[assignment]

from . import intervals as iv
from .interval_chunks import IntervalChunks
from .intervals import Interval

INT64_SPAN = 2**62  # windows wider than this (hostile input) take the Python path: no overflow


def numpy_or_none() -> Any:
    """numpy where it is installed (the ``shards`` extra), else None."""
    return np


def available(lo: int, hi: int) -> bool:
    """Whether lengths inside a non-empty ``[lo, hi)`` can be summed in int64 here."""
    return np is not None and -INT64_SPAN < lo < hi < INT64_SPAN and hi - lo < INT64_SPAN


class ArrayUnion(NamedTuple):
    """A union (sorted, disjoint) kept as its start and end arrays: a lane's work at 1M spans is
    ~600k intervals, ~80 MB more as tuples of ints that are only ever turned back into arrays."""

    starts: Any
    ends: Any

    def intervals(self) -> list[Interval]:
        return as_list((self.starts, self.ends))


def joined(parts: Sequence[ArrayUnion]) -> ArrayUnion:
    """The union of several interval arrays (unions or any intervals: they are sorted and joined)."""
    if not parts:
        empty = np.empty(0, dtype=np.int64)
        return ArrayUnion(empty, empty)
    return ArrayUnion(
        *union(np.concatenate([p.starts for p in parts]), np.concatenate([p.ends for p in parts]))
    )


class Accumulated:
    """A union of many parts, joined as they come whenever the parts waiting hold more intervals
    than the union so far (and at least :data:`BATCH`): 64 lanes' unions of a 1M-span step held
    whole until the end were ~20 MB a set, several sets at once; this keeps about twice the union.
    The union of a union and more parts is the union of everything, so the result is the same."""

    def __init__(self) -> None:
        self.done: ArrayUnion | None = None
        self.waiting: list[ArrayUnion] = []
        self.count = 0

    def add(self, part: ArrayUnion) -> None:
        self.waiting.append(part)
        self.count += len(part.starts)
        if self.count > max(BATCH, 0 if self.done is None else len(self.done.starts)):
            self.done, self.waiting, self.count = self.union(), [], 0

    def union(self) -> ArrayUnion:
        parts = self.waiting if self.done is None else [self.done, *self.waiting]
        return parts[0] if len(parts) == 1 and self.done is not None else joined(parts)


BATCH = 1 << 16  # intervals a union waits for before joining them in (1 MB of arrays)


def as_arrays(ints: Sequence[Interval] | ArrayUnion) -> tuple[Any, Any]:
    """A union (sorted, disjoint) as its start and end arrays."""
    if isinstance(ints, ArrayUnion):
        return ints.starts, ints.ends
    if not ints:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty
    a = _pairs(ints)
    return a[:, 0], a[:, 1]


def _pairs(ints: Sequence[Interval]) -> Any:
    """``ints`` as an (n, 2) int64 array (OverflowError beyond int64); from an iterator, 2.5x
    faster than ``np.array`` of the tuples."""
    flat = np.fromiter(chain.from_iterable(ints), dtype=np.int64, count=2 * len(ints))
    return flat.reshape(-1, 2)


def _columns(ints: Sequence[Interval] | IntervalChunks) -> tuple[Any, Any]:
    """``ints`` as start and end arrays (OverflowError beyond int64); :class:`IntervalChunks` still
    in int64 arrays are read as they are, without a tuple per interval."""
    if isinstance(ints, IntervalChunks) and ints.columnar():
        sources = ints.sources
        return (
            np.concatenate([np.frombuffer(s.starts, dtype=np.int64) for s in sources]),
            np.concatenate([np.frombuffer(s.ends, dtype=np.int64) for s in sources]),
        )
    a = _pairs(ints)
    return a[:, 0], a[:, 1]


def concat(a: Any, b: Any) -> Any:
    return np.concatenate((a, b))


def union(starts: Any, ends: Any) -> tuple[Any, Any]:
    """:func:`.intervals.union` of intervals given as two arrays: touching ones join, empty ones go."""
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if not len(starts):
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)  # how far the intervals so far cover
    first = np.empty(len(starts), dtype=bool)
    first[0] = True
    first[1:] = starts[1:] > reach[:-1]  # a gap before it: a new interval of the union begins
    heads = np.flatnonzero(first)
    return starts[heads], np.maximum.reduceat(ends, heads)


BIG = 256  # below this many intervals the pure-Python union is as fast (no array to build)


def _union_arrays(
    ints: Sequence[Interval] | IntervalChunks, window: tuple[int, int] | None = None
) -> tuple[Any, Any] | None:
    """The union of ``ints`` (clipped to ``window``) as arrays; None where the pure-Python code must
    give it: no numpy, a short list, or values beyond int64 (hostile input)."""
    if np is None or len(ints) < BIG or (window is not None and not available(*window)):
        return None
    try:
        starts, ends = _columns(ints)
    except OverflowError:
        return None
    if window is not None:
        starts, ends = np.clip(starts, *window), np.clip(ends, *window)
    return union(starts, ends)


def as_list(u: tuple[Any, Any]) -> list[Interval]:
    return list(zip(u[0].tolist(), u[1].tolist(), strict=True))


def union_list(ints: Sequence[Interval] | IntervalChunks) -> list[Interval]:
    """:func:`.intervals.union` of a list, through arrays when it is long and numpy is here."""
    u = _union_arrays(ints)
    return iv.union(ints) if u is None else as_list(u)


def clipped_union(ints: Sequence[Interval] | IntervalChunks, lo: int, hi: int) -> list[Interval]:
    """``union(clip(ints, lo, hi))`` (:mod:`.intervals`), through arrays when the list is long."""
    u = _union_arrays(ints, (lo, hi))
    return iv.union(iv.clip(ints, lo, hi)) if u is None else as_list(u)


def covered(ints: Sequence[Interval] | IntervalChunks, lo: int, hi: int) -> int:
    """:func:`.intervals.covered`, through arrays when the list is long and numpy is here."""
    u = _union_arrays(ints, (lo, hi))
    return iv.covered(ints, lo, hi) if u is None else int((u[1] - u[0]).sum())


class Measure:
    """How much of a union lies before any time ``x`` (``F(x)``), so that the length of the union
    inside ``[s, e)`` is ``F(e) - F(s)`` for whole arrays of ``s`` and ``e`` at once."""

    def __init__(self, starts: Any, ends: Any) -> None:
        self.starts, self.ends = starts, ends
        self.cum = np.concatenate(([0], np.cumsum(ends - starts)))
        self.total = int(self.cum[-1])

    def below(self, x: Any) -> Any:
        k = np.searchsorted(self.starts, x, side="right")  # intervals starting at or before x
        if not len(self.starts):
            return np.zeros(len(x), dtype=np.int64)
        inside = self.ends[np.maximum(k - 1, 0)] - x  # > 0 where x falls inside interval k-1
        return self.cum[k] - np.where((k > 0) & (inside > 0), inside, 0)

    def overlap(self, starts: Any, ends: Any) -> int:
        """Length of this union inside the disjoint intervals ``[starts, ends)``."""
        if not len(starts):
            return 0
        return int((self.below(ends) - self.below(starts)).sum())
