"""The partner rules of one job's files, as the worker applies them: which file goes first, whose flow
starts wait, what each file aligns on, which scope ids a file collects or links to.

A job's files were put together by the planner (a TokenSpeed rank's VizTracer report and Proton
files, ``rank_role``: :mod:`.proton.pairing`); alignment runs on the events the job has read. The one
partner that lives in another job is a Torch trace's process's RL-Insight log (``AlignsOnPartner.partner``):
the planner names it in the Torch file's task and :func:`read_partner` reads it in that job, for its
stage spans only (:mod:`.kineto.pairing`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

from ..files.sources import Source, read_content
from . import format_for
from .base import KERNELS, REPORT, AlignsOnPartner, ReadContext, ReadResult, rank_role_of
from .base.chrome_json import NotATrace, gc_paused
from .proton.pairing import RankLinks

if TYPE_CHECKING:
    from ..clock.pairs import PairAlignment
    from ..timeline.model import Event


class TaskLike(Protocol):
    kind: str
    source: Source


T = TypeVar("T", bound=TaskLike)


class JobLinks:
    """What the files of one job need from each other (None of it when they need nothing)."""

    def __init__(self, tasks: Sequence[TaskLike]) -> None:
        roles = [rank_role_of(format_for(t.kind)) for t in tasks]
        self.rank = RankLinks() if RankLinks.applies(roles) else None

    def order(self, tasks: list[T]) -> list[T]:
        """A rank's report first: its flow starts are what the Proton files align on."""
        if self.rank is None:
            return tasks
        return sorted(tasks, key=lambda t: rank_role_of(format_for(t.kind)) != REPORT)

    def holds(self, task: TaskLike) -> bool:
        """A rank's report: its scope flow starts wait until the rank's Proton scopes are known."""
        return self.rank is not None and rank_role_of(format_for(task.kind)) == REPORT

    def hold_flows(self, url: str, events: list[Event], res: ReadResult) -> tuple[list[Event], list[Event]]:
        assert self.rank is not None
        return self.rank.hold_flows(url, events, res)

    def held(self, url: str, starts: list[Event], res: ReadResult) -> None:
        if self.rank is not None:
            self.rank.held(url, starts, res)

    def align(
        self,
        task: TaskLike,
        events: list[Event],
        res: ReadResult,
        partner: tuple[str, ReadResult] | None,
        tolerance_ns: int,
        apply: bool,
    ) -> PairAlignment | None:
        """The file's alignment on its partner: in this job (a rank's report) or read for it
        (``partner``, from :func:`read_partner`); None when it has none or nothing pairs."""
        fmt = format_for(task.kind)
        url = task.source.url
        if self.rank is not None and rank_role_of(fmt) == KERNELS:
            return self.rank.align(url, events, res, tolerance_ns, apply)
        if partner is not None and isinstance(fmt, AlignsOnPartner):
            return fmt.align_on(partner, url, events, res, tolerance_ns, apply)
        return None

    def scopes(
        self, task: TaskLike
    ) -> tuple[bool, set[int] | None, tuple[list[Event], list[int | None]] | None]:
        """(collect scope ids, the scope ids to link to, the scopes decoded for its alignment): a
        rank's Proton files collect, a VizTracer report links its flow starts to what they collected
        (none outside a rank: its scope flows are dropped as unlinked)."""
        role = rank_role_of(format_for(task.kind))
        rank = self.rank
        if role == KERNELS and rank is not None:
            return True, rank.scopes, rank.scope_ids
        if role == REPORT:
            return False, (rank.scopes if rank is not None else None) or set(), None
        return False, None, None

    def collected(self, scopes: set[int] | None) -> None:
        """A Proton file's scope ids, for the report's held flow starts."""
        if self.rank is not None:
            self.rank.scopes = scopes


def read_partner(source: Source, kind: str) -> ReadResult | None:
    """A partner file in another job, read here for its pairing events (None when it cannot be read:
    its own job reports why, and this file keeps the host clock)."""
    try:
        content = read_content(source)
        ctx = ReadContext(source.url, source.name, None, None, defer_times=True)
        with gc_paused():
            res = format_for(kind).read(content.data, ctx)
    except NotATrace:  # unreadable: no partner (read_content never raises)
        return None
    return None if res.skip else res
