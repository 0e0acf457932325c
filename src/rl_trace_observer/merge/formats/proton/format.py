"""Triton Proton ``chrome_trace`` files, as TokenSpeed writes them per scheduler rank.

Names: ``{profile_id}-[DPd-][CPc-]TPt[-STAGE].proton[.part_N].chrome_trace`` (``.part_N`` from
Proton's periodic flushing; :data:`..chrome_hints.TOKENSPEED_NAME`). Proton puts everything in ONE
synthetic process, pid 0 ("Trace"), with CPU lanes, graph lanes (100000 + stream) and GPU lanes
(200000 + stream), and restarts its
``launch->kernel`` flow ids in every process, so several ranks always collide unless namespaced.
Upstream Proton writes no anchor (``ts`` relative to its first event); TokenSpeed's build adds a
top-level ``baseTimeNanoseconds``. Without one a file is ``unanchored``: never placed at time zero.
"""

from __future__ import annotations

from typing import Any

from ...files.sources import Head
from ..base import KERNELS, Format, Hints, InTokenSpeedRank, ReadContext, ReadResult, SourcePid, chrome_json
from ..base.chrome_hints import chrome_hints


class Proton(Format, InTokenSpeedRank):
    kind = "proton"
    label = "Proton"
    order = 4
    rank_role = KERNELS  # merged in one job with its rank's VizTracer report, aligned on it (.pairing)

    def sniff(self, head: Head) -> int:
        name = head.source.name
        if ".proton" in name and name.endswith(".chrome_trace"):
            return 95
        data = head.data
        if b'"launch->kernel"' in data or (b'"CPU Thread ' in data and b'"name":"Trace"' in data):
            return 80
        if name.endswith(".chrome_trace") and b'"traceEvents"' in data:
            return 60
        return 0

    def hints(self, head: Head) -> Hints:
        # no OS pid in the file (pid 0 is Proton's own process: its rank's report lends one), and ts
        # counts from Proton's first event, not from the anchor
        return chrome_hints(head, pid_in_head=False, first_ts=False)

    def read(self, data: bytes, ctx: ReadContext) -> ReadResult:
        return chrome_json.read_anchored(
            data,
            ctx,
            chrome_json.top_level_anchor,
            "Proton trace without baseTimeNanoseconds (upstream Proton: ts relative to its first "
            "event); not placed at time zero — use TokenSpeed's Proton or register an anchor_ns",
        )

    def process_of(self, pid: SourcePid, result: ReadResult, ctx: ReadContext) -> SourcePid:
        return "Proton" if pid in (0, "0") else f"Proton {pid}"

    def lane_of(self, pid: SourcePid, tid: Any, result: ReadResult) -> str:
        return (result.thread_names.get((pid, tid)) or f"lane {tid}").strip()
