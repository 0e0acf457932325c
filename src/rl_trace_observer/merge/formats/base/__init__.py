"""What a format is: everything the merger knows about one kind of input file, in one place.

A format answers, for its own files and nobody else's (the core, :class:`Format`):

- ``sniff(head)``: how sure am I that these first bytes (and the name) are mine? (0 = not mine)
- ``hints(head)``: what the name and head say before the file is read (pid, host, rank, step, an
  early time, the TokenSpeed rank group): planning facts only, the events are always read;
- ``read(data, ctx)``: the file's events on the timeline (absolute integer ns, or µs after the anchor
  the format found, ``deferred``, converted exactly once later: :mod:`...timeline.times`), the anchor,
  the names from its metadata, what it had to drop;
- ``process_of`` / ``lane_of``: what a source pid means (an OS process, or a device/synthetic lane
  under its owner) and how to name a thread;
- as plain attributes: whether it holds events at all, how its slices are ordered, the manifest
  counts it adds.

What only some formats do is a capability they mix in, and the stage that needs it asks for it:
step markers (:class:`MarksSteps`), spans for the clock's checks (:class:`ClockEvidence`), alignment
on a partner file of its process (:class:`AlignsOnPartner`), a place in a TokenSpeed rank
(:class:`InTokenSpeedRank`), process identity (:class:`ProcessRecords`).

Identity remapping, id namespacing and filtering happen later, in :mod:`...transform.passes`, the
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
    # the role the file states for the process it belongs to (an OTLP resource's): its process label
    process_role: str | None = None


@dataclass
class ReadContext:
    """What the planner knows about a file before reading it."""

    path: str
    name: str
    anchor_ns: int | None = None  # from the owning process record's artifact entry, if any
    owner_pid: int | None = None  # OS pid of the owning process, when known
    defer_times: bool = False  # leave µs times for the fused fast path (names are read now)
    partner: str | None = None  # URL of the partner file the job will align it on (``AlignsOnPartner``)


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
    # of those, the ones whose reason the reader could tell (reason -> count; manifest ``dropped_why``)
    dropped_why: dict[str, int] = field(default_factory=dict)
    complete: bool = True
    skip: bool = False  # nothing of this file may be merged (e.g. unanchored)
    deferred: bool = False  # events still in source µs (``ctx.defer_times``): ts = anchor + µs


class Format:
    """One kind of input file: the core every format answers. Subclass it, fill in what differs, mix
    in the capabilities below that the format has, and add one instance to the registry.

    The defaults are those of a file of timeline events: OS pids as they are, threads named by the
    file, no manifest count of its own, no capability.
    """

    kind: str = ""  # manifest ``kind`` and process-record artifact kind
    stack: str = ""  # the RL stack whose own files this format reads ("areal", "nemo-rl"); "" = any
    label: str = ""  # thread-name prefix, e.g. "Torch" in "Torch · thread 12"
    order: int = 0  # position of this source's threads inside a process (merged tid bits)
    events: bool = True  # its files hold timeline events (False: process records, our own outputs)
    ignored: bool = False  # our own outputs: recognised only to be left alone
    slice_order: str = "start"  # "exit": a slice is written when it returns (VizTracer)
    counts: tuple[tuple[str, bool], ...] = ()  # (stats key, always shown) it adds to manifest counts

    def sniff(self, head: Head) -> int:
        return 0

    def hints(self, head: Head) -> Hints:
        return Hints()

    def read(self, data: bytes, ctx: ReadContext) -> ReadResult:
        return ReadResult(skip=True)

    def process_of(self, pid: SourcePid, result: ReadResult, ctx: ReadContext) -> ProcessRef:
        """An ``int`` OS pid, a ``str`` naming a sub-process of the owner (``"GPU 0"``), or
        ``(pid, sub)``: a sub-process of another OS process on the file's host."""
        return pid

    def lane_of(self, pid: SourcePid, tid: Any, result: ReadResult) -> str:
        return (result.thread_names.get((pid, tid)) or f"thread {tid}").strip()

    def process_role(self, pid: SourcePid, result: ReadResult) -> str | None:
        """The role the file states for one of its OS processes (an OTLP resource's), named in the
        title of a process no record or hint plans (a Collector's file holds many); None: none."""
        return None


# ---------------------------------------------------------------------------------- capabilities
# A format mixes in what it does; a stage asks ``isinstance(fmt, Capability)``. The contract test
# (tests/merge/test_format_contract.py) checks that no format sets a capability's attribute without it.


class MarksSteps:
    """Its files hold step markers, read while planning (the step rule is :mod:`...timeline.steps`)."""

    # whose step markers make the run's step windows: the formats of the lowest rank that has files
    # (0: RL-Insight logs, 1: profiler traces' ProfilerStep#N), as the report reads RL-Insight's spans
    # whenever a trace has any
    markers_rank: int = 0
    # its step markers are ns after the file's anchor, which its process record gives (AReaL's perf
    # traces count from a perf_counter origin): the planner adds the linked anchor, and a file without
    # one gives no markers
    markers_relative: bool = False

    def step_markers(self, src: Source) -> tuple[Marker, ...] | None:
        """The step-marker spans of one of its files, read cheaply while planning."""
        return None


class ClockEvidence:
    """Some of its spans go to the clock's causality checks (:mod:`...clock.probe`)."""

    probe_cat: str | None = None  # keep spans of this category only (None: of every category)
    causality: str | None = None  # STAGES or REGIONS: its part in the clock's stage checks


class AlignsOnPartner:
    """Aligned on another file of its process, read again inside its job (:mod:`..partners`)."""

    partner: str = ""  # kind of the file in its process it aligns on
    partner_label: str = ""  # how a problem names that partner file

    def align_on(
        self,
        partner: tuple[str, ReadResult],
        url: str,
        events: list[Event],
        res: ReadResult,
        tolerance_ns: int,
        apply: bool,
    ) -> PairAlignment | None:
        """The alignment of a file on its ``partner`` (its URL and its events as read); None: nothing
        pairs."""
        return None


class InTokenSpeedRank:
    """Merged in one job with the other files of its TokenSpeed scheduler rank (:mod:`..partners`)."""

    rank_role: str = ""  # REPORT or KERNELS: its place in the rank


class ProcessRecords:
    """Process records: identity and registered artifacts, read while planning (no timeline events)."""

    def identity(self, record: dict[str, Any], path: str) -> ProcessInfo:
        raise NotImplementedError

    def registered(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        """The artifacts a record names (entries with a ``path``; ``optional``: may be absent)."""
        return []


class SharesPid:
    """A file that names no pid takes the pid of another file of its process, paired by path (an
    AReaL session file takes its perf trace's). Both formats of a pair mix it in and answer
    ``pid_key`` for their own paths."""

    # kind of the file whose pid a file of this format takes when it names none and no record links
    # it: the one with the same ``pid_key`` (None: its files give their pid to others)
    pid_from: str | None = None

    def pid_key(self, path: str) -> Any:
        """What pairs a file of this format with its twin (None: nothing)."""
        return None


CAPABILITIES: tuple[type, ...] = (
    MarksSteps,
    ClockEvidence,
    AlignsOnPartner,
    InTokenSpeedRank,
    ProcessRecords,
    SharesPid,
)


def partner_of(fmt: Format | None) -> str | None:
    """The kind of the file ``fmt`` aligns on in its process, if it has one."""
    return fmt.partner if isinstance(fmt, AlignsOnPartner) else None


def rank_role_of(fmt: Format | None) -> str | None:
    """REPORT or KERNELS for a file of a TokenSpeed rank, else None."""
    return fmt.rank_role if isinstance(fmt, InTokenSpeedRank) else None
