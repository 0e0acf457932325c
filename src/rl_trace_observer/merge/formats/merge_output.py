"""What ``rl-trace merge`` itself writes (merged traces, manifests, span shards): recognised only so
that merging a directory twice never merges a merged trace into itself. Never read, never merged."""

from __future__ import annotations

from ..files.sources import Head
from .base import Format

MANIFEST_SCHEMA_PREFIX = "rl-trace-merge-manifest/"


class MergeOutput(Format):
    """A merged trace, manifest or span shard written by ``rl-trace merge``: ignored, never merged again."""

    kind = "merge_output"
    label = "Merged"
    order = 9
    events, ignored = False, True

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
