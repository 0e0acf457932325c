"""Any other Chrome-trace JSON (the format of last resort among the Chrome-shaped ones).

Merged only when it places itself (a top-level ``baseTimeNanoseconds``) or its process record
supplies an anchor; OS pids as they are, threads named by the file.
"""

from __future__ import annotations

from ..files.sources import Head
from .base import Format, Hints, ReadContext, ReadResult, chrome_json
from .base.chrome_hints import chrome_hints


class ChromeTrace(Format):
    kind = "chrome_json"
    label = "Trace"
    order = 5

    def sniff(self, head: Head) -> int:
        data = head.data.lstrip()
        if data.startswith(b"{") and b'"traceEvents"' in data and b'"rl_trace_observer"' not in data[:200]:
            return 10
        return 0

    def hints(self, head: Head) -> Hints:
        return chrome_hints(head, pid_in_head=False, first_ts=True)

    def read(self, data: bytes, ctx: ReadContext) -> ReadResult:
        return chrome_json.read_anchored(
            data,
            ctx,
            chrome_json.top_level_anchor,
            "Chrome trace of unknown origin with no anchor: not placed (give it a top-level "
            "baseTimeNanoseconds, or register its anchor_ns in a process record)",
        )
