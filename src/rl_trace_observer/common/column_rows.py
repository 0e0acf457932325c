"""A sequence of rows kept as columns, each row made when it is read.

Why: a million Python objects that all live until a report ends cost ~200 bytes each; their
columns cost ~20. The column-backed tables of the report (:mod:`..analysis.report.span_table`,
:mod:`..analysis.answers.model`) and the merge's span summaries (:mod:`..merge.clock.probe`) read
back as the very rows they replace, so every consumer keeps taking them as lists. This is what they
share: indexing, slicing, equality with any sequence of the same rows, and a readable repr.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar, overload

__all__ = ["ColumnRows"]

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
