"""Who a span or a kernel belongs to: the role, rank and host of a merged process, and a span's lane.

The merge names every process ``host · pid N · <role> rank R (…)`` (its GPU sub-processes add
``· GPU d``) and gives RL-Insight spans their lane id; the report reads those, and for a trace it did
not merge (one raw Kineto file) takes the rank from the file's ``distributedInfo``.
"""

from __future__ import annotations

import re
from typing import Any

from .load import Span, TraceData

__all__ = ["STAGE_CATS", "lane_of", "process_identity", "process_role"]

STAGE_CATS = ("rl_insight", "verl")


_LABEL_ROLE = re.compile(r"^([A-Za-z][\w.-]*)(?:\s+(?:rank|replica)\s+\d+)?(?:\s+\(.*\))?$")


def process_role(data: TraceData, pid: Any) -> str:
    """The role of a merged process: its ``role`` arg, else the role word of its merged label."""
    args = data.process_args.get(pid) or {}
    if isinstance(args.get("role"), str) and args["role"]:
        return str(args["role"])
    parts = [p.strip() for p in data.process_names.get(pid, "").split("·")]
    merged = len(parts) > 1 and parts[1].startswith(("pid ", "unknown pid"))
    for part in parts[2:] if merged or len(parts) > 2 else parts:  # ``host · pid N``: no role, not the host
        m = _LABEL_ROLE.match(part)
        if m and not part.startswith(("pid ", "clock", "rank ", "replica ")):
            return m.group(1)
    return "unknown"


_RANK = re.compile(r"(?:^|\s)rank\s+(\d+)\b")


def process_identity(data: TraceData, pid: Any) -> tuple[str, int | None, str | None]:
    """(role, rank, host) of a merged process: its args, else its label ``host · pid N · role rank R``;
    a trace we did not merge is one process, ranked by its ``distributedInfo``."""
    if not (data.metadata.get("rl_trace_observer") or data.mode == "shards"):
        info = data.metadata.get("distributedInfo") or {}
        rank = info.get("rank") if isinstance(info, dict) else None
        return "unknown", rank if isinstance(rank, int) else None, None
    parts = [p.strip() for p in data.process_names.get(pid, "").split("·")]
    rank = next((int(m.group(1)) for p in parts[2:] if (m := _RANK.search(p))), None)
    host = parts[0] if len(parts) > 1 and parts[1].startswith("pid ") else None
    return process_role(data, pid), rank, host


def lane_of(data: TraceData, span: Span) -> str:
    """RL-Insight's lane; else, for a ranked process, ``rank N`` (a profiler-only trace); else the
    thread's name."""
    lane = span.args.get("state_lane_id")
    if lane is not None:
        return str(lane)
    rank = None if span.cat.startswith((*STAGE_CATS, "rl_trace")) else process_identity(data, span.pid)[1]
    if rank is not None:
        return f"rank {rank}"
    name = data.thread_names.get((span.pid, span.tid))
    if name:
        return name.rsplit("·", 1)[-1].strip()
    return f"tid {span.tid}"
