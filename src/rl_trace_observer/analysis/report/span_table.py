"""The stage spans of a shard load as columns: a shape id and two times per span.

A :class:`.load.Span` with its two ``int`` s is ~190 bytes; a 1M-event step in the live watch held
1.2M of them for as long as its report ran (~330 MB of the watch's peak). Here a span is its
**shape** — name, category, pid, tid and args, the same few thousand values at 1M spans (args
decoded once per distinct text, :mod:`.shards`) — and its start and duration: 16 bytes of times and
4 of id. Reading it gives the very :class:`Span` s (made as they are read: nothing in the report
changes a span), so every consumer takes it as the list it stands for; what filters spans by name,
category or args filters the shapes (:func:`select`), and the stage index reads the columns
(:mod:`.stage_index`).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ...common.column_rows import ColumnRows, as_array
from .load import Span

__all__ = ["Shape", "SpanTable", "select"]

Shape = tuple[str, str, Any, Any, dict[str, Any]]  # name, category, pid, tid, args


class SpanTable(ColumnRows[Span]):
    __slots__ = ("codes", "durs", "shapes", "starts")

    def __init__(self, shapes: list[Shape], codes: Any = None, starts: Any = None, durs: Any = None) -> None:
        self.shapes = shapes  # shared by every table taken from this one
        self.codes = array("i") if codes is None else codes
        self.starts = array("q") if starts is None else starts
        self.durs = array("q") if durs is None else durs

    def add_shape(self, shape: Shape) -> int:
        self.shapes.append(shape)
        return len(self.shapes) - 1

    def append(self, span: Span) -> None:
        """One span of its own shape (a B/E pair, or a span made by the report)."""
        self.codes.append(self.add_shape((span.name, span.cat, span.pid, span.tid, span.args)))
        self.starts.append(span.start_ns)
        self.durs.append(span.dur_ns)

    def plus(self, extra: Sequence[Span]) -> SpanTable:
        """A new table: this one's spans, then ``extra``."""
        out = SpanTable(self.shapes, array("i", self.codes), array("q", self.starts), array("q", self.durs))
        for span in extra:
            out.append(span)
        return out

    def extend_columns(self, codes: Any, starts: Any, durs: Any) -> None:
        self.codes.extend(codes)
        self.starts.extend(starts)
        self.durs.extend(durs)

    def arrays(self) -> tuple[Any, Any, Any]:
        """Shape ids, starts and durations as numpy arrays (read-only views)."""
        import numpy as np

        return (
            np.frombuffer(self.codes, dtype=np.int32),
            np.frombuffer(self.starts, dtype=np.int64),
            np.frombuffer(self.durs, dtype=np.int64),
        )

    def take(self, rows: Any) -> SpanTable:
        """These rows (a numpy array of indices into this table, in their order), same shapes."""
        codes, starts, durs = self.arrays()
        return SpanTable(
            self.shapes, as_array("i", codes[rows]), as_array("q", starts[rows]), as_array("q", durs[rows])
        )

    def where(self, keep: Callable[[Span], bool]) -> SpanTable:
        """The spans ``keep`` takes, judged once per shape: ``keep`` must look at nothing but a
        span's name, category, pid, tid and args (it is shown the shape with times 0)."""
        import numpy as np

        kept = np.array([bool(keep(Span(*shape[:4], 0, 0, shape[4]))) for shape in self.shapes], dtype=bool)
        if kept.all():
            return self
        return self.take(np.flatnonzero(kept[self.arrays()[0]]))

    def _row(self, i: int) -> Span:
        name, cat, pid, tid, args = self.shapes[self.codes[i]]
        return Span(name, cat, pid, tid, self.starts[i], self.durs[i], args)

    def __len__(self) -> int:
        return len(self.codes)

    def __iter__(self) -> Iterator[Span]:
        shapes = self.shapes
        for code, start, dur in zip(self.codes, self.starts, self.durs, strict=True):
            name, cat, pid, tid, args = shapes[code]
            yield Span(name, cat, pid, tid, start, dur, args)


def select(spans: Sequence[Span], keep: Callable[[Span], bool]) -> Sequence[Span]:
    """``[s for s in spans if keep(s)]``, per shape where ``spans`` is a :class:`SpanTable` (``keep``
    then looks at a span's name, category, pid, tid and args only)."""
    if isinstance(spans, SpanTable):
        return spans.where(keep)
    return [s for s in spans if keep(s)]
