"""A sequence of rows kept as columns, each row made when it is read.

Why: a million Python objects that all live until a report ends cost ~200 bytes each; their
columns cost ~20. The column-backed tables of the report (:mod:`..analysis.report.span_table`,
:mod:`..analysis.answers.model`) and the merge's span summaries (:mod:`..merge.clock.probe`) read
back as the very rows they replace, so every consumer keeps taking them as lists. This is what they
share: indexing, slicing, equality with any sequence of the same rows, and a readable repr.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any, TypeVar, overload

__all__ = ["ColumnRows", "as_array", "with_row_as_lists"]

T = TypeVar("T")


class ColumnRows(Sequence[T]):
    """Subclasses give ``__len__``, ``_row(i)`` (row ``i``, ``0 <= i < len``) and a fast ``__iter__``."""

    __slots__ = ()

    def _row(self, i: int) -> T:
        raise NotImplementedError

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> list[T]: ...
    def __getitem__(self, i: int | slice) -> T | list[T]:
        if isinstance(i, slice):
            return [self._row(k) for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._row(i)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"


def as_array(typecode: str, values: Any) -> array[Any]:
    """A numpy array's values as an ``array.array`` of ``typecode`` (a copy the table owns; values
    of another integer width are converted first)."""
    out = array(typecode)
    if values.dtype.itemsize != out.itemsize:
        values = values.astype(f"i{out.itemsize}")
    out.frombytes(values.tobytes())
    return out


def with_row_as_lists(columns: Sequence[Any], values: Sequence[int]) -> list[list[int]]:
    """The columns as Python lists with one more row: for a value no int64 array holds (hostile
    input). Columns that took their value of that row before one refused it give it back first."""
    n = min(len(c) for c in columns)
    out = [list(c[:n]) for c in columns]
    for column, value in zip(out, values, strict=True):
        column.append(value)
    return out
