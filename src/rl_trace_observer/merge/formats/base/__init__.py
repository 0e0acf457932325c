"""What a format is: everything the merger knows about one kind of input file, in one place.

A format answers, for its own files and nobody else's:

- ``sniff(head)``: how sure am I that these first bytes (and the name) are mine? (0 = not mine)
- ``hints(head)``: what the name and head say before the file is read (pid, host, rank, step, an
  early time, the TokenSpeed rank group): planning facts only, the events are always read;
- ``read(data, ctx)``: the file's events on the timeline (absolute integer ns, or µs after the anchor
  the format found, ``deferred``, converted exactly once later: :mod:`..timeline.times`), the anchor,
  the names from its metadata, what it had to drop;
- ``step_markers(src)``: the step-marker spans of a file, read while planning (RL-Insight logs'
  ``global_step``, a profiler trace's ``ProfilerStep#N``; ``markers_rank`` says whose count);
- ``process_of`` / ``lane_of``: what a source pid means (an OS process, or a device/synthetic lane
  under its owner) and how to name a thread;
- and, as plain attributes, what the other stages ask of it: whether it holds events at all, how its
  slices are ordered, which of its spans the clock checks keep, its partner for clock alignment
  (inside its TokenSpeed rank, or in its process), the manifest counts it adds.

Identity remapping, id namespacing and filtering happen later, in :mod:`..transform.passes`, the
same way for every format. The registry (``formats/__init__.py``) lists every format once; no code
outside this package compares a kind string.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...files.sources import Head, Source
from ...timeline.model import Event, Problem, ProcessInfo
from ...timeline.steps import Marker

if TYPE_CHECKING:
    from ...clock.pairs import PairAlignment

SourcePid = int | str
# what ``process_of`` makes of a source pid: an ``int`` OS pid, a ``str`` naming a sub-process of the
# file's owner (``"GPU 0"``), or ``(pid, sub)``: a sub-process of ANOTHER process on the host (metric
# samples put a GPU's counters under ``GPU k`` of each process that used it, beside its Kineto kernels)
ProcessRef = int | str | tuple[int, str]
# ReadResult.meta[MANIFEST_ENTRY]: fields the format adds to its file's manifest entry (``artifacts[]``)
MANIFEST_ENTRY = "manifest_entry"

# rank_role: a file's place in one TokenSpeed scheduler rank (its VizTracer report and Proton files)
REPORT = "report"  # holds the viztracer->proton flow starts: the reference the kernels align on
KERNELS = "kernels"  # the Proton scopes: aligned on the report's flow starts, they end its flows
# causality: what the clock's stage checks take from a format's spans (pipeline/clock.py)
STAGES = "stages"  # spans other files' regions must sit inside (RL-Insight state spans)
REGIONS = "regions"  # spans that sit inside their process's stage of the same name (Torch regions)


@dataclass
class Hints:
    """What a file's name and head say before it is read (planning and linking only)."""

    pid: int | None = None
    host: str | None = None
    rank: int | None = None
    role: str | None = None
    step: int | None = None
    start_ns: int | None = None  # a time at or near the file's earliest event (planning the base)
    group: str | None = None  # TokenSpeed rank group: VizTracer and Proton of one scheduler
    tp: int | None = None


@dataclass
class ReadContext:
    """What the planner knows about a file before reading it."""

    path: str
    name: str
    anchor_ns: int | None = None  # from the owning process record's artifact entry, if any
    owner_pid: int | None = None  # OS pid of the owning process, when known
    defer_times: bool = False  # leave µs times for the fused fast path (names are read now)


@dataclass
class ReadResult:
    """A file's events on the timeline, plus what its metadata said."""

    events: list[Event] = field(default_factory=list)
    anchor_ns: int | None = None
    anchor_source: str | None = None
    process_names: dict[SourcePid, str] = field(default_factory=dict)
    process_labels: dict[SourcePid, str] = field(default_factory=dict)
    thread_names: dict[tuple[SourcePid, Any], str] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)  # host_name, rank, MANIFEST_ENTRY, ... found in it
    problems: list[Problem] = field(default_factory=list)
    read: int = 0  # events in the file, metadata events included
    metadata: int = 0  # of which metadata (``M``) events: names, not timeline events
    dropped: int = 0  # events that could not be used (invalid fields, out-of-range values)
    complete: bool = True
    skip: bool = False  # nothing of this file may be merged (e.g. unanchored)
    deferred: bool = False  # events still in source µs (``ctx.defer_times``): ts = anchor + µs


class Format:
    """One kind of input file. Subclass it, fill in what differs, and add one instance to the registry.

    The defaults are those of a file of timeline events with no partner: nothing is kept for the clock
    checks, no manifest count of its own, OS pids as they are and threads named by the file.
    """

    kind: str = ""  # manifest ``kind`` and process-record artifact kind
    label: str = ""  # thread-name prefix, e.g. "Torch" in "Torch · thread 12"
    order: int = 0  # position of this source's threads inside a process (merged tid bits)
    events: bool = True  # its files hold timeline events (False: process records, our own outputs)
    record: bool = False  # a process record: identity and registered artifacts, read while planning
    ignored: bool = False  # our own outputs: recognised only to be left alone
    slice_order: str = "start"  # "exit": a slice is written when it returns (VizTracer)
    probe: bool = False  # keep span summaries for the clock's causality checks (clock/probe.py)
    probe_cat: str | None = None  # ... of this category only (None: of every category)
    causality: str | None = None  # STAGES or REGIONS: its part in the clock's stage checks
    rank_role: str | None = None  # REPORT or KERNELS: its place in a TokenSpeed rank (one job)
    partner: str | None = None  # kind of the file in its process it aligns on (in another job)
    partner_label: str = ""  # how a problem names that partner file
    counts: tuple[tuple[str, bool], ...] = ()  # (stats key, always shown) it adds to manifest counts
    # whose step markers make the run's step windows: the formats of the lowest rank that has files
    # (0: RL-Insight logs, 1: profiler traces' ProfilerStep#N), as the report reads RL-Insight's spans
    # whenever a trace has any; None: its files hold no markers
    markers_rank: int | None = None

    def sniff(self, head: Head) -> int:
        return 0

    def hints(self, head: Head) -> Hints:
        return Hints()

    def read(self, data: bytes, ctx: ReadContext) -> ReadResult:
        return ReadResult(skip=True)

    def step_markers(self, src: Source) -> tuple[Marker, ...] | None:
        """The step-marker spans of one of its files, read cheaply while planning (the step rule is
        :mod:`...timeline.steps`); None: its files hold none (``markers_rank`` None: nothing is opened)."""
        return None

    def process_of(self, pid: SourcePid, result: ReadResult, ctx: ReadContext) -> ProcessRef:
        """An ``int`` OS pid, a ``str`` naming a sub-process of the owner (``"GPU 0"``), or
        ``(pid, sub)``: a sub-process of another OS process on the file's host."""
        return pid

    def lane_of(self, pid: SourcePid, tid: Any, result: ReadResult) -> str:
        return (result.thread_names.get((pid, tid)) or f"thread {tid}").strip()

    def align_on(
        self,
        partner: tuple[str, ReadResult],
        url: str,
        events: list[Event],
        res: ReadResult,
        tolerance_ns: int,
        apply: bool,
    ) -> PairAlignment | None:
        """The alignment of a file on its ``partner`` (its URL and its events as read), where the
        format has one (``partner``); None: nothing pairs."""
        return None

    # process records only (``record = True``)
    def identity(self, record: dict[str, Any], path: str) -> ProcessInfo:
        raise NotImplementedError(f"{self.kind} files are not process records")

    def registered(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        """The artifacts a record names (entries with a ``path``; ``optional``: may be absent)."""
        return []
