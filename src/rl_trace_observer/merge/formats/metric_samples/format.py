"""The metric sampler's files as counter tracks, placed where each source belongs.

Times are wall-clock ns of the sampler's host (anchor 0), corrected like every source on that host.
Each source's tracks are built by :mod:`.tracks` (gauges as sampled, counters as rates, histograms
as mean / p50 / p99) and placed by :mod:`.placement`: an engine under its server process,
TransferQueue as a process of its own, a GPU under ``GPU k`` of each process that used it (the
Kineto trace's device process of that process), the host as ``Host``. What was sampled — GPUs found
(or why none), targets, outages, why the sampler stopped, its own CPU time — goes into the file's
manifest entry (``metrics``).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from ...files.sources import Head
from ...timeline.model import Event, Problem
from ...timeline.times import EARLIEST_NS, MAX_TS_NS
from ..base import MANIFEST_ENTRY, Format, Hints, ProcessRef, ReadContext, ReadResult, SourcePid
from ..base.chrome_hints import first_int
from . import hardware
from .decode import SamplesFile, decode, is_samples
from .placement import HOST, Place, places
from .tracks import Track, source_tracks

CATEGORY = "metrics"  # counter events are ``metrics.<kind>``: gauge, rate, mean, p50, p99
_SAMPLES = re.compile(r"^metrics-(?P<host>.+)-pid-(?P<pid>\d+)\.samples\.jsonl$")
_WALL_NS = re.compile(rb'"wall_ns"\s*:\s*(\d{1,20})')
_encode = msgspec.json.Encoder()
# a sampler writes a stop line however it leaves, also on SIGTERM; only SIGKILL (or a crash) cannot
NO_STOP = "no stop line: ended by SIGKILL or a crash (or still running when merged)"


def summary(file: SamplesFile) -> dict[str, Any]:
    """The manifest's ``metrics`` entry for one samples file."""
    meta = file.meta
    stats = file.last_stats() or {}
    stop = next((e for e in reversed(file.events) if e.get("k") == "stop"), None)
    return {
        "host": meta.get("host"),
        "interval_s": meta.get("interval_s"),
        "profiled_interval_s": meta.get("profiled_interval_s"),
        "gpus": meta.get("gpus"),
        "host_metrics": meta.get("host_metrics"),
        "targets_scraped": meta.get("targets"),
        "targets": [
            {k: s.fields.get(k) for k in ("job", "address", "labels")}
            for s in file.sources.values()
            if s.kind == "prometheus"
        ],
        "down": [
            {"address": e.get("address"), "t": e.get("t"), "error": e.get("error")}
            for e in file.events
            if e.get("k") == "down"
        ],
        "samples": len(file.samples),
        "stopped": stop.get("reason") if stop else NO_STOP,
        "sampler": {k: stats.get(k) for k in ("cpu_s", "scrapes", "failures")},
    }


def _spid(place: Place) -> int | str:
    """A place as an event's source pid: ``(pid, "GPU k")`` travels as ``"<pid>/GPU k"``."""
    return f"{place[0]}/{place[1]}" if isinstance(place, tuple) else place


def counter_events(file: SamplesFile) -> list[Event]:
    """Every track point of every source, as Chrome counter events."""
    out: list[Event] = []
    where = places(file)
    node = {src for src, s in file.sources.items() if s.kind != "host" and hardware.is_node_exporter(file, s)}
    on_host = any(where.get(src) == [HOST] for src in node)
    for src, source in file.sources.items():
        if hardware.is_npu_exporter(file, source):
            for device, device_tracks in hardware.npu_tracks(file, src).items():
                _emit(out, device, device_tracks)
            continue
        if src in node:
            tracks = hardware.node_tracks(file, src)
        else:
            tracks = source_tracks(file, src)
            if source.kind == "host" and on_host:  # one quantity, one track: node_exporter's
                tracks = [t for t in tracks if not hardware.is_psutil_twin(t)]
        for place in where.get(src, []):
            _emit(out, place, tracks)
    return out


def _emit(out: list[Event], place: Place, tracks: list[Track]) -> None:
    spid = _spid(place)
    for track in tracks:
        cat = f"{CATEGORY}.{track.kind}"
        for t, v in track.points:
            if EARLIEST_NS <= t < MAX_TS_NS:
                args = msgspec.Raw(b'{"value":' + _encode.encode(v) + b"}")
                out.append(Event(ph="C", name=track.name, cat=cat, pid=spid, tid=0, ts=t, args=args))


class MetricSamples(Format):
    kind = "metric_samples"
    label = "Metrics"
    order = 6  # free in the 4-bit source field of merged tids (0-5 and 9 are taken)

    def sniff(self, head: Head) -> int:
        return 100 if is_samples(head.data) else 0

    def hints(self, head: Head) -> Hints:
        """The file's name says host and pid (the sampler's), its ``meta`` line when it started."""
        h = Hints()
        m = _SAMPLES.match(head.source.name)
        if m:
            h.host, h.pid = m.group("host"), int(m.group("pid"))
        h.start_ns = first_int(_WALL_NS.search(head.data))
        return h

    def read(self, data: bytes, ctx: ReadContext) -> ReadResult:
        res = ReadResult(anchor_ns=0, anchor_source="wall-clock ns of the sampler's host")
        file = decode(data)
        res.complete = file.complete
        if not file.complete:
            res.problems.append(Problem("incomplete", ctx.path, "last line is cut (sampler killed?)"))
        if file.bad_lines:
            res.dropped += file.bad_lines
            res.problems.append(Problem("dropped_events", ctx.path, f"{file.bad_lines} lines are not valid"))
        res.events = counter_events(file)
        res.read = len(res.events)
        res.meta[MANIFEST_ENTRY] = {"metrics": summary(file)}
        if file.meta.get("host"):
            res.meta["host_name"] = file.meta["host"]
        res.process_names = {e.pid: str(e.pid) for e in res.events if isinstance(e.pid, str)}
        return res

    def process_of(self, pid: SourcePid, result: ReadResult, ctx: ReadContext) -> ProcessRef:
        """``"<pid>/GPU k"`` → ``(pid, "GPU k")``: that process's device; an int is an OS pid on the
        sampler's host (an engine's server); any other text is a sub-process of the sampler
        (``Host``, ``TransferQueue``, ``GPU n`` of a GPU nobody used, a target of its own)."""
        if isinstance(pid, str):
            head, sep, sub = pid.partition("/")
            if sep and head.isdigit():
                return (int(head), sub)
        return pid

    def lane_of(self, pid: SourcePid, tid: Any, result: ReadResult) -> str:
        return "metrics"
