"""Partner sources inside one process, so that one can be aligned on the other (issue 8).

Two kinds of partners:

- a TokenSpeed rank's VizTracer report and its Proton files (:class:`RankLinks`): every kernel scope
  Proton recorded has a ``viztracer->proton`` flow start in the report, stamped just before it;
- a process's RL-Insight event log and its Torch traces (:class:`StageLinks`): a Torch
  ``record_function`` region (``user_annotation``) runs inside the RL-Insight stage of the same name
  (VERL's ``DistProfiler.annotate`` nests the one in the other).

The reference (VizTracer, RL-Insight) is read first, so the file that is corrected (Proton, Torch) is
read, aligned and written in one pass. A rank's reports share a job; a Torch job reads its process's
RL-Insight log (a few MB) for the stages only, while the log itself is merged by its own job.
:mod:`.pairs` estimates, :mod:`.pair_apply` bridges the merge's events. Pairs are measured
on the readers' raw timelines: both files share a host, so the host correction is stacked on top.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ..files.sources import Source, read_content
from ..formats import ReadContext, ReadResult, reader_for
from ..formats.chrome_json import NotATrace, gc_paused
from ..timeline.model import Event
from ..transform.passes import SCOPE_FLOW_CAT, SCOPE_FLOW_NAME
from .pair_apply import as_span_dicts, by_scope, proton_scopes, raw_ns, viz_scope_starts_of
from .pair_events import match_keyed, stage_pairs
from .pairs import PairAlignment, align_pairs

__all__ = ["STAGE_CAT", "RankLinks", "StageLinks"]

STAGE_CAT = "rl_insight"  # RL-Insight state spans (trace_state): the stages a Torch region nests in
REGION_CAT = "user_annotation"  # Kineto's category for record_function regions on the CPU


class _TaskLike(Protocol):
    kind: str
    source: Source
    anchor_ns: int | None


class RankLinks:
    """A TokenSpeed rank's reports: Proton aligns on the VizTracer flow starts, and those starts link
    only to scopes Proton recorded.

    The VizTracer report goes first, its flow starts (one per kernel scope) held back by the worker;
    the Proton files align on them and record their scope ids; the held starts are written last.
    Each file is read once, for every output format: Perfetto sorts by time, so file position does
    not matter (the protobuf writer keeps the report's slices until its starts are linked).
    """

    def __init__(self, tasks: Sequence[_TaskLike]) -> None:
        self.scopes: set[int] | None = None
        self._partner: tuple[str, dict[int, list[int]]] | None = None
        # the last Proton file's scopes and their ids, decoded for its alignment: its scope link pass
        # takes them as they are (see :func:`..transform.flowspace.scope_ends`)
        self.scope_ids: tuple[list[Event], list[int | None]] | None = None

    @staticmethod
    def applies(tasks: Sequence[_TaskLike]) -> bool:
        return {t.kind for t in tasks} >= {"proton", "viztracer"}

    def order(self, tasks: Sequence[Any]) -> list[Any]:
        return sorted(tasks, key=lambda t: t.kind != "viztracer")

    def hold_flows(self, url: str, events: list[Event], res: ReadResult) -> tuple[list[Event], list[Event]]:
        """(the report's events without its scope flow starts, those starts); the first report with
        starts becomes the Proton files' partner. The fused fast path holds them itself
        (:func:`..transform.fastpath.to_output`'s ``hold``) and calls :meth:`held`."""
        name, cat = SCOPE_FLOW_NAME, SCOPE_FLOW_CAT
        starts = [e for e in events if e.ph == "s" and e.name == name and e.cat == cat]
        if not starts:
            return events, starts
        held = set(map(id, starts))
        self.held(url, starts, res)
        return [e for e in events if id(e) not in held], starts

    def held(self, url: str, starts: list[Event], res: ReadResult) -> None:
        """A report's scope flow starts, as read: the first report with any is the partner."""
        if starts and self._partner is None:
            self._partner = url, viz_scope_starts_of(starts, res.anchor_ns or 0, deferred=res.deferred)

    def align(
        self, url: str, events: list[Event], res: ReadResult, tolerance_ns: int, apply: bool
    ) -> PairAlignment | None:
        """A Proton file's alignment on its VizTracer partner (None: no partner was readable)."""
        self.scope_ids = None
        if self._partner is None:
            return None
        viz_url, viz_starts = self._partner
        scoped, ids = self.scope_ids = proton_scopes(events)
        starts = by_scope(ids, raw_ns([e.ts for e in scoped], res.anchor_ns or 0, res.deferred))
        return align_pairs(
            match_keyed(viz_starts, starts),
            artifact=url,
            partner=viz_url,
            pairing="scope_id",
            tolerance_ns=tolerance_ns,
            apply=apply,
        )


class StageLinks:
    """A process's RL-Insight stages, for its Torch traces to align on (``policy="minimal"``).

    Why minimal: a stage wraps its region with gaps of its own (a profiler step starting, Python
    around the call), so the data bound the offset without pinning it; the region moves only as far
    as needed to sit inside its stage, and the manifest states the bounds as the uncertainty.
    """

    def __init__(self) -> None:
        self.stages: list[dict[str, Any]] = []
        self.url: str | None = None

    @classmethod
    def read(cls, log: Source) -> StageLinks:
        """The stages of a process's RL-Insight event log (none when it cannot be read: its own job
        reports why, and the Torch trace keeps the host clock)."""
        links = cls()
        try:
            content = read_content(log)
            ctx = ReadContext(log.url, log.name, None, None, defer_times=True)
            with gc_paused():
                res = reader_for("rl_insight").read(content.data, ctx)
        except NotATrace:  # unreadable: no stages; its own job reports why (read_content never raises)
            return links
        if not res.skip:
            links.add(log.url, res.events, res)
        return links

    def add(self, url: str, events: list[Event], res: ReadResult) -> None:
        found = as_span_dicts(events, res.anchor_ns or 0, deferred=res.deferred, cats=(STAGE_CAT,))
        if found and self.url is None:
            self.url = url
        self.stages.extend(found)

    def align(
        self, url: str, events: list[Event], res: ReadResult, tolerance_ns: int, apply: bool
    ) -> PairAlignment | None:
        """A Torch trace's alignment on the stages (None: no region has a same-named stage)."""
        if not self.stages or self.url is None:
            return None
        regions = as_span_dicts(events, res.anchor_ns or 0, deferred=res.deferred, cats=(REGION_CAT,))
        pairs = stage_pairs(self.stages, regions, stage_cats=None, region_cats=None)
        if not pairs:
            return None
        return align_pairs(
            pairs,
            artifact=url,
            partner=self.url,
            pairing="stage_name",
            policy="minimal",
            tolerance_ns=tolerance_ns,
            apply=apply,
        )
