"""Flow events no slice can take: left out of both outputs, so ``.json`` and ``.pftrace`` agree.

A v1 flow event (``s``, ``t``, or ``f`` with ``bp: "e"``) binds to the slice on top of its thread's
stack at its time. Where its thread has no slice that started at or before it, Perfetto's JSON importer
drops it (import error ``flow_no_enclosing_slice``) while a protobuf writer would have to give it an
instant of its own: one more slice in ``.pftrace`` than in ``.json`` for every such event (a 2021
PyTorch trace whose flow starts name their thread differently from its slices had 18,192). The merge
leaves them out of both, counted (``unbound_flow_events``) and reported as dropped events.

Binding slices are ``X`` and ``B`` events of the same merged thread; times in any unit that keeps order.
An ``f`` without ``bp: "e"`` binds to the next slice that begins, whenever that is: never judged here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from msgspec import UNSET

from ..timeline.model import Event
from ..timeline.scopes import SCOPE_FLOW_CAT, SCOPE_FLOW_NAME

__all__ = ["UNBOUND", "binds_enclosing", "first_starts", "recount", "unbound"]

UNBOUND = "unbound_flow_events"  # the stats key (manifest: counted with the file's dropped events)
_V1 = frozenset("stf")
_SLICES = frozenset("XB")


def binds_enclosing(e: Event) -> bool:
    """A chained v1 flow event (not a TokenSpeed scope link) that binds to the slice open at its time."""
    return (
        e.ph in _V1
        and e.id is not UNSET
        and (e.ph != "f" or e.bp == "e")
        and not (e.cat == SCOPE_FLOW_CAT and e.name == SCOPE_FLOW_NAME)
    )


def first_starts(events: Iterable[Event]) -> dict[tuple[Any, Any], Any]:
    """The earliest start of an ``X`` or ``B`` slice per (pid, tid)."""
    first: dict[tuple[Any, Any], Any] = {}
    for e in events:
        if e.ph in _SLICES:
            key = (e.pid, e.tid)
            at = first.get(key)
            if at is None or e.ts < at:
                first[key] = e.ts
    return first


def unbound(events: Iterable[Event], first: dict[tuple[Any, Any], Any]) -> set[int]:
    """``id()`` of the flow events of ``events`` that no slice of their thread can take."""
    out: set[int] = set()
    for e in events:
        if binds_enclosing(e):
            at = first.get((e.pid, e.tid))
            if at is None or e.ts < at:
                out.add(id(e))
    return out


def recount(events: Iterable[Event]) -> dict[Any, list[Any]]:
    """The v1 flow chains of namespaced events (one new id per chain): ``{id: [id, has start, has end,
    events]}``, what the fused loop's inline chains hold (:meth:`.flowspace.FlowSpace.finish`)."""
    chains: dict[Any, list[Any]] = {}
    for e in events:
        ph = e.ph
        if ph in _V1 and e.id is not UNSET and not (e.cat == SCOPE_FLOW_CAT and e.name == SCOPE_FLOW_NAME):
            st = chains.get(e.id)
            if st is None:
                st = chains[e.id] = [e.id, False, False, 0]
            st[1] = st[1] or ph == "s"
            st[2] = st[2] or ph == "f"
            st[3] += 1
    return chains
