"""Process records (docs/FORMATS.md §2) and files the merger must recognise only to leave alone.

Process records carry identity (host, pid, role, rank, Ray actor), the artifacts the process
registered and its clock snapshots; they hold no events. A merge's own outputs and manifests are
recognised so that merging a directory twice never merges a merged trace into itself.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..files.sources import Head
from ..timeline.model import Problem
from .base import ReadContext, ReadResult, SourcePid

RECORD_SCHEMA_PREFIX = "rl-trace-process/"
MANIFEST_SCHEMA_PREFIX = "rl-trace-merge-manifest/"


class ProcessRecordReader:
    kind = "process_record"
    label = "Process"
    order = 0

    def sniff(self, head: Head) -> int:
        # Records are written with sorted keys: "schema" comes after the clock data, which grows
        # with every measurement and snapshot (tens of KB in a long run), so look at the whole head,
        # and past it trust the name the capture layer gives records (``read`` validates anyway).
        if b'"schema": "rl-trace-process/' in head.data:
            return 100
        name = head.source.name
        if name.startswith("rl-trace-process-") and name.endswith(".json") and head.data.lstrip()[:1] == b"{":
            return 90
        return 0

    def read(self, data: bytes, ctx: ReadContext) -> ReadResult:
        res = ReadResult()
        try:
            record = msgspec.json.decode(data)
        except msgspec.DecodeError as exc:
            res.skip, res.complete = True, False
            res.problems.append(Problem("incomplete", ctx.path, f"process record is not valid JSON ({exc})"))
            return res
        if not isinstance(record, dict) or not _valid(record):
            res.skip = True
            res.problems.append(Problem("not_a_trace", ctx.path, "process record without hostname/pid"))
            return res
        res.meta["record"] = record
        return res

    def process_of(self, pid: SourcePid, result: ReadResult, ctx: ReadContext) -> SourcePid:
        return pid

    def lane_of(self, pid: SourcePid, tid: Any, result: ReadResult) -> str:
        return str(tid)


def _valid(record: dict[str, Any]) -> bool:
    return (
        str(record.get("schema", "")).startswith(RECORD_SCHEMA_PREFIX)
        and isinstance(record.get("hostname"), str)
        and isinstance(record.get("pid"), int)
        and not isinstance(record.get("pid"), bool)
    )


class OwnOutputReader:
    """A merged trace, manifest or span shard written by ``rl-trace merge``: ignored, never merged again."""

    kind = "merge_output"
    label = "Merged"
    order = 9

    def sniff(self, head: Head) -> int:
        start = head.data[:512]
        if b'"rl_trace_observer"' in start or MANIFEST_SCHEMA_PREFIX.encode() in head.data:
            return 100
        if b'"rl-trace-spans/' in head.data or (
            start[:4] == b"PAR1" and head.source.name.startswith("part-")
        ):
            return 100  # span shards (`merge --shards`) written inside an input directory
        if head.source.name.endswith(".manifest.json") and b'"artifacts"' in start:
            return 100  # a long manifest: its keys are sorted, "schema" comes late
        return 0

    def read(self, data: bytes, ctx: ReadContext) -> ReadResult:
        return ReadResult(skip=True)

    def process_of(self, pid: SourcePid, result: ReadResult, ctx: ReadContext) -> SourcePid:
        return pid

    def lane_of(self, pid: SourcePid, tid: Any, result: ReadResult) -> str:
        return str(tid)
