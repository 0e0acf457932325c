"""OpenTelemetry (OTLP) trace files: spans from any SDK or Collector, NeMo-RL's nemo-lens spans among
them (docs/FORMATS.md, "OTLP spans"): protobuf (:mod:`.protobuf`), OTLP/JSON (:mod:`.otlp_json`), and the
Python SDK's console JSON (:mod:`.console`).

Each resource (one process: ``service.name``, ``process.pid``, ``host.name``, NeMo-RL's
``rl.worker_group`` and ``dl.rank``) becomes a process; its spans become slices in absolute unix ns
(the SDK reads its host's wall clock, so the file is corrected like any other wall-clock source).
A span nests under its parent when the parent is in the same process: local root spans are packed
onto the fewest lanes (``spans 1``, ``spans 2``, ...) with their whole subtree. An edge to another
process — a parent there, or a span link — is a flow: run-scoped ids (``rl-trace:otlp:<trace>:<span>``)
join the two ends across files, as a rollout request's client and server spans are joined. Perfetto
gives a slice one flow id, so a span with an incoming edge ends that flow and starts none of its own;
its other links stay in its args (``otlp.links``). Attributes are kept as the slice's args, as they
are (``rl.bucket``, ``gen_ai.*``, ``rl.iteration``); span events become instants on the span's lane.
"""

from __future__ import annotations

import gzip
import heapq
import re
from collections import defaultdict
from typing import Any

import msgspec
import orjson

from ...files.sources import Head, Source
from ...timeline.model import Event, Problem
from ...timeline.steps import Marker, marker
from ...timeline.times import EARLIEST_NS, MAX_TS_NS
from ..base import MANIFEST_ENTRY, Format, Hints, MarksSteps, ReadContext, ReadResult, SourcePid
from ..base.chrome_json import gc_paused
from . import console, otlp_json, protobuf
from .model import STATUS, Decoded, Span, kind_name

CAT = "otlp"
EVENT_CAT = "otlp.event"
FLOW_PREFIX = "rl-trace:otlp:"
# which resource attribute names a process's role / rank, first present wins
ROLE_KEYS = ("rl.role", "rl.worker_group", "service.name")
RANK_KEYS = ("dl.rank", "rl.rank", "rank")
WHY_TIME = "spans whose start or end is not a plausible unix-ns time (or ends before it starts)"
_NAMES = (".binpb", ".otlp.pb", ".otlp.json", ".otlp.jsonl", ".otlp")
_JSON_KEY = re.compile(
    rb'"key"\s*:\s*"([^"]{1,200})"\s*,\s*"value"\s*:\s*\{\s*"(?:stringValue|intValue)"\s*:\s*"?([^",}]{0,300})'
)
_JSON_START = re.compile(rb'"startTimeUnixNano"\s*:\s*"?(\d{1,20})')


def decode(data: bytes) -> tuple[Decoded, bool]:
    """OTLP/JSON or the SDK's console JSON when the file starts with ``{``, else protobuf.

    A protobuf body starts with 0x0a (field 1, LEN), which ``lstrip`` takes for a newline, and a first
    resource of 123 bytes then reads ``\n{``: such a start is JSON only where JSON finds resources in it.
    """
    if data.lstrip()[:1] != b"{":
        return protobuf.decode(data)
    head = data[:4096]
    if b'"resourceSpans"' not in head and console.looks_like(head):
        return console.decode(data)
    as_json = otlp_json.decode(data)
    if as_json[0].resources:
        return as_json
    # a framed protobuf may start with a length byte of 123 too: it is taken where it reads resources
    as_pb = protobuf.decode(data)
    return as_pb if data[:1] == b"\x0a" or as_pb[0].resources else as_json


def role_of(attrs: dict[str, Any]) -> str | None:
    for key in ROLE_KEYS:
        value = attrs.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def rank_of(attrs: dict[str, Any]) -> int | None:
    for key in RANK_KEYS:
        value = attrs.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.isdigit():
            return int(value)
    return None


def pid_of(attrs: dict[str, Any]) -> int | None:
    value = attrs.get("process.pid")
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 31 else None


def _source_pid(attrs: dict[str, Any]) -> SourcePid:
    """The process a resource is: its OS pid, else its service as a sub-process of the file's owner."""
    pid = pid_of(attrs)
    if pid is not None:
        return pid
    return f"otlp {role_of(attrs) or 'unknown service'}"


def _plausible(s: Span) -> bool:
    return EARLIEST_NS <= s.start_ns < MAX_TS_NS and s.start_ns <= s.end_ns < MAX_TS_NS


def flow_key(trace_id: str, span_id: str) -> str:
    return f"{FLOW_PREFIX}{trace_id}:{span_id}"


def span_markers(data: bytes) -> tuple[list[Marker], int]:
    """The step markers among an OTLP document's spans, and the latest end of any of them (0: none):
    what the live watch learns from one OTLP/JSON line (a Collector's ``file`` exporter writes them)."""
    decoded, _ = decode(data)
    out, last = [], 0
    for block in decoded.resources:
        for s in block.spans:
            if _plausible(s):
                last = max(last, s.end_ns)
                if found := marker(s.name, s.start_ns, s.end_ns, s.attributes):
                    out.append(found)
    return out, last


class _Process:
    """One source process's spans while the file is read."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.ids: set[str] = set()


def _lanes(spans: list[Span], ids: set[str]) -> dict[str, int]:
    """span id -> lane: each local root (its parent not in this process) and its subtree on the
    lowest lane free when it starts, so concurrent trees never share a lane."""
    children: dict[str, list[Span]] = defaultdict(list)
    roots = []
    for s in spans:
        if s.parent_span_id and s.parent_span_id in ids and s.parent_span_id != s.span_id:
            children[s.parent_span_id].append(s)
        else:
            roots.append(s)
    lane_of: dict[str, int] = {}
    busy: list[tuple[int, int]] = []  # (end, lane) of the trees placed
    free: list[int] = []
    for root in sorted(roots, key=lambda s: (s.start_ns, -s.end_ns)):
        while busy and busy[0][0] <= root.start_ns:
            heapq.heappush(free, heapq.heappop(busy)[1])
        lane = heapq.heappop(free) if free else len(busy) + len(free) + 1
        heapq.heappush(busy, (root.end_ns, lane))
        stack = [root]
        while stack:  # the subtree, iteratively (a deep or cyclic chain costs no recursion)
            s = stack.pop()
            if s.span_id in lane_of:
                continue
            lane_of[s.span_id] = lane
            stack.extend(children.get(s.span_id, ()))
    for s in spans:  # a parent cycle has no root: its spans go on lane 1
        lane_of.setdefault(s.span_id, 1)
    return lane_of


def _args(s: Span, local_parent: bool) -> dict[str, Any]:
    args: dict[str, Any] = dict(s.attributes)
    args["otlp.trace_id"] = s.trace_id
    args["otlp.span_id"] = s.span_id
    if s.parent_span_id:
        args["otlp.parent_span_id"] = s.parent_span_id
        if not local_parent:
            args["otlp.parent_in"] = "another process"
    args["otlp.kind"] = kind_name(s.kind)
    if s.status_code:
        status = STATUS[s.status_code] if s.status_code < len(STATUS) else str(s.status_code)
        args["otlp.status"] = f"{status}: {s.status_message}" if s.status_message else status
    if s.links:
        args["otlp.links"] = [f"{k.trace_id}:{k.span_id}" for k in s.links]
    if s.scope:
        args["otlp.scope"] = s.scope
    return args


def _raw(args: dict[str, Any]) -> msgspec.Raw:
    return msgspec.Raw(orjson.dumps(args, default=str))


class Otlp(Format, MarksSteps):
    kind = "otlp"
    stack = "otlp"
    label = "OTLP"
    order = 10
    markers_rank = 0  # NeMo-RL's ``rl.<algo>.step`` spans give the run's steps, as RL-Insight's do
    counts = (("run_flow_endpoints", False),)

    def sniff(self, head: Head) -> int:
        raw = head.data
        data = raw.lstrip()
        name = head.source.name.removesuffix(".gz")
        # a protobuf body starts with 0x0a (field 1, LEN), which ``lstrip`` takes for a newline: try it
        # as protobuf first, and as JSON only when that finds nothing
        pb_start = raw[:1] == b"\x0a" or data[:1] not in (b"{", b"[", b"")
        if pb_start:
            attrs, _ = protobuf.head_facts(raw)
            if attrs:
                if name.endswith(_NAMES):
                    return 95
                return 85 if "service.name" in attrs or "telemetry.sdk.name" in attrs else 0
        if data[:1] == b"{":
            return 95 if b'"resourceSpans"' in data[:4096] or console.looks_like(data[:4096]) else 0
        if pb_start and name.endswith(_NAMES) and protobuf.starts_like_otlp(raw):
            return 90  # cut before its first resource ends: the reader keeps what is whole and says so
        return 0

    def hints(self, head: Head) -> Hints:
        attrs, start = self._facts(head)
        return Hints(
            pid=pid_of(attrs),
            host=attrs.get("host.name") if isinstance(attrs.get("host.name"), str) else None,
            process_role=role_of(attrs),
            rank=rank_of(attrs),
            start_ns=start if start is not None and EARLIEST_NS <= start < MAX_TS_NS else None,
        )

    @staticmethod
    def _facts(head: Head) -> tuple[dict[str, Any], int | None]:
        if head.data.lstrip()[:1] != b"{":
            return protobuf.head_facts(head.data)
        if head.data[:1] == b"\x0a":  # protobuf whose first resource is 123 bytes long (see decode)
            pb_facts = protobuf.head_facts(head.data)
            if pb_facts[0]:
                return pb_facts
        if head.whole or console.looks_like(head.data[:4096]):  # console: its first span says it all
            decoded, _ = decode(head.data)
            for block in decoded.resources:
                first = min((s.start_ns for s in block.spans if _plausible(s)), default=None)
                return block.attributes, first
            return {}, None
        attrs: dict[str, Any] = {}
        until = head.data.find(b'"scopeSpans"')  # the first resource's attributes come before its spans
        for m in _JSON_KEY.finditer(head.data, 0, until if until > 0 else len(head.data)):
            key, value = m.group(1).decode("utf-8", "replace"), m.group(2).decode("utf-8", "replace")
            attrs.setdefault(key, int(value) if value.isdigit() else value)
        start = _JSON_START.search(head.data)
        return attrs, int(start.group(1)) if start else None

    def step_markers(self, src: Source) -> tuple[Marker, ...]:
        """NeMo-RL's step spans (``rl.<algo>.step``, numbered by ``rl.iteration``): the step windows."""
        try:
            with src.open() as f:
                data = f.read()
            if data[:2] == b"\x1f\x8b":  # a gzipped export (.binpb.gz, .otlp.json.gz)
                data = gzip.decompress(data)
            if b".step" not in data:
                return ()
            return tuple(span_markers(data)[0])
        except Exception:  # unreadable or unusable here: its reader reports it; no windows from it
            return ()

    def read(self, data: bytes, ctx: ReadContext) -> ReadResult:
        with gc_paused():  # millions of small objects: generational GC passes over them are wasted
            return self._read(data, ctx)

    def _read(self, data: bytes, ctx: ReadContext) -> ReadResult:
        res = ReadResult(anchor_ns=0, anchor_source="unix ns (OTLP start/end times: the host's wall clock)")
        try:
            decoded, whole = decode(data)
        except RecursionError:
            decoded, whole = Decoded(), False
        if not whole:
            res.complete = False
            res.problems.append(
                Problem("incomplete", ctx.path, f"OTLP {decoded.encoding or 'file'} is cut (process killed?)")
            )
        processes: dict[SourcePid, _Process] = defaultdict(_Process)
        resources: dict[SourcePid, dict[str, Any]] = {}
        for block in decoded.resources:
            spid = _source_pid(block.attributes)
            resources.setdefault(spid, block.attributes)
            proc = processes[spid]
            for s in block.spans:
                if _plausible(s):
                    proc.spans.append(s)
                    proc.ids.add(s.span_id)
                else:
                    decoded.drop(WHY_TIME)
        n_events = 0
        for spid, proc in processes.items():
            role = role_of(resources[spid])
            if role:
                res.process_names[spid] = role
            lanes = _lanes(proc.spans, proc.ids)
            for s in proc.spans:
                tid = lanes[s.span_id]
                local = bool(s.parent_span_id) and s.parent_span_id in proc.ids
                res.events.append(self._slice(s, spid, tid, local))
                for ev in s.events:
                    if EARLIEST_NS <= ev.time_ns < MAX_TS_NS:
                        res.events.append(
                            Event(
                                ph="i",
                                name=ev.name,
                                cat=EVENT_CAT,
                                pid=spid,
                                tid=tid,
                                ts=ev.time_ns,
                                s="t",
                                args=_raw(ev.attributes) if ev.attributes else msgspec.UNSET,
                            )
                        )
                    else:
                        decoded.drop(WHY_TIME)
                n_events += 1 + len(s.events)
            for lane in set(lanes.values()):
                res.thread_names[(spid, lane)] = f"spans {lane}"
        # an SDK exports a span when it ENDS (children before parents): hand them on in start order,
        # parents first, as the merge's nesting expects of a format with ``slice_order = "start"``
        res.events.sort(key=lambda e: (e.ts, -e.dur if isinstance(e.dur, int) else 0))
        res.read = n_events + decoded.bad
        res.dropped = decoded.bad
        res.dropped_why = dict(decoded.why)
        res.meta[MANIFEST_ENTRY] = {
            "otlp": {
                "encoding": decoded.encoding,
                "resources": [
                    {
                        k: v
                        for k, v in (
                            ("service.name", attrs.get("service.name")),
                            ("process.pid", pid_of(attrs)),
                            ("host.name", attrs.get("host.name")),
                            ("role", role_of(attrs)),
                            ("rank", rank_of(attrs)),
                        )
                        if v is not None
                    }
                    for attrs in resources.values()
                ],
            }
        }
        return res

    @staticmethod
    def _slice(s: Span, spid: SourcePid, tid: int, local_parent: bool) -> Event:
        e = Event(
            ph="X",
            name=s.name,
            cat=CAT,
            pid=spid,
            tid=tid,
            ts=s.start_ns,
            dur=s.end_ns - s.start_ns,
            args=_raw(_args(s, local_parent)),
        )
        if s.parent_span_id and not local_parent:
            e.bind_id, e.flow_in = flow_key(s.trace_id, s.parent_span_id), True
        elif s.links:
            e.bind_id, e.flow_in = flow_key(s.links[0].trace_id, s.links[0].span_id), True
        else:
            e.bind_id, e.flow_out = flow_key(s.trace_id, s.span_id), True
        return e

    def lane_of(self, pid: SourcePid, tid: Any, result: ReadResult) -> str:
        return result.thread_names.get((pid, tid)) or f"spans {tid}"

    def process_role(self, pid: SourcePid, result: ReadResult) -> str | None:
        return result.process_names.get(pid)  # its resource's role (read): every process of a Collector file
