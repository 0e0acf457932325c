""":func:`.passes.namespace_ids` and :func:`.passes.link_scopes`, fed one event at a time by the fused
loop (:mod:`.fastpath`) in the order those passes would see the events: the same ids, the same counts.

The hot case — a v1 flow event (``s``/``t``/``f``) with an id — is inlined in the loop itself (a method
call per flow event costs as much as the rest of its work); it keeps its chains in per-(cat, name)
dicts keyed by id, handed to :meth:`FlowSpace.finish` for the counts. Everything rarer lives here:
async ids, v2 ``bind_id`` s, TokenSpeed's scope links.
"""

from __future__ import annotations

from operator import is_
from typing import Any

from msgspec import UNSET

from ..timeline.model import Event
from ..timeline.scopes import SCOPE_FLOW_CAT, SCOPE_FLOW_NAME, scope_ids
from .passes import _ASYNC, _SEQ_BITS, PassContext, run_flow_id, scope_flow_id

SCOPE_ID_MASK = (1 << (_SEQ_BITS - 1)) - 1


class FlowSpace:
    """One artifact's id space (``namespace << 40``) and what its flows add up to."""

    __slots__ = ("base", "binds", "ctx", "linked", "others", "run_ends", "unlinked", "viz_scopes")

    def __init__(self, ctx: PassContext) -> None:
        self.ctx = ctx
        self.base = ctx.namespace << _SEQ_BITS
        self.binds: dict[int, list[int]] = {}  # v2 flows: [id, has start, has end, events]
        self.others: dict[tuple[Any, ...], int] = {}
        self.linked = self.unlinked = self.run_ends = 0
        # link_scopes' VizTracer side: flow starts kept only when their rank's Proton saw the scope
        self.viz_scopes = ctx.scopes if (ctx.scopes is not None and not ctx.collect_scopes) else None

    def add(self, e: Event, ph: str) -> bool:
        """Any flow-ish event but a v1 flow with an id; False: drop it (a scope link with no scope)."""
        fid = e.id
        if ph in _ASYNC and fid is not UNSET:
            e.id = self._other(("a", e.cat, fid))
        elif (
            ph == "s"
            and self.viz_scopes is not None
            and e.cat == SCOPE_FLOW_CAT
            and e.name == SCOPE_FLOW_NAME
        ):
            self.unlinked += 1  # a scope link start without an id never matches a scope
            return False
        if e.bind_id is not UNSET:
            self.bind(e)
        return True

    def bind(self, e: Event) -> None:
        """A v2 flow endpoint (``bind_id``): the id by value into this artifact's space, or into the
        run's (``passes.run_flow_id``: paired across artifacts, so counted apart)."""
        run_id = run_flow_id(e.bind_id)
        if run_id is not None:
            e.bind_id = run_id
            self.run_ends += 1
            return
        bid = e.bind_id = self._other(("b", e.bind_id))
        st = self.binds.get(bid)
        if st is None:
            st = self.binds[bid] = [bid, 0, 1, 0]
        st[1] |= e.flow_out is True
        st[3] += 1

    def scope_prefix(self) -> int:
        """``scope_flow_id(ns, sid) == scope_prefix() | (sid & SCOPE_ID_MASK)``: for the inlined loop."""
        return scope_flow_id(self.ctx.scope_namespace, 0)

    def _other(self, key: tuple[Any, ...]) -> int:
        new = self.others.get(key)
        if new is None:
            new = self.others[key] = self.base | ((1 << (_SEQ_BITS - 2)) + len(self.others) + 1)
        return new

    def finish(
        self, chains: dict[Any, dict[Any, list[int]]], links: int, unpaired: int, linked: int, unlinked: int
    ) -> None:
        """The counts the two passes report; ``chains``: the v1 flows the loop kept inline, ``linked`` /
        ``unlinked``: the scope link starts it kept / dropped."""
        self.linked += linked
        self.unlinked += unlinked
        ctx = self.ctx
        if self.viz_scopes is not None:
            if self.unlinked:
                ctx.count("unlinked_scope_flows", self.unlinked)
            ctx.count("flows", self.linked)
            ctx.count("scope_links", self.linked)
        fanned = ctx.fanned
        # passes._close, inlined: one per flow. The typed loop (_fastpath_native._close_chains) counts
        # its own chains by this same rule and passes none: a change here is made there too
        for states in [*chains.values(), self.binds]:
            for st in states.values():
                if st[1] and st[3] > 1:
                    links += st[3] - 1
                    if st[3] > 2 and fanned is not None and states is not self.binds:
                        fanned.add(st[0])
                else:
                    unpaired += st[3]
        ctx.count("flows", links)
        ctx.count("unpaired_flow_events", unpaired)
        if self.run_ends:
            ctx.count("run_flow_endpoints", self.run_ends)


def scope_ends(scoped: list[Event], out: list[Event], counts: dict[str, int], ctx: PassContext) -> None:
    """link_scopes' Proton side: a flow end on every scope slice with an ``args.scope_id``, appended.

    The ids come from ``ctx.scope_ids`` when it holds these very slices (decoded for the alignment)."""
    found = ctx.scopes if ctx.scopes is not None else set()
    prefix, mask, append, unset = scope_flow_id(ctx.scope_namespace, 0), SCOPE_ID_MASK, out.append, UNSET
    name, cat, end = SCOPE_FLOW_NAME, SCOPE_FLOW_CAT, "e"
    ends = 0
    known = ctx.scope_ids
    same = known is not None and len(known[0]) == len(scoped) and all(map(is_, known[0], scoped))
    ids = known[1] if same and known is not None else scope_ids(scoped)
    for e, sid in zip(scoped, ids, strict=True):
        if sid is None:
            continue
        found.add(sid)
        # Event(ph="f", name=..., cat=..., pid, tid, ts, id=scope_flow_id(ns, sid), bp="e"), positionally
        end_event = Event("f", name, cat, e.pid, e.tid, e.ts, unset, prefix | (sid & mask))
        end_event.bp = end
        append(end_event)
        ends += 1
    ctx.scopes = found
    ctx.count("scope_ends", ends)
    if ends:
        counts["f"] = counts.get("f", 0) + ends
