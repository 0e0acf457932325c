"""The one small interface every source format implements.

A reader answers three questions about its format and nothing else:

- ``sniff(head)``: how sure am I that these first bytes (and the name) are mine? (0 = not mine)
- ``read(data, ctx)``: the file's events with ``ts``/``dur`` already in absolute integer ns, the
  anchor used, names from its metadata events, and what it had to drop;
- ``process_of(pid, result)`` / ``lane_of(pid, tid, result)``: what a source pid means (an OS
  process, or a device/synthetic lane that belongs under its owner) and how to name a thread.

Identity remapping, id namespacing and filtering happen later, in :mod:`..passes`, the same way
for every format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ..files.sources import Head
from ..timeline.model import Event, Problem

SourcePid = int | str


@dataclass
class ReadContext:
    """What the planner knows about a file before reading it."""

    path: str
    name: str
    anchor_ns: int | None = None  # from the owning process record's artifact entry, if any
    owner_pid: int | None = None  # OS pid of the owning process, when known
    defer_times: bool = False  # leave µs times (and metadata events) for the fused fast path


@dataclass
class ReadResult:
    """A file's events on the absolute ns timeline, plus what its metadata said."""

    events: list[Event] = field(default_factory=list)
    anchor_ns: int | None = None
    anchor_source: str | None = None
    process_names: dict[SourcePid, str] = field(default_factory=dict)
    process_labels: dict[SourcePid, str] = field(default_factory=dict)
    thread_names: dict[tuple[SourcePid, Any], str] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)  # host_name, rank, ... found in the file
    problems: list[Problem] = field(default_factory=list)
    read: int = 0  # events in the file, metadata events included
    metadata: int = 0  # of which metadata (``M``) events: names, not timeline events
    dropped: int = 0  # events that could not be used (invalid fields, out-of-range values)
    complete: bool = True
    skip: bool = False  # nothing of this file may be merged (e.g. unanchored)
    deferred: bool = False  # events still in source µs (``ctx.defer_times``): ts = anchor + µs


class Reader(Protocol):
    kind: str  # manifest ``kind`` and process-record artifact kind
    label: str  # thread-name prefix, e.g. "Torch" in "Torch · thread 12"
    order: int  # position of this source's threads inside a process

    def sniff(self, head: Head) -> int: ...

    def read(self, data: bytes, ctx: ReadContext) -> ReadResult: ...

    def process_of(self, pid: SourcePid, result: ReadResult, ctx: ReadContext) -> SourcePid:
        """An ``int`` OS pid, or a ``str`` naming a sub-process of the owner (``"GPU 0"``)."""
        ...

    def lane_of(self, pid: SourcePid, tid: Any, result: ReadResult) -> str: ...
