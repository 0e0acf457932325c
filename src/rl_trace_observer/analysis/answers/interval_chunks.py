"""Intervals kept as columns, a pair of int64 arrays per source, instead of a tuple per interval.

The report groups a step's stage spans three ways (per lane and category, per role and name, per
category); at 1M spans a ``(start, end)`` tuple per span in three lists was ~90 MB, and every one of
those lists is only ever measured as a union (:mod:`.interval_arrays` turns it into arrays again).
Here each source (the report's stage index: one per span context) appends to its own two
``array('q')``; a list of intervals is the sources it joins, shared, not copied. Iterating gives the
same ``(start, end)`` tuples (in source order: every consumer unions them, so order does not
matter), so the pure-Python reference in :mod:`.intervals` reads it as it is. A time beyond int64
(hostile input) turns that source into Python lists: the same values, the Python path.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator

from ...common.column_rows import with_row_as_lists

__all__ = ["IntervalChunks", "Source"]


class Source:
    """One source's intervals: ``starts[i], ends[i]``; int64 arrays until a value does not fit."""

    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts: array[int] | list[int] = array("q")
        self.ends: array[int] | list[int] = array("q")

    def add(self, start: int, end: int) -> None:
        try:
            self.starts.append(start)
            self.ends.append(end)
        except OverflowError:
            self.starts, self.ends = with_row_as_lists((self.starts, self.ends), (start, end))

    def columnar(self) -> bool:
        return isinstance(self.starts, array) and isinstance(self.ends, array)


class IntervalChunks:
    """A list of intervals made of :class:`Source` s (shared: a source grows, every list it is in does)."""

    __slots__ = ("sources",)

    def __init__(self, sources: Iterable[Source] = ()) -> None:
        self.sources: list[Source] = list(sources)

    def __len__(self) -> int:
        return sum(len(s.starts) for s in self.sources)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for s in self.sources:
            yield from zip(s.starts, s.ends, strict=True)

    def columnar(self) -> bool:
        """Whether every source is still int64 arrays (the numpy path can read them as they are)."""
        return all(s.columnar() for s in self.sources)

    @staticmethod
    def join(lists: Iterable[IntervalChunks | None]) -> IntervalChunks:
        """Several lists as one (none copied; a missing one, ``None``, is empty)."""
        return IntervalChunks(s for chunks in lists if chunks is not None for s in chunks.sources)
