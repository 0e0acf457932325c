"""VizTracer reports saved by its Python API (``VizTracer.save()``), TokenSpeed's included.

The anchor is ``viztracer_metadata.baseTimeNanoseconds`` (wall clock minus the monotonic clock, so
``ts`` are monotonic µs); it is written after the events, so sniffing cannot rely on it. The
VizTracer CLI (1.1.1) writes no anchor: such a file is ``unanchored`` unless its process record
supplies one.
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from ..sources import Head
from . import chrome_json
from .base import ReadContext, ReadResult, SourcePid


class VizTracerReader:
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
        doc, res = chrome_json.start(data, ctx.path)
        meta = doc.viztracer_metadata
        declared = None
        if meta is not UNSET and meta.baseTimeNanoseconds is not UNSET:
            declared = (meta.baseTimeNanoseconds, "viztracer_metadata.baseTimeNanoseconds")
        anchor = chrome_json.anchor_or_skip(
            res,
            declared,
            ctx.anchor_ns,
            ctx.path,
            "no viztracer_metadata.baseTimeNanoseconds (VizTracer CLI?)",
        )
        if anchor is None:
            return res
        chrome_json.finish(doc.traceEvents, anchor, res, ctx.defer_times)
        return res

    def process_of(self, pid: SourcePid, result: ReadResult, ctx: ReadContext) -> SourcePid:
        return pid

    def lane_of(self, pid: SourcePid, tid: Any, result: ReadResult) -> str:
        return (result.thread_names.get((pid, tid)) or f"thread {tid}").strip()
