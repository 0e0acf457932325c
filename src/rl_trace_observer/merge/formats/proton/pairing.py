"""A TokenSpeed rank's Proton files aligned on its VizTracer report: the Proton format's partner rule.

Every kernel scope Proton recorded has a ``viztracer->proton`` flow start in the rank's VizTracer
report, stamped just before it (:mod:`...timeline.scopes`). Both files are one job (the planner puts a
rank's files together: ``rank_role``), so each is read once: the report goes first, its flow starts
held back by the worker; the Proton files align on them and record their scope ids; the held starts
are written last, linked to the scopes Proton recorded. Pairs are measured on the readers' raw
timelines: both files share a host, so the host correction is stacked on top.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec
from msgspec import UNSET

from ...clock.pair_apply import by_scope, raw_ns
from ...clock.pair_events import match_keyed
from ...clock.pairs import PairAlignment, align_pairs
from ...timeline.model import BAD_JSON, Event
from ...timeline.scopes import SCOPE_FLOW_CAT, SCOPE_FLOW_NAME, scope_ids
from ...timeline.select import pick
from ..base import KERNELS, REPORT, ReadResult

__all__ = ["RankLinks", "proton_scope_starts_of", "proton_scopes", "viz_scope_starts_of"]


class _FlowArgs(msgspec.Struct, gc=False):
    scope_id: Any = None


_ARGS = msgspec.json.Decoder(_FlowArgs)


class RankLinks:
    """A TokenSpeed rank's reports: Proton aligns on the VizTracer flow starts, and those starts link
    only to scopes Proton recorded.

    Each file is read once, for every output format: Perfetto sorts by time, so file position does
    not matter (the protobuf writer keeps the report's slices until its starts are linked).
    """

    def __init__(self) -> None:
        self.scopes: set[int] | None = None
        self._partner: tuple[str, dict[int, list[int]]] | None = None
        # the last Proton file's scopes and their ids, decoded for its alignment: its scope link pass
        # takes them as they are (see :func:`...transform.flowspace.scope_ends`)
        self.scope_ids: tuple[list[Event], list[int | None]] | None = None

    @staticmethod
    def applies(roles: Iterable[str | None]) -> bool:
        return {REPORT, KERNELS} <= set(roles)

    def hold_flows(self, url: str, events: list[Event], res: ReadResult) -> tuple[list[Event], list[Event]]:
        """(the report's events without its scope flow starts, those starts); the first report with
        starts becomes the Proton files' partner. The fused fast path holds them itself
        (:func:`...transform.fastpath.to_output`'s ``hold``) and calls :meth:`held`."""
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


def proton_scope_starts_of(
    events: Iterable[Event], anchor_ns: int, *, deferred: bool
) -> dict[int, list[int]]:
    """scope_id → raw start ns of the Proton kernel scopes among a file's events (``cat: "scope"``).

    ``deferred``: the events still hold the source's µs (:attr:`..base.ReadResult.deferred`);
    ``anchor_ns`` is then the reader's anchor, else ignored. Events whose ``args`` do not decode, or
    carry no integer ``scope_id``, are not paired (the scope link pass skips them too).
    """
    scoped, ids = proton_scopes(events)
    return by_scope(ids, raw_ns([e.ts for e in scoped], anchor_ns, deferred))


def proton_scopes(events: Iterable[Event]) -> tuple[list[Event], list[int | None]]:
    """A Proton file's kernel scopes (``cat: "scope"`` slices with args and a time) and their
    ``args.scope_id`` s, decoded once: the scope link pass can take them as they are."""
    scoped = pick(events, "X", ("scope",), ("args", "ts"))
    return scoped, scope_ids(scoped)


def viz_scope_starts_of(events: list[Event], anchor_ns: int, *, deferred: bool) -> dict[int, list[int]]:
    """scope_id → raw ns of a VizTracer report's ``viztracer->proton`` flow starts (their ``id``, which
    the scope link pass matches too; ``args.scope_id`` when the id is not an integer)."""
    timed = [e for e in events if e.ts is not UNSET]
    return by_scope([_flow_scope(e) for e in timed], raw_ns([e.ts for e in timed], anchor_ns, deferred))


def _flow_scope(e: Event) -> Any:
    if e.id.__class__ is int or e.args is UNSET:
        return e.id
    try:
        return _ARGS.decode(e.args).scope_id
    except BAD_JSON:
        return None
