"""VizTracer reports saved by its Python API (``VizTracer.save()``), TokenSpeed's included.

The anchor is ``viztracer_metadata.baseTimeNanoseconds`` (wall clock minus the monotonic clock, so
``ts`` are monotonic µs); it is written after the events (and before ``file_info``, the traced sources,
which can be megabytes), so a big report is recognised by its tail or else by the shape of its head —
whatever its name (VizTracer's default ``result.json``, ours ``viztracer_*_pid*.json``). The
VizTracer CLI (1.1.1) writes no anchor: such a file is ``unanchored`` unless its process record
supplies one.
"""

from __future__ import annotations

import re

from msgspec import UNSET

from ..files.sources import Head
from .base import REPORT, Format, Hints, InTokenSpeedRank, ReadContext, ReadResult, chrome_json
from .base.chrome_hints import chrome_hints

# What VizTracer writes first (orjson compact or the stdlib's spaced JSON): its process/thread names,
# then function entry/exit slices of category "FEE".
_SHAPE = re.compile(rb'\{\s*"traceEvents"\s*:\s*\[\s*\{\s*"ph"\s*:\s*"M"\s*,\s*"pid"\s*:')
_FEE = re.compile(rb'"cat"\s*:\s*"FEE"')


class VizTracer(Format, InTokenSpeedRank):
    kind = "viztracer"
    label = "VizTracer"
    order = 3
    slice_order = "exit"  # a call is written when it returns: the merge's nesting check expects that
    # a TokenSpeed scheduler's report: its viztracer->proton flow starts are what its rank's Proton
    # files align on and end on (proton/pairing.py); outside a rank they link to nothing (dropped)
    rank_role = REPORT
    counts = (("scope_links", True),)  # flows from its scope flow starts to its rank's Proton scopes

    def sniff(self, head: Head) -> int:
        data = head.data
        if b'"viztracer_metadata"' in head.ends:  # written after the events: in the tail of a big report
            return 95
        if head.source.name.endswith((".viztracer.json", ".viztracer.json.gz")):
            return 90
        if _SHAPE.match(data) and _FEE.search(data):  # its metadata comes after file_info: past the tail
            return 70
        return 0

    def hints(self, head: Head) -> Hints:
        return chrome_hints(head, pid_in_head=True, first_ts=True)

    def read(self, data: bytes, ctx: ReadContext) -> ReadResult:
        return chrome_json.read_anchored(
            data, ctx, _viztracer_anchor, "no viztracer_metadata.baseTimeNanoseconds (VizTracer CLI?)"
        )


def _viztracer_anchor(doc: chrome_json.Document) -> tuple[int | float, str] | None:
    meta = doc.viztracer_metadata
    if meta is UNSET or meta.baseTimeNanoseconds is UNSET:
        return None
    return meta.baseTimeNanoseconds, "viztracer_metadata.baseTimeNanoseconds"
