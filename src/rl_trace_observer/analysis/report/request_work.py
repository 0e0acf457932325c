"""Each replica's generation work, from its request spans, where RL-Insight draws none.

In VERL's ``separate_async`` trainer the replicas generate continuously, beside the step: no
``generate_sequences`` stage runs, so RL-Insight's stage spans hold only the training ranks' work
and the report would see no rollout lane at all — a training rank idle while the trainer waits for
samples would get the cause ``driver``, and the replicas' own idle time would be missing. The
replicas' ``engine_request`` spans (their server's side of every request) say exactly when each
replica was busy: their union per replica becomes that replica's ``generation`` lane
(``replica_<r>`` of the server's process, role ``rollout``).

Only used when the stage spans have no generation work of their own (sync / colocate_async runs keep
RL-Insight's generation spans, never both).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..answers import intervals as iv
from .load import Span, TraceData
from .span_table import select

ENGINE_SPAN = "engine_request"
REQUEST_CATEGORY = "rl_trace.request"
WORK_NAME = "engine_generate"  # classify(): generation
LANE_ARG = "state_lane_id"


def _track_key(tid: Any) -> tuple[int, Any]:
    return (0, tid) if isinstance(tid, int) else (1, str(tid))


def replica_generation(data: TraceData) -> list[Span]:
    """One ``engine_generate`` span per busy interval of each replica (its requests' union)."""
    busy: dict[tuple[Any, Any], list[iv.Interval]] = defaultdict(list)
    tids: dict[tuple[Any, Any], Any] = {}
    for s in select(data.spans, lambda s: s.name == ENGINE_SPAN and s.cat == REQUEST_CATEGORY):
        key = (s.pid, s.args.get("replica"))
        busy[key].append((s.start_ns, s.end_ns))
        # the lowest track: the replica's first request slot, which every busy interval's first request
        # takes (nothing in flight then) — the same track whatever part of the run was loaded (a live
        # watch's piece of one step, or the whole run), never the first span met
        if key not in tids or _track_key(s.tid) < _track_key(tids[key]):
            tids[key] = s.tid
    out = []
    for (pid, replica), intervals in busy.items():
        lane = f"replica_{replica}" if replica is not None else "replica"
        for start, end in iv.union(intervals):
            args = {LANE_ARG: lane, "replica": replica}
            out.append(Span(WORK_NAME, REQUEST_CATEGORY, pid, tids[(pid, replica)], start, end - start, args))
    return sorted(out, key=lambda s: (s.start_ns, str(s.pid)))
