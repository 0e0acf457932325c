"""Our own RL-Insight event logs (docs/FORMATS.md §1): JSONL with exact ``ts_ns``/``dur_ns``.

``tid`` is a per-process lane number, named by the lane's ``thread_name`` line; counters carry
Prometheus-style ``labels``, and each label set is its own series, so it becomes part of the counter
track's name. A last line without its newline was cut by a kill: it is dropped and the file is
reported incomplete; a bad line elsewhere is dropped and counted.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from ..model import Event, Problem
from ..sources import Head
from .base import ReadContext, ReadResult, SourcePid
from .chrome_json import KNOWN_PHASES, MAX_TS_NS, gc_paused

LANE_PREFIX = "RL-Insight · "


class LogEvent(Event, omit_defaults=True, gc=False):
    ts_ns: int | UnsetType = UNSET
    dur_ns: int | UnsetType = UNSET
    labels: dict[str, Any] | UnsetType = UNSET


_LINE = msgspec.json.Decoder(LogEvent)


class RLInsightReader:
    kind = "rl_insight"
    label = "RL-Insight"
    order = 1

    def sniff(self, head: Head) -> int:
        first = head.data.split(b"\n", 1)[0]
        if not first.startswith(b"{"):
            return 0
        if b'"ts_ns"' in head.data or (b'"lane"' in first and b'"thread_name"' in first):
            return 95
        if head.source.name.endswith(".chrome.jsonl"):
            return 80
        return 0

    def read(self, data: bytes, ctx: ReadContext) -> ReadResult:
        res = ReadResult(anchor_ns=0, anchor_source="ts_ns (epoch ns)")
        lines = data.split(b"\n")
        tail = lines.pop()  # b"" when the file ends with a newline
        events: list[LogEvent] = []
        bad = 0
        with gc_paused():
            for line in lines:
                if not line.strip():
                    continue
                try:
                    events.append(_LINE.decode(line))
                except msgspec.DecodeError:
                    bad += 1
            if tail.strip():
                try:
                    events.append(_LINE.decode(tail))
                except msgspec.DecodeError:
                    res.complete = False
                    res.problems.append(Problem("incomplete", ctx.path, "last line is cut (process killed?)"))
        res.read = len(events) + bad  # a cut last line is a fragment, not an event
        res.dropped = bad
        res.events = self._normalise(events, res)
        if bad:
            res.problems.append(Problem("dropped_events", ctx.path, f"{bad} lines are not valid events"))
        return res

    def _normalise(self, events: list[LogEvent], res: ReadResult) -> list[Event]:
        out: list[Event] = []
        for e in events:
            if e.ph == "M":
                res.metadata += 1
                self._metadata(e, res)
                continue
            try:
                ts = e.ts_ns if e.ts_ns is not UNSET else round(e.ts * 1000)  # type: ignore[operator]
                if not 0 <= ts < MAX_TS_NS or e.ph not in KNOWN_PHASES:
                    raise ValueError
                dur: Any = e.dur_ns if e.dur_ns is not UNSET else e.dur
                if dur is not UNSET:
                    dur = dur if e.dur_ns is not UNSET else round(dur * 1000)
                    if not 0 <= dur < MAX_TS_NS:
                        raise ValueError
            except (ValueError, TypeError, OverflowError):
                res.dropped += 1
                continue
            e.ts, e.dur = ts, dur
            if e.ph == "C" and e.labels:
                e.name = f"{e.name}{{{','.join(f'{k}={v}' for k, v in sorted(e.labels.items()))}}}"
            e.ts_ns = e.dur_ns = e.labels = UNSET
            out.append(e)
        return out

    @staticmethod
    def _metadata(e: LogEvent, res: ReadResult) -> None:
        if e.name != "thread_name" or e.args is UNSET:
            return
        try:
            args = msgspec.json.decode(e.args)
        except msgspec.DecodeError:
            return
        if isinstance(args, dict):
            lane = args.get("lane") or str(args.get("name", "")).removeprefix(LANE_PREFIX)
            res.thread_names[(e.pid if e.pid is not UNSET else 0, e.tid)] = str(lane)

    def process_of(self, pid: SourcePid, result: ReadResult, ctx: ReadContext) -> SourcePid:
        return pid

    def lane_of(self, pid: SourcePid, tid: Any, result: ReadResult) -> str:
        return result.thread_names.get((pid, tid)) or ("metrics" if tid == 0 else f"lane {tid}")
