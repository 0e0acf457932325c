"""What a file's name and first bytes say about it, before it is read: pid, host, rank, step, time.

These are hints for linking and planning only; the events themselves are always read from the
content. Names follow the writers' documented patterns (REFERENCE §2-3):

- our event logs: ``rl-insight-<host>-pid-<pid>.chrome.jsonl``;
- VERL torch traces: ``{prefix}_{role}_step{N}_rank{R}[-of-{W}][...]_pid{PID}_{stamp}[...].json.gz``;
- TokenSpeed: ``{profile_id}-[DPd-][CPc-]TPt[-STAGE].`` + ``trace.json.gz``, ``viztracer.json`` or
  ``proton[.part_N].chrome_trace``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..files.sources import Head
from ..formats.kineto import ABSOLUTE_US
from ..formats.proton import NAME as TOKENSPEED_NAME

_EVENT_LOG = re.compile(r"^rl-insight-(?P<host>.+)-pid-(?P<pid>\d+)\.chrome\.jsonl$")
_VERL_TORCH = re.compile(
    r"_(?P<role>[A-Za-z][A-Za-z0-9]*)_step(?P<step>\d+)_rank(?P<rank>\d+)"
    r"(?:-of-(?P<world>\d+))?.*?_pid(?P<pid>\d+)_"
)
_HOST_NAME = re.compile(rb'"host_name"\s*:\s*"([^"]{1,255})"')
_BASE_NS = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d{1,20})')
_PID = re.compile(rb'"pid"\s*:\s*(\d{1,10})\b')
_TS = re.compile(rb'"ts"\s*:\s*(-?\d+(?:\.\d+)?)')
_TS_NS = re.compile(rb'"ts_ns"\s*:\s*(\d{1,20})')
_RANK = re.compile(rb'"distributedInfo"\s*:\s*\{[^}]*"rank"\s*:\s*(\d+)')


@dataclass
class Hints:
    pid: int | None = None
    host: str | None = None
    rank: int | None = None
    role: str | None = None
    step: int | None = None
    start_ns: int | None = None  # a time at or near the file's earliest event (planning the base)
    group: str | None = None  # TokenSpeed rank group: VizTracer and Proton of one scheduler
    tp: int | None = None


def _int(m: re.Match[bytes] | None) -> int | None:
    return int(m.group(1)) if m else None


def _start_ns(kind: str, data: bytes, ends: bytes) -> int | None:
    """About the file's first event: its anchor plus the first ``ts``, or the first ``ts`` itself in a
    file of absolute epoch µs (torch < 2.4). Only a hint: files are not sorted, the merge checks."""
    base = _int(_BASE_NS.search(ends))
    ts = _TS.search(data)
    first_us = float(ts.group(1)) if ts else None
    if base is not None:
        return base + (int(first_us * 1000) if first_us is not None and kind != "proton" else 0)
    if kind == "torch" and first_us is not None and first_us >= ABSOLUTE_US:
        return int(first_us * 1000)
    return None


def hints_for(kind: str, head: Head) -> Hints:
    name, data, ends = head.source.name, head.data, head.ends
    h = Hints()
    if kind == "rl_insight":
        m = _EVENT_LOG.match(name)
        if m:
            h.host, h.pid = m.group("host"), int(m.group("pid"))
        h.start_ns = _int(_TS_NS.search(data))
        return h
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
        h.rank = _int(_RANK.search(ends))
    if h.pid is None and kind in ("torch", "viztracer"):
        h.pid = _int(_PID.search(data))
    h.start_ns = _start_ns(kind, data, ends)
    ts_name = TOKENSPEED_NAME.match(name)
    if ts_name:
        parts = [ts_name.group("profile")]
        parts += [f"{k.upper()}{ts_name.group(k)}" for k in ("dp", "cp", "tp") if ts_name.group(k)]
        h.group = "-".join(parts)
        h.tp = int(ts_name.group("tp"))
        if ts_name.group("what") == "proton":
            h.pid = None  # Proton's pid 0 is not an OS pid
    return h
