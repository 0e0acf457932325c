"""TokenSpeed's scope links in the timeline model: a ``viztracer->proton`` flow from a scheduler rank's
VizTracer report to the Proton scope with the same ``args.scope_id``.

Shared vocabulary, because two stages use it: the Proton format pairs the flow starts with its scopes
to align its clock (:mod:`..formats.proton.pairing`), and the transform links them into flows
(:func:`..transform.passes.link_scopes`, fused in :mod:`..transform.flowspace`).
"""

from __future__ import annotations

import msgspec

from .model import BAD_JSON, Event

SCOPE_FLOW_NAME = "viztracer->proton"
SCOPE_FLOW_CAT = "tokenspeed.proton"


class ScopeArgs(msgspec.Struct, gc=False):
    scope_id: int | None = None


SCOPE_ARGS = msgspec.json.Decoder(ScopeArgs)
_SCOPE_LIST = msgspec.json.Decoder(list[ScopeArgs])


def scope_ids(scoped: list[Event]) -> list[int | None]:
    """Every ``args.scope_id`` in one decode (one call per scope costs more than the loop around it)."""
    try:
        raw = b"[" + b",".join([e.args for e in scoped]) + b"]"  # type: ignore[misc]
        return [v.scope_id for v in _SCOPE_LIST.decode(raw)]
    except BAD_JSON:  # one odd scope: decode them one by one, as link_scopes does
        ids: list[int | None] = []
        for e in scoped:
            try:
                ids.append(SCOPE_ARGS.decode(e.args).scope_id)  # type: ignore[arg-type]
            except BAD_JSON:
                ids.append(None)
        return ids
