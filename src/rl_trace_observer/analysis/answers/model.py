"""The flat input every answer is computed from: work spans (role, lane, name, stage, start, end) and
step windows — one row per RL stage span, exactly what ``rl-trace sql`` shows as ``stage_spans``.

Kept separate from the report's loaders so that tests build the answers' input by hand (a few rows
with known idle causes, stragglers and critical paths) and the report feeds the same shape from a
trace or span shards. Times are integer ns on the merged timeline.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any, NamedTuple

__all__ = [
    "OVERHEAD",
    "PRODUCTIVE",
    "RL_BUCKETS",
    "StepWindow",
    "WorkSpan",
    "by_lane",
    "lane_kinds",
    "natural",
]

# goodput: every stage category is productive or overhead (NeMo-RL's buckets, less "wasted", which
# needs to know which samples were thrown away: only a span that says so, ``rl.bucket``, tells)
PRODUCTIVE = frozenset({"generation", "log_prob", "update"})
# nemo-lens's ``rl.bucket`` values: a span that carries one is counted in it, whatever its name
RL_BUCKETS = ("productive", "overhead", "idle", "wasted")
OVERHEAD = frozenset({"weight_sync", "other"})
TRAINER, ROLLOUT, OTHER_KIND = "trainer", "rollout", "other"


class WorkSpan(NamedTuple):
    role: str
    lane: str
    name: str
    stage: str  # the stage table's category (generation, log_prob, update, weight_sync, other)
    start_ns: int
    end_ns: int
    pid: Any = None  # the merged trace's process and thread ids (to point at the span in Perfetto)
    tid: Any = None
    bucket: str | None = None  # the span's own ``rl.bucket`` (one of RL_BUCKETS), None: by its stage


class StepWindow(NamedTuple):
    step: int | None
    start_ns: int
    end_ns: int


Lane = tuple[str, str]  # (role, lane)


def natural(text: str) -> tuple[object, ...]:
    """``rank_10`` after ``rank_9``."""
    import re

    return tuple((0, int(t)) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", text))


def by_lane(spans: Iterable[WorkSpan]) -> dict[Lane, list[WorkSpan]]:
    out: dict[Lane, list[WorkSpan]] = defaultdict(list)
    for s in spans:
        out[(s.role, s.lane)].append(s)
    return dict(sorted(out.items(), key=lambda kv: (kv[0][0], natural(kv[0][1]))))


def lane_kinds(lanes: dict[Lane, list[WorkSpan]]) -> dict[Lane, str]:
    """What a lane is, from what it does over the whole run: a trainer lane runs log-prob or update
    spans, a rollout lane generates (a lane doing both — a colocated hybrid engine — is a trainer:
    its generation is then its own work, never something it waits for); anything else (the driver,
    reward workers) is ``other``."""
    kinds = {}
    for lane, spans in lanes.items():
        stages = {s.stage for s in spans}
        if stages & {"log_prob", "update"}:
            kinds[lane] = TRAINER
        elif "generation" in stages:
            kinds[lane] = ROLLOUT
        else:
            kinds[lane] = OTHER_KIND
    return kinds
