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
        for s in spans:
            role = roles.get(s.pid) or roles.setdefault(s.pid, process_role(data, s.pid))
            args = s.args
            lane = args.get("state_lane_id")  # RL-Insight's lane: lane_of's first rule, inline
            if lane is not None:
                lane = str(lane)
            else:
                track = (s.pid, s.tid, s.cat)
                lane = track_lanes.get(track)
                if lane is None:
                    lane = track_lanes[track] = lane_of(data, s)
            key = (role, lane)
            cat = classify(s.name)
            start, end = s.start_ns, s.start_ns + s.dur_ns
            interval = (start, end)
            mine = lanes.get(key)
            if mine is None:
                mine = lanes[key] = (defaultdict(list), [], [])
            mine[0][cat].append(interval)
            self.by_who_name[(role, s.name)][lane].append(interval)
            mine[1].append(s)
            bucket = args.get(BUCKET_KEY) if args else None
            if bucket not in RL_BUCKETS:
                bucket = None
            mine[2].append(WorkSpan(role, lane, s.name, cat, start, end, s.pid, s.tid, bucket))
            self.all_by_cat[cat].append(interval)
        self.rows_of: dict[Who, list[WorkSpan]] = {}  # the answers' rows (:func:`work_spans`), made here
        for key, (cats, of, rows) in lanes.items():
            who = Who(*key)
            self.by_who_cat[who] = cats
            self.spans_of[who] = of
            self.rows_of[who] = rows
        self.whos = sorted(self.by_who_cat, key=lambda w: (w.role, natural(w.lane)))


def work_spans(idx: StageIndex) -> list[WorkSpan]:
    """The stage spans as the answers' flat rows (who, name, category, start, end, ``rl.bucket``)."""
    return [row for who in idx.whos for row in idx.rows_of[who]]
