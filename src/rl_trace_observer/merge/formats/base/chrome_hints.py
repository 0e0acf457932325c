"""What a Chrome-trace file's name and first bytes say before it is read: pid, host, rank, step, time.

Shared by the Chrome-shaped formats (Kineto, VizTracer, Proton, any other Chrome trace), each saying
which parts apply to it (:func:`chrome_hints`' flags). These are hints for linking and planning only;
the events themselves are always read from the content. Names follow the writers' documented patterns
(REFERENCE §2-3):

- VERL torch traces: ``{prefix}_{role}_step{N}_rank{R}[-of-{W}][...]_pid{PID}_{stamp}[...].json.gz``;
- TokenSpeed: ``{profile_id}-[DPd-][CPc-]TPt[-STAGE].`` + ``trace.json.gz``, ``viztracer.json`` or
  ``proton[.part_N].chrome_trace`` (Proton's periodic flushing adds ``.part_N``).
"""

from __future__ import annotations

import re

from ...files.sources import Head
from . import Hints

ABSOLUTE_US = 1e14  # µs after 1973: a ts this large without an anchor is absolute epoch µs (torch < 2.4)
TOKENSPEED_NAME = re.compile(
    r"^(?P<profile>.+?)-(?:DP(?P<dp>\d+)-)?(?:CP(?P<cp>\d+)-)?TP(?P<tp>\d+)(?:-(?P<stage>[A-Z]+))?"
    r"\.(?P<what>proton|viztracer|trace)(?:\.part_(?P<part>\d+))?\.(?:chrome_trace|json(?:\.gz)?)$"
)
_VERL_TORCH = re.compile(
    r"_(?P<role>[A-Za-z][A-Za-z0-9]*)_step(?P<step>\d+)_rank(?P<rank>\d+)"
    r"(?:-of-(?P<world>\d+))?.*?_pid(?P<pid>\d+)_"
)
_HOST_NAME = re.compile(rb'"host_name"\s*:\s*"([^"]{1,255})"')
_BASE_NS = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d{1,20})')
_PID = re.compile(rb'"pid"\s*:\s*(\d{1,10})\b')
_TS = re.compile(rb'"ts"\s*:\s*(-?\d+(?:\.\d+)?)')
_RANK = re.compile(rb'"distributedInfo"\s*:\s*\{[^}]*"rank"\s*:\s*(\d+)')


def first_int(m: re.Match[bytes] | None) -> int | None:
    return int(m.group(1)) if m else None


def _start_ns(data: bytes, ends: bytes, first_ts: bool, absolute_us: bool) -> int | None:
    """About the file's first event: its anchor plus the first ``ts`` (``first_ts``), or the first
    ``ts`` itself in a file of absolute epoch µs (``absolute_us``: torch < 2.4). Only a hint: files are
    not sorted, the merge checks."""
    base = first_int(_BASE_NS.search(ends))
    ts = _TS.search(data)
    first_us = float(ts.group(1)) if ts else None
    if base is not None:
        return base + (int(first_us * 1000) if first_us is not None and first_ts else 0)
    if absolute_us and first_us is not None and first_us >= ABSOLUTE_US:
        return int(first_us * 1000)
    return None


def chrome_hints(head: Head, *, pid_in_head: bool, first_ts: bool, absolute_us: bool = False) -> Hints:
    """The hints of a Chrome-trace file. ``pid_in_head``: its first ``pid`` is the OS process's;
    ``first_ts``: its ``ts`` count from its anchor (else only the anchor is a start time)."""
    name, data, ends = head.source.name, head.data, head.ends
    h = Hints()
    m = _VERL_TORCH.search(name)
    if m:
        h.role, h.step, h.rank, h.pid = (
            m.group("role"),
            int(m.group("step")),
            int(m.group("rank")),
            int(m.group("pid")),
        )
    host = _HOST_NAME.search(ends)
    if host:
        h.host = host.group(1).decode("utf-8", "replace")
    if h.rank is None:
        h.rank = first_int(_RANK.search(ends))
    if h.pid is None and pid_in_head:
        h.pid = first_int(_PID.search(data))
    h.start_ns = _start_ns(data, ends, first_ts, absolute_us)
    ts_name = TOKENSPEED_NAME.match(name)
    if ts_name:
        parts = [ts_name.group("profile")]
        parts += [f"{k.upper()}{ts_name.group(k)}" for k in ("dp", "cp", "tp") if ts_name.group(k)]
        h.group = "-".join(parts)
        h.tp = int(ts_name.group("tp"))
        if ts_name.group("what") == "proton":
            h.pid = None  # Proton's pid 0 is not an OS pid
    return h
