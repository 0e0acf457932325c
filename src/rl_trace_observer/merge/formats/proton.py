"""Triton Proton ``chrome_trace`` files, as TokenSpeed writes them per scheduler rank.

Names: ``{profile_id}-[DPd-][CPc-]TPt[-STAGE].proton[.part_N].chrome_trace`` (``.part_N`` from
Proton's periodic flushing). Proton puts everything in ONE synthetic process, pid 0 ("Trace"), with
CPU lanes, graph lanes (100000 + stream) and GPU lanes (200000 + stream), and restarts its
``launch->kernel`` flow ids in every process, so several ranks always collide unless namespaced.
Upstream Proton writes no anchor (``ts`` relative to its first event); TokenSpeed's build adds a
top-level ``baseTimeNanoseconds``. Without one a file is ``unanchored``: never placed at time zero.
"""

from __future__ import annotations

import re
from typing import Any

from ..files.sources import Head
from . import chrome_json
from .base import ReadContext, ReadResult, SourcePid

NAME = re.compile(
    r"^(?P<profile>.+?)-(?:DP(?P<dp>\d+)-)?(?:CP(?P<cp>\d+)-)?TP(?P<tp>\d+)(?:-(?P<stage>[A-Z]+))?"
    r"\.(?P<what>proton|viztracer|trace)(?:\.part_(?P<part>\d+))?\.(?:chrome_trace|json(?:\.gz)?)$"
)


class ProtonReader:
    kind = "proton"
    label = "Proton"
    order = 4

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


class ChromeJsonReader(chrome_json.ThreadLanes):
    """Any other Chrome-trace JSON: merged only when its process record supplies an anchor."""

    kind = "chrome_json"
    label = "Trace"
    order = 5

    def sniff(self, head: Head) -> int:
        data = head.data.lstrip()
        if data.startswith(b"{") and b'"traceEvents"' in data and b'"rl_trace_observer"' not in data[:200]:
            return 10
        return 0

    def read(self, data: bytes, ctx: ReadContext) -> ReadResult:
        return chrome_json.read_anchored(
            data, ctx, chrome_json.top_level_anchor, "Chrome trace of unknown origin with no anchor"
        )
