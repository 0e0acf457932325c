"""Our own RL-Insight event logs (docs/FORMATS.md §1): JSONL with exact ``ts_ns``/``dur_ns``.

``tid`` is a per-process lane number, named by the lane's ``thread_name`` line; counters carry
Prometheus-style ``labels``, and each label set is its own series, so it becomes part of the counter
track's name. A last line without its newline was cut by a kill: it is dropped and the file is
reported incomplete; a bad line elsewhere is dropped and counted. Rollout servers' request spans
also give their engine phases and a "requests in flight" counter (:mod:`.requests`).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from msgspec import UNSET, Raw, UnsetType

from ...files.sources import Head, Source
from ...timeline.model import BAD_JSON, Event, Problem
from ...timeline.steps import Marker
from ...timeline.times import EARLIEST_NS, KNOWN_PHASES, MAX_TS_NS
from ..base import STAGES, ClockEvidence, Format, Hints, MarksSteps, ReadContext, ReadResult, SourcePid
from ..base.chrome_hints import first_int
from ..base.chrome_json import gc_paused
from .markers import read_markers
from .requests import request_events

LANE_PREFIX = "RL-Insight · "
_EVENT_LOG = re.compile(r"^rl-insight-(?P<host>.+)-pid-(?P<pid>\d+)\.chrome\.jsonl$")
_TS_NS = re.compile(rb'"ts_ns"\s*:\s*(\d{1,20})(?![\d.eE])')  # a whole integer (not 1 of 1e300)


class LogEvent(Event, omit_defaults=True, gc=False):
    # any text (not Event's Literal): an unknown phase is dropped and counted when normalising, as it
    # always was, rather than making the whole line invalid
    ph: str = ""  # type: ignore[assignment]
    ts_ns: int | UnsetType = UNSET
    dur_ns: int | UnsetType = UNSET
    labels: Raw | UnsetType = UNSET  # must be an object (see _labels_ok); decoded once per series


_LINE = msgspec.json.Decoder(LogEvent)
_BLANK_LINE_START = re.compile(rb"\n[\n \t\r]")  # a line that could hold no value


def _whole_lines(data: bytes, end: int) -> list[LogEvent] | None:
    """Every line before ``end`` in one call (~3× faster than a call per line), or None unless each
    line held exactly one valid event (``decode_lines`` would also accept two values on one line)."""
    if data[:1] != b"{" or _BLANK_LINE_START.search(data, 0, end):
        return None  # every line starts with "{" below, so holds at least one value
    try:
        events = _LINE.decode_lines(memoryview(data)[:end])
    except BAD_JSON:
        return None
    return events if len(events) == data.count(b"\n", 0, end) else None


def _labels_ok(e: LogEvent) -> bool:
    """``labels`` is a JSON object: what a ``dict`` field would have required to decode the line."""
    return bytes(e.labels)[:1] == b"{"  # type: ignore[arg-type]


def _series_name(name: Any, labels: Raw) -> Any:
    """``name{k=v,...}``, labels sorted: each label set is its own counter series."""
    values = msgspec.json.decode(labels)
    if not values:
        return name
    return f"{name}{{{','.join(f'{k}={v}' for k, v in sorted(values.items()))}}}"


WHY_LINE = "lines that are not one valid event (bad JSON, or a field of the wrong type)"
WHY_DEEP_LINE = "lines nested deeper than the decoder's limit (~1,000 levels)"


def _line_by_line(data: bytes, end: int, why: dict[str, int]) -> tuple[list[LogEvent], int]:
    events: list[LogEvent] = []
    bad = 0
    for line in data[:end].split(b"\n"):
        if not line.strip():
            continue
        try:
            events.append(_LINE.decode(line))
        except RecursionError:
            why[WHY_DEEP_LINE] = why.get(WHY_DEEP_LINE, 0) + 1
            bad += 1
        except msgspec.DecodeError:
            why[WHY_LINE] = why.get(WHY_LINE, 0) + 1
            bad += 1
    return events, bad


class RLInsight(Format, MarksSteps, ClockEvidence):
    kind = "rl_insight"
    label = "RL-Insight"
    order = 1
    probe_cat = None  # every complete span (stages: a handful per step and process) for the clock checks
    causality = STAGES  # the spans its process's Torch regions must sit inside
    counts = (("run_flow_endpoints", False),)  # rollout requests: a client and a server end each
    markers_rank = 0  # its global_step/train_batch spans give the run's steps (.markers)

    def sniff(self, head: Head) -> int:
        first = head.data.split(b"\n", 1)[0]
        if not first.startswith(b"{"):
            return 0
        if b'"ts_ns"' in head.data or (b'"lane"' in first and b'"thread_name"' in first):
            return 95
        if head.source.name.endswith(".chrome.jsonl"):
            return 80
        return 0

    def hints(self, head: Head) -> Hints:
        """``rl-insight-<host>-pid-<pid>.chrome.jsonl``, and the first event's exact time."""
        h = Hints()
        m = _EVENT_LOG.match(head.source.name)
        if m:
            h.host, h.pid = m.group("host"), int(m.group("pid"))
        h.start_ns = first_int(_TS_NS.search(head.data))
        return h

    def step_markers(self, src: Source) -> tuple[Marker, ...]:
        """Its ``global_step``/``train_batch`` spans (:mod:`.markers`): the run's step windows."""
        return read_markers(src)

    def read(self, data: bytes, ctx: ReadContext) -> ReadResult:
        res = ReadResult(anchor_ns=0, anchor_source="ts_ns (epoch ns)")
        end = data.rfind(b"\n") + 1  # the lines before a cut last line
        tail = data[end:]
        bad = 0
        with gc_paused():
            events = _whole_lines(data, end)
            if events is None:  # a bad line somewhere: line by line, to drop only the bad ones
                events, bad = _line_by_line(data, end, res.dropped_why)
            if tail.strip():
                try:
                    last = _LINE.decode(tail)
                    if last.labels is not UNSET and not _labels_ok(last):
                        raise msgspec.DecodeError("labels is not an object")
                    events.append(last)
                except BAD_JSON:
                    res.complete = False
                    res.problems.append(Problem("incomplete", ctx.path, "last line is cut (process killed?)"))
        res.events, invalid = self._normalise(events, res)
        res.events.extend(request_events(res.events))  # engine phases, in-flight counters (rollout)
        bad += invalid
        if invalid:
            res.dropped_why[WHY_LINE] = res.dropped_why.get(WHY_LINE, 0) + invalid
        res.read = len(events) - invalid + bad  # a cut last line is a fragment, not an event
        res.dropped += bad  # named on the file's one dropped_events line, with the merge's other reasons
        return res

    def _normalise(self, events: list[LogEvent], res: ReadResult) -> tuple[list[Event], int]:
        """The events on the ns timeline, and how many lines were invalid (``labels`` not an object:
        lines that a ``dict`` ``labels`` field would have refused to decode)."""
        out: list[Event] = []
        append, unset, top, known = out.append, UNSET, MAX_TS_NS, KNOWN_PHASES
        earliest = EARLIEST_NS
        series: dict[tuple[Any, bytes], Any] = {}  # (name, labels JSON) -> counter track name
        dropped = invalid = 0
        for e in events:
            labels = e.labels
            if labels is not unset:
                raw = bytes(labels)
                if raw[:1] != b"{":  # not an object: what a ``dict`` field would have refused
                    invalid += 1
                    continue
            ph = e.ph
            if ph == "M":
                res.metadata += 1
                self._metadata(e, res)
                continue
            try:
                ts: Any = e.ts_ns
                if ts is unset:
                    ts = round(e.ts * 1000)  # type: ignore[operator]
                if not earliest <= ts < top or ph not in known:
                    raise ValueError
                dur: Any = e.dur_ns
                if dur is unset:
                    dur = e.dur
                    if dur is not unset:
                        dur = round(dur * 1000)
                if dur is not unset and not 0 <= dur < top:
                    raise ValueError
            except (ValueError, TypeError, OverflowError):
                dropped += 1
                continue
            e.ts, e.dur = ts, dur
            if labels is not unset:
                if ph == "C":
                    key = (e.name, raw)
                    name = series.get(key)
                    if name is None:
                        name = series[key] = _series_name(e.name, labels)
                    e.name = name
                e.labels = unset
            e.ts_ns = e.dur_ns = unset
            append(e)
        res.dropped += dropped
        return out, invalid

    @staticmethod
    def _metadata(e: LogEvent, res: ReadResult) -> None:
        if e.name != "thread_name" or e.args is UNSET:
            return
        try:
            args = msgspec.json.decode(e.args)
        except BAD_JSON:
            return
        if isinstance(args, dict):
            lane = args.get("lane") or str(args.get("name", "")).removeprefix(LANE_PREFIX)
            res.thread_names[(e.pid if e.pid is not UNSET else 0, e.tid)] = str(lane)

    def lane_of(self, pid: SourcePid, tid: Any, result: ReadResult) -> str:
        return result.thread_names.get((pid, tid)) or ("metrics" if tid == 0 else f"lane {tid}")
