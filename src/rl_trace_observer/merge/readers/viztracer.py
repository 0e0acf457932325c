"""VizTracer reports saved by its Python API (``VizTracer.save()``), TokenSpeed's included.

The anchor is ``viztracer_metadata.baseTimeNanoseconds`` (wall clock minus the monotonic clock, so
``ts`` are monotonic µs); it is written after the events, so sniffing cannot rely on it. The
VizTracer CLI (1.1.1) writes no anchor: such a file is ``unanchored`` unless its process record
supplies one.
"""

from __future__ import annotations

from msgspec import UNSET

from ..sources import Head
from . import chrome_json
from .base import ReadContext, ReadResult


class VizTracerReader(chrome_json.ThreadLanes):
    kind = "viztracer"
    label = "VizTracer"
    order = 3

    def sniff(self, head: Head) -> int:
        data = head.data
        if b'"viztracer_metadata"' in data:
            return 95
        if head.source.name.endswith((".viztracer.json", ".viztracer.json.gz")):
            return 90
        if data.startswith(b'{"traceEvents":[{"ph":"M","pid":') and b'"cat":"FEE"' in data:
            return 70
        return 0

    def read(self, data: bytes, ctx: ReadContext) -> ReadResult:
        return chrome_json.read_anchored(
            data, ctx, _viztracer_anchor, "no viztracer_metadata.baseTimeNanoseconds (VizTracer CLI?)"
        )


def _viztracer_anchor(doc: chrome_json.Document) -> tuple[int | float, str] | None:
    meta = doc.viztracer_metadata
    if meta is UNSET or meta.baseTimeNanoseconds is UNSET:
        return None
    return meta.baseTimeNanoseconds, "viztracer_metadata.baseTimeNanoseconds"
