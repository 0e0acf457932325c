"""The stage spans grouped the ways the report needs them (per lane and category, per role and
name, per category), and the answers' flat rows made in the same one pass over the spans.

The groupings are :class:`..answers.interval_chunks.IntervalChunks`: each span context (below)
keeps its spans' times in two int64 arrays, and a grouping lists the contexts it holds — at 1M
spans a tuple per span in three lists was ~90 MB, only ever turned back into arrays."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...common.column_rows import as_array
from ..answers.interval_chunks import IntervalChunks, Source
from ..answers.model import RL_BUCKETS, Context, RowTable, natural
from .identity import lane_of, process_role
from .load import Span, TraceData
from .span_table import SpanTable
from .stages import classify

BUCKET_KEY = "rl.bucket"  # nemo-lens's goodput bucket on a leaf span (NeMo-RL's OTLP spans)


@dataclass(frozen=True)
class Who:
    role: str
    lane: str


class StageIndex:
    """Stage spans grouped the ways the report needs them."""

    def __init__(self, data: TraceData, spans: Sequence[Span]) -> None:
        self.by_who_cat: dict[Who, dict[str, IntervalChunks]] = defaultdict(
            lambda: defaultdict(IntervalChunks)
        )
        self.by_who_name: dict[tuple[str, str], dict[str, IntervalChunks]] = defaultdict(
            lambda: defaultdict(IntervalChunks)
        )
        self.spans_of: Mapping[Who, Sequence[Span]] = {}
        self.all_by_cat: dict[str, IntervalChunks] = defaultdict(IntervalChunks)
        # per (role, lane): its intervals per category, its spans, its answers' rows — one lookup a
        # span, by a plain tuple (a frozen dataclass hashes in Python); ``Who`` keys put on at the end
        self._lanes: dict[tuple[str, str], tuple[dict[str, IntervalChunks], list[Span], RowTable]] = {}
        self.contexts: list[Context] = []  # every row's fields but its times, by context id
        self._roles: dict[Any, str] = {}
        self._track_lanes: dict[tuple[Any, Any, str], str] = {}  # lane_of past its first rule: once a track
        # Everything a span's row and lists depend on — its track, name, lane and bucket — worked
        # out once per such context, not per span (1M spans come in a few thousand contexts)
        self._contexts: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        if isinstance(spans, SpanTable) and _fits(spans):
            self._from_table(data, spans)
        else:
            self._from_spans(data, spans)
        self.rows_of: dict[Who, RowTable] = {}  # the answers' rows (:func:`work_spans`), made here
        for key, (cats, _, rows) in self._lanes.items():
            self.by_who_cat[Who(*key)] = cats
            self.rows_of[Who(*key)] = rows
        self.whos = sorted(self.by_who_cat, key=lambda w: (w.role, natural(w.lane)))

    def _context_of(self, data: TraceData, s: Span) -> tuple[Any, ...]:
        lane = s.args.get("state_lane_id")  # RL-Insight's lane: lane_of's first rule, inline
        if lane is not None:
            lane = str(lane)
        bucket = s.args.get(BUCKET_KEY) if s.args else None
        if bucket is not None and bucket not in RL_BUCKETS:
            bucket = None
        key = (s.pid, s.tid, s.cat, s.name, lane, bucket)
        ctx = self._contexts.get(key)
        if ctx is None:
            ctx = self._contexts[key] = self._context(data, s, lane, bucket)
        return ctx

    def _from_spans(self, data: TraceData, spans: Iterable[Span]) -> None:
        """The reference: span by span (any ``int``; a list of spans, or a table whose ends do not
        fit int64)."""
        for s in spans:
            add, of, add_row, context, _ = self._context_of(data, s)
            start = s.start_ns
            end = start + s.dur_ns
            add(start, end)  # the context's own times: every grouping it is in lists it
            of.append(s)
            add_row(context, start, end)
        self.spans_of = {Who(*key): of for key, (_, of, _) in self._lanes.items()}

    def _from_table(self, data: TraceData, table: SpanTable) -> None:
        """The same over a table's columns: a context per shape (in the order the spans first show
        them), then every lane's rows and every context's times taken from the columns in span order."""
        import numpy as np

        codes, starts, durs = table.arrays()
        ends = starts + durs
        shapes, first = np.unique(codes, return_index=True)
        context_of_shape = np.zeros(len(table.shapes), dtype=np.int32)
        sources: list[Source] = []
        for shape in shapes[np.argsort(first)].tolist():
            name, cat, pid, tid, args = table.shapes[shape]
            *_, context, times = self._context_of(data, Span(name, cat, pid, tid, 0, 0, args))
            context_of_shape[shape] = context
            if context == len(sources):  # a new context (they are numbered as they are made)
                sources.append(times)
        contexts = context_of_shape[codes]
        for context, rows in _groups(contexts, len(self.contexts)):
            sources[context].starts = as_array("q", starts[rows])
            sources[context].ends = as_array("q", ends[rows])
        lanes = list(self._lanes)
        place = {lane: i for i, lane in enumerate(lanes)}
        lane_of_context = np.array([place[c[:2]] for c in self.contexts], dtype=np.int32)
        spans_of = {}
        for lane, rows in _groups(lane_of_context[contexts], len(lanes)):
            mine = self._lanes[lanes[lane]][2]
            mine.ids, mine.starts, mine.ends = (
                as_array("i", contexts[rows]),
                as_array("q", starts[rows]),
                as_array("q", ends[rows]),
            )
            spans_of[Who(*lanes[lane])] = rows
        self.spans_of = _SpansOf(table, spans_of)

    def _context(self, data: TraceData, s: Span, lane: str | None, bucket: Any) -> tuple[Any, ...]:
        """A span's role, lane (``lane``: its own RL-Insight lane, else its track's), category, its
        context's times (listed in the groupings it belongs to) and the lists it goes into."""
        roles, track_lanes, lanes = self._roles, self._track_lanes, self._lanes
        role = roles.get(s.pid) or roles.setdefault(s.pid, process_role(data, s.pid))
        if lane is None:
            track = (s.pid, s.tid, s.cat)
            lane = track_lanes.get(track)
            if lane is None:
                lane = track_lanes[track] = lane_of(data, s)
        cat = classify(s.name)
        mine = lanes.get((role, lane))
        if mine is None:
            mine = lanes[(role, lane)] = (defaultdict(IntervalChunks), [], RowTable(self.contexts))
        times = Source()
        for grouping in (mine[0][cat], self.by_who_name[(role, s.name)][lane], self.all_by_cat[cat]):
            grouping.sources.append(times)
        self.contexts.append((role, lane, s.name, cat, s.pid, s.tid, bucket))
        return times.add, mine[1], mine[2].add, len(self.contexts) - 1, times


class _SpansOf(Mapping[Who, Sequence[Span]]):
    """Each lane's spans, taken from the table when asked for (the gantt and ``rl-trace sql`` read
    them one lane at a time)."""

    def __init__(self, table: SpanTable, rows: dict[Who, Any]) -> None:
        self.table, self.rows = table, rows

    def __getitem__(self, who: Who) -> Sequence[Span]:
        return self.table.take(self.rows[who])

    def __iter__(self) -> Iterator[Who]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


def _fits(table: SpanTable) -> bool:
    """Whether every span's end fits int64 (a hand-made shard can hold any int64 start and length)."""
    if not len(table):
        return True
    _, starts, durs = table.arrays()
    return int(starts.max()) + int(durs.max()) < 2**63


def _groups(keys: Any, n: int) -> Iterator[tuple[int, Any]]:
    """(key, the rows holding it, in row order) for every key below ``n`` that some row holds."""
    import numpy as np

    order = np.argsort(keys, kind="stable")
    bounds = np.searchsorted(keys[order], np.arange(n + 1))
    for key in range(n):
        if bounds[key] < bounds[key + 1]:
            yield key, order[bounds[key] : bounds[key + 1]]


def lanes_of(idx: StageIndex) -> dict[tuple[str, str], RowTable]:
    """The rows per (role, lane), in :attr:`StageIndex.whos` order: what ``answers.by_lane`` makes of
    :func:`work_spans` (the same key, the same sort, each lane's rows in span order), without
    grouping a million rows again."""
    return {(who.role, who.lane): idx.rows_of[who] for who in idx.whos}


def work_spans(idx: StageIndex) -> RowTable:
    """The stage spans as the answers' flat rows (who, name, category, start, end, ``rl.bucket``),
    lane after lane: it knows its :func:`lanes_of` (``answers.by_lane`` of it)."""
    lanes = lanes_of(idx)
    return RowTable.concat(idx.contexts, list(lanes.values()), lanes)
