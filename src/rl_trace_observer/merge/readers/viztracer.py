"""VizTracer reports saved by its Python API (``VizTracer.save()``), TokenSpeed's included.

The anchor is ``viztracer_metadata.baseTimeNanoseconds`` (wall clock minus the monotonic clock, so
``ts`` are monotonic µs); it is written after the events, so sniffing cannot rely on it. The
VizTracer CLI (1.1.1) writes no anchor: such a file is ``unanchored`` unless its process record
supplies one.
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from ..model import Problem
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
        dec = chrome_json.decode(data, ctx.path)
        doc = dec.doc
        res = ReadResult(problems=dec.problems, dropped=dec.dropped, complete=dec.complete)
        res.read = len(doc.traceEvents) + dec.dropped
        meta = doc.viztracer_metadata
        if meta is not UNSET and meta.baseTimeNanoseconds is not UNSET:
            res.anchor_ns = int(meta.baseTimeNanoseconds)
            res.anchor_source = "viztracer_metadata.baseTimeNanoseconds"
        elif ctx.anchor_ns is not None:
            res.anchor_ns, res.anchor_source = ctx.anchor_ns, "process record"
        else:
            res.skip = True
            res.problems.append(
                Problem("unanchored", ctx.path, "no viztracer_metadata.baseTimeNanoseconds (VizTracer CLI?)")
            )
            return res
        chrome_json.finish(doc.traceEvents, res.anchor_ns, res, ctx.defer_times)
        return res

    def process_of(self, pid: SourcePid, result: ReadResult, ctx: ReadContext) -> SourcePid:
        return pid

    def lane_of(self, pid: SourcePid, tid: Any, result: ReadResult) -> str:
        return (result.thread_names.get((pid, tid)) or f"thread {tid}").strip()
