"""The stage spans grouped the ways the report needs them (per lane and category, per role and
name, per category), and the answers' flat rows made in the same one pass over the spans.

The groupings are :class:`..answers.interval_chunks.IntervalChunks`: each span context (below)
keeps its spans' times in two int64 arrays, and a grouping lists the contexts it holds — at 1M
spans a tuple per span in three lists was ~90 MB, only ever turned back into arrays."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ..answers.interval_chunks import IntervalChunks, Source
from ..answers.model import RL_BUCKETS, Context, RowTable, natural
from .identity import lane_of, process_role
from .load import Span, TraceData
from .stages import classify

BUCKET_KEY = "rl.bucket"  # nemo-lens's goodput bucket on a leaf span (NeMo-RL's OTLP spans)


@dataclass(frozen=True)
class Who:
    role: str
    lane: str


class StageIndex:
    """Stage spans grouped the ways the report needs them."""

    def __init__(self, data: TraceData, spans: list[Span]) -> None:
        self.by_who_cat: dict[Who, dict[str, IntervalChunks]] = defaultdict(
            lambda: defaultdict(IntervalChunks)
        )
        self.by_who_name: dict[tuple[str, str], dict[str, IntervalChunks]] = defaultdict(
            lambda: defaultdict(IntervalChunks)
        )
        self.spans_of: dict[Who, list[Span]] = defaultdict(list)
        self.all_by_cat: dict[str, IntervalChunks] = defaultdict(IntervalChunks)
        # per (role, lane): its intervals per category, its spans, its answers' rows — one lookup a
        # span, by a plain tuple (a frozen dataclass hashes in Python); ``Who`` keys put on at the end
        lanes: dict[tuple[str, str], tuple[dict[str, IntervalChunks], list[Span], RowTable]] = {}
        self.contexts: list[Context] = []  # every row's fields but its times, by context id
        roles: dict[Any, str] = {}
        track_lanes: dict[tuple[Any, Any, str], str] = {}  # lane_of past its first rule: once a track
        # Everything a span's row and lists depend on — its track, name, lane and bucket — worked
        # out once per such context, not per span (1M spans come in a few thousand contexts)
        contexts: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        for s in spans:
            args = s.args
            lane = args.get("state_lane_id")  # RL-Insight's lane: lane_of's first rule, inline
            if lane is not None:
                lane = str(lane)
            bucket = args.get(BUCKET_KEY) if args else None
            if bucket is not None and bucket not in RL_BUCKETS:
                bucket = None
            key = (s.pid, s.tid, s.cat, s.name, lane, bucket)
            ctx = contexts.get(key)
            if ctx is None:
                ctx = contexts[key] = self._context(data, s, lane, bucket, roles, track_lanes, lanes)
            add, of, add_row, context = ctx
            start = s.start_ns
            end = start + s.dur_ns
            add(start, end)  # the context's own times: every grouping it is in lists it
            of.append(s)
            add_row(context, start, end)
        self.rows_of: dict[Who, RowTable] = {}  # the answers' rows (:func:`work_spans`), made here
        for key, (cats, of, rows) in lanes.items():
            who = Who(*key)
            self.by_who_cat[who] = cats
            self.spans_of[who] = of
            self.rows_of[who] = rows
        self.whos = sorted(self.by_who_cat, key=lambda w: (w.role, natural(w.lane)))

    def _context(
        self,
        data: TraceData,
        s: Span,
        lane: str | None,
        bucket: Any,
        roles: dict[Any, str],
        track_lanes: dict[tuple[Any, Any, str], str],
        lanes: dict[tuple[str, str], tuple[dict[str, IntervalChunks], list[Span], RowTable]],
    ) -> tuple[Any, ...]:
        """A span's role, lane (``lane``: its own RL-Insight lane, else its track's), category, its
        context's times (listed in the groupings it belongs to) and the lists it goes into."""
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
        return times.add, mine[1], mine[2].add, len(self.contexts) - 1


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
