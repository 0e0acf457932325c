"""The stage spans grouped the ways the report needs them (per lane and category, per role and
name, per category), and the answers' flat rows made in the same one pass over the spans."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ..answers import intervals as iv
from ..answers.model import RL_BUCKETS, WorkSpan, natural
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
        self.by_who_cat: dict[Who, dict[str, list[iv.Interval]]] = defaultdict(lambda: defaultdict(list))
        self.by_who_name: dict[tuple[str, str], dict[str, list[iv.Interval]]] = defaultdict(
            lambda: defaultdict(list)
        )
        self.spans_of: dict[Who, list[Span]] = defaultdict(list)
        self.all_by_cat: dict[str, list[iv.Interval]] = defaultdict(list)
        # per (role, lane): its intervals per category, its spans, its answers' rows — one lookup a
        # span, by a plain tuple (a frozen dataclass hashes in Python); ``Who`` keys put on at the end
        lanes: dict[tuple[str, str], tuple[dict[str, list[iv.Interval]], list[Span], list[WorkSpan]]] = {}
        roles: dict[Any, str] = {}
        track_lanes: dict[tuple[Any, Any, str], str] = {}  # lane_of past its first rule: once a track
        # Everything a span's row and lists depend on — its track, name, lane and bucket — worked
        # out once per such context, not per span (1M spans come in a few thousand contexts)
        contexts: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        new_row = tuple.__new__
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
            role, lane, cat, bucket, in_cat, in_name, in_all, of, rows = ctx
            start = s.start_ns
            end = start + s.dur_ns
            interval = (start, end)
            in_cat.append(interval)
            in_name.append(interval)
            in_all.append(interval)
            of.append(s)
            rows.append(new_row(WorkSpan, (role, lane, s.name, cat, start, end, s.pid, s.tid, bucket)))
        self.rows_of: dict[Who, list[WorkSpan]] = {}  # the answers' rows (:func:`work_spans`), made here
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
        lanes: dict[tuple[str, str], tuple[dict[str, list[iv.Interval]], list[Span], list[WorkSpan]]],
    ) -> tuple[Any, ...]:
        """A span's role, lane (``lane``: its own RL-Insight lane, else its track's), category and
        the lists it goes into."""
        role = roles.get(s.pid) or roles.setdefault(s.pid, process_role(data, s.pid))
        if lane is None:
            track = (s.pid, s.tid, s.cat)
            lane = track_lanes.get(track)
            if lane is None:
                lane = track_lanes[track] = lane_of(data, s)
        cat = classify(s.name)
        mine = lanes.get((role, lane))
        if mine is None:
            mine = lanes[(role, lane)] = (defaultdict(list), [], [])
        return (
            role, lane, cat, bucket, mine[0][cat], self.by_who_name[(role, s.name)][lane],
            self.all_by_cat[cat], mine[1], mine[2],
        )  # fmt: skip


def lanes_of(idx: StageIndex) -> dict[tuple[str, str], list[WorkSpan]]:
    """The rows per (role, lane), in :attr:`StageIndex.whos` order: what ``answers.by_lane`` makes of
    :func:`work_spans` (the same key, the same sort, each lane's rows in span order), without
    grouping a million rows again."""
    return {(who.role, who.lane): idx.rows_of[who] for who in idx.whos}


def work_spans(idx: StageIndex) -> list[WorkSpan]:
    """The stage spans as the answers' flat rows (who, name, category, start, end, ``rl.bucket``)."""
    return [row for who in idx.whos for row in idx.rows_of[who]]
