"""What one file carries through the job's stages, and what the job shares between its files.

Why two objects instead of parameters: every feature of the merge (fast path, held flow starts,
``.pftrace`` sequences, span shards, far-away times, fanned-out flows) used to add a parameter to
every stage. A stage now takes the file and the run, reads what it needs and records what it
learned on the file, so the next feature adds a field, not a parameter to a dozen calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ..clock.correction import TimeCorrection
from ..formats import ReadResult
from ..formats.partners import JobLinks
from ..timeline.model import Event
from ..transform.passes import IdentityMapper, PassContext
from .spec import Job, JobResult, Outcome, Task


class Emitter(Protocol):
    """Where a job's kept events go, handed over once per file (:mod:`.emit`)."""

    def emit(self, f: FileJob, run: JobRun) -> None: ...

    def close(self, run: JobRun) -> None: ...


@dataclass
class JobRun:
    """One job's shared state: its partners and held flows, its emitters, and its result."""

    job: Job
    links: JobLinks
    result: JobResult
    emitters: list[Emitter]
    in_worker: bool = False  # a pool worker process: spill outputs, keep arenas between files
    held: list[FileJob] = field(default_factory=list)  # rank reports' flow starts, written last

    @property
    def protobuf(self) -> bool:
        return self.job.out_format.startswith("pftrace")


@dataclass
class FileJob:
    """One file on its way through the stages; each stage fills in what the next one reads.

    Times of ``events``/``kept``: as the reader left them (absolute ns, or µs after the anchor when
    ``res.deferred``) until the passes run; after them, absolute ns from the listed passes, or the
    output's units relative to ``job.base_ns`` from the fused path (``unit_ns``: 1000 for Chrome JSON
    µs, 1 for protobuf ns; ``far`` lists the JSON events whose µs double misses the ns).
    """

    task: Task
    out: Outcome
    fast: bool  # the fused fast path (one loop does every pass)
    job_base_ns: int  # the job's base: fused-path times are relative to it
    res: ReadResult | None = None
    mapper: IdentityMapper | None = None
    events: list[Event] = field(default_factory=list)
    correction: TimeCorrection | None = None
    hold: list[Event] | None = None  # a rank report's scope flow starts, set aside by the align stage
    ctx: PassContext | None = None
    kept: list[Event] = field(default_factory=list)
    in_order: dict[Any, bool] | None = None  # fused protobuf path: which threads are start-ordered
    far: dict[int, int] = field(default_factory=dict)
    unit_ns: int = 1000
    wait: bool = False  # its emitted events wait for its held flow starts (a rank's report)

    @property
    def url(self) -> str:
        return self.task.source.url

    @property
    def relative_to(self) -> int | None:
        """The base the kept times are relative to (fused path), None where they are absolute."""
        return self.job_base_ns if self.fast else None


__all__ = ["Emitter", "FileJob", "JobRun"]
