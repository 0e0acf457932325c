"""Small span summaries for the clock causality checks, taken while a worker holds a file's events.

Why here and not in a second pass: the checks (:mod:`.causality`) need only a few spans per
process — RL-Insight stage spans and the Torch trace's ``record_function`` regions — but those sit
in files that can be hundreds of MB. A worker already has each file's corrected events in memory,
so it keeps the few that matter as tuples (``SpanSummary``) and sends them back with its outcome;
the parent runs the checks on those (:meth:`..pipeline.clock.ClockChoice.check_causality`).

What is kept is each format's own rule (``ClockEvidence`` and its ``probe_cat``):

- RL-Insight: every complete span (stages: a handful per step and process);
- Torch: complete events of category ``user_annotation`` (``record_function`` on the CPU; VERL's
  ``DistProfiler.annotate`` opens one named like the RL-Insight stage it sits in). GPU-side
  annotations are on the device clock and are left out.

At most ``MAX_SPANS`` per artifact, the longest first (stage regions are the long ones).
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterable, Iterator
from typing import Any

from ...common.column_rows import ColumnRows, with_row_as_lists
from ..timeline.model import Event, us_to_ns
from ..timeline.select import pick

SpanSummary = tuple[str, int, int, int, int]  # (name, start_ns, end_ns, merged pid, merged tid)

MAX_SPANS = 10_000


class SpanSummaries(ColumnRows[SpanSummary]):
    """One artifact's summaries as columns: a name id and four int64s each. An RL-Insight log of a
    1M-event step holds ~19k spans: 64 of them sent 640k 5-tuples (~180 MB) to the parent, which
    kept them to the merge's end (the live watch's peak). Iterating gives the same tuples; a value
    beyond int64 (hostile input) turns the columns into lists."""

    __slots__ = ("ends", "name_ids", "names", "pids", "starts", "tids")

    def __init__(self, spans: Iterable[SpanSummary] = ()) -> None:
        self.names: list[str] = []
        self.name_ids: array[int] = array("i")
        self.starts: Any = array("q")
        self.ends: Any = array("q")
        self.pids: Any = array("q")
        self.tids: Any = array("q")
        ids: dict[str, int] = {}
        for name, start, end, pid, tid in spans:
            i = ids.get(name)
            if i is None:
                i = ids[name] = len(self.names)
                self.names.append(name)
            self.name_ids.append(i)
            self._add(start, end, pid, tid)

    def _add(self, *values: int) -> None:
        columns = (self.starts, self.ends, self.pids, self.tids)
        try:
            for column, value in zip(columns, values, strict=True):
                column.append(value)
        except OverflowError:
            self.starts, self.ends, self.pids, self.tids = with_row_as_lists(columns, values)

    def __len__(self) -> int:
        return len(self.name_ids)

    def __iter__(self) -> Iterator[SpanSummary]:
        names = self.names
        for i, start, end, pid, tid in zip(
            self.name_ids, self.starts, self.ends, self.pids, self.tids, strict=True
        ):
            yield (names[i], start, end, pid, tid)

    def _row(self, i: int) -> SpanSummary:
        return (self.names[self.name_ids[i]], self.starts[i], self.ends[i], self.pids[i], self.tids[i])

    def tracks(self) -> set[tuple[int, int]]:
        return set(zip(self.pids, self.tids, strict=True))

    def max_end(self) -> int | None:
        return max(self.ends) if len(self) else None


def stage_spans(
    events: Iterable[Event],
    cat: str | None,
    relative_to_ns: int | None,
    unit_ns: int = 1000,
    far: dict[int, int] | None = None,
) -> SpanSummaries:
    """The spans of one artifact the causality checks use (complete ones, of category ``cat`` unless
    None), on the merged timeline in ns.

    ``relative_to_ns``: the events' ``ts``/``dur`` are already output units (µs, or ns when
    ``unit_ns`` is 1) relative to this base (the fused fast path, :mod:`..transform.fastpath`);
    ``None``: they are absolute integer ns. ``far``: the exact ns of the events whose µs double does
    not give them back (``fastpath.to_output``).
    """
    picked = pick(events, "X", None if cat is None else (cat,), ("dur",))
    if len(picked) > MAX_SPANS:
        picked = heapq.nlargest(MAX_SPANS, picked, key=_duration)
    out: list[SpanSummary] = []  # made into columns at the end (a list for the few spans it has)
    for e in picked:
        ts: Any = e.ts
        dur: Any = e.dur
        if relative_to_ns is not None:  # exact: the fast path wrote y / 1000 (or ``far``) for an int y
            exact = far.get(id(e)) if far else None
            if exact is not None:
                ts = relative_to_ns + exact
            else:
                ts = relative_to_ns + (us_to_ns(ts) if unit_ns == 1000 else int(ts))
            dur = us_to_ns(dur) if unit_ns == 1000 else int(dur)
        pid, tid = e.pid, e.tid
        if isinstance(pid, int) and isinstance(tid, int):
            name = e.name if isinstance(e.name, str) else ""
            out.append((name, int(ts), int(ts) + int(dur), pid, tid))
    return SpanSummaries(out)


def _duration(e: Event) -> float:
    d: Any = e.dur
    return float(d)
