"""What a job is: the files it reads (tasks), what the planner decided for them, and what it returns.

Plain data, shared by the parent (which builds jobs and folds their results into the manifest) and
the worker processes (which run them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..clock.correction import TimeCorrection
from ..clock.probe import SpanSummaries, SpanSummary
from ..files.sources import Source
from ..shards.spec import ShardSpec
from ..timeline.identity import ProcessDecl, ThreadDecl
from ..timeline.model import Problem, ProcessKey

SLICE_PHASES = ("X", "B", "i", "I", "b", "n")
INFLIGHT_BYTES = 256 << 20  # estimated decompressed input being parsed at once (all of a pool's workers)


@dataclass
class Task:
    """One file of a job, with everything the planner decided about it."""

    index: int
    source: Source
    kind: str
    host: str
    owner_key: ProcessKey
    owner_merged: int
    anchor_ns: int | None
    namespace: int
    correction: TimeCorrection
    partner: Source | None = None  # the file in another job it aligns on (a Torch trace's RL-Insight log)
    # the file's OS processes are its owner's engine (a rollout engine's worker processes, whose trace
    # the server registered): drawn as the owner's process, not as processes of their own
    fold_into_owner: bool = False
    # byte ranges of whole lines the reader is not given (``MergeOptions.skip_lines``; windows only)
    skip_lines: tuple[tuple[int, int], ...] = ()


@dataclass
class Job:
    tasks: list[Task]
    base_ns: int
    out_format: str  # "json", "json.gz", "pftrace" or "pftrace.gz"
    planned: dict[ProcessKey, int]
    titles: dict[int, str]  # merged pid -> process name, for writers that name processes themselves
    windows: tuple[tuple[int | None, int | None], ...] = ()
    min_dur_ns: int = 0
    scope_namespace: int = 0
    sequence_id: int = 1
    weight: int = 0
    spill_path: str | None = None  # where a worker process leaves big outputs (see ..output.spill)
    clock_mode: str = "auto"  # the user's --clock: "wall" keeps raw placement (pairs are only reported)
    clock_tolerance_ns: int = 1_000_000
    shards: ShardSpec | None = None  # also write the kept events as span rows (..shards)


@dataclass
class Outcome:
    index: int
    sha256: str | None = None
    complete: bool = True
    read: int = 0
    kept: int = 0
    dropped: int = 0
    filtered: int = 0
    anchor_ns: int | None = None
    anchor_source: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    phases: dict[str, int] = field(default_factory=dict)
    min_ts: int | None = None
    max_ts: int | None = None
    skipped: bool = False
    dropped_why: dict[str, int] = field(default_factory=dict)  # reason -> events left out
    emitted: bool = False  # its events reached the writers (a failure after that is not its alone)
    spans: SpanSummaries | list[SpanSummary] = field(default_factory=list)  # the clock causality checks'
    clock: dict[str, Any] | None = None  # per-artifact alignment record (manifest timeline.clock.artifacts)


@dataclass
class JobResult:
    outcomes: list[Outcome]
    processes: dict[int, ProcessDecl]
    threads: dict[tuple[int, int], ThreadDecl]
    pieces: list[Any]
    writer_stats: dict[str, Any] = field(default_factory=dict)
    shards: list[dict[str, Any]] = field(default_factory=list)  # span shard parts written (..shards)
