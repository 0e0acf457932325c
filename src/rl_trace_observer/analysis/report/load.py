"""Read a merged Chrome-trace file (``.json`` / ``.json.gz``) keeping only what the report needs.

Merged traces reach gigabytes, and a Python dict per event costs ~5x the JSON. So the file is decoded
a few MB at a time (:mod:`.stream`) into small structs whose ``args`` stay raw bytes, and only
four kinds survive: stage candidates (spans whose category is RL-Insight's/VERL's or whose name the
stage table knows — only their ``args`` are parsed), counters, process/thread names, and a
fixed-size heap of the longest spans of any source — plus, as columns of ints, the Kineto
kernels and their launches (:mod:`..gpu.store`). Everything else is counted and dropped on the
spot, so memory follows what is kept, not the file size. A layout the chunker cannot follow falls
back to one whole-document decode (a test checks both give the same summary). Times: ``ts``/``dur``
µs (≤3 decimals, as writers emit) become exact integer ns once, here.
"""

from __future__ import annotations

import gzip
import heapq
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import orjson
from msgspec import UNSET, UnsetType

from ...merge.formats.base.chrome_json import gc_paused  # one GC policy for every bulk decoder
from ...merge.timeline.model import us_to_ns
from ..gpu.kinds import GPU_CATEGORIES, LAUNCH_CATEGORIES
from ..gpu.store import KernelStore, decode_ids
from .stages import OTHER, classify
from .stream import CHUNK_BYTES, Event, EventStream, NotStreamable, decode_events

__all__ = ["Counter", "Span", "TraceData", "TraceError", "load_trace", "split_labels"]

# prefixes of the categories RL-Insight / our markers use, and the capture layer's rollout spans
# spans kept whatever their name: RL-Insight's, VERL's, our request spans, OTLP spans (``rl.bucket``)
STAGE_CATEGORIES = ("rl_insight", "verl", "rl_trace.", "otlp")
LONGEST_KEPT = 20
# Below 2**33 µs (2.4 h from the trace's base) a µs value with ≤3 decimals is within 2**-20 µs of
# its double, so round(us * 1000) is the exact ns (error < 0.002 ns); beyond, merge.timeline.model.us_to_ns.
_FAST_US = float(2**33)


class TraceError(ValueError):
    """The file is not a Chrome trace we can read; the message names the file."""


@dataclass(slots=True)
class Span:
    name: str
    cat: str
    pid: Any
    tid: Any
    start_ns: int
    dur_ns: int
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.dur_ns


@dataclass(slots=True)
class Counter:
    name: str
    pid: Any
    ts_ns: int
    value: float
    labels: dict[str, str] = field(default_factory=dict)
    cat: str = ""  # ``metrics.*``: a metric sampler's track (the telemetry section), not a scalar metric


_LABELLED = re.compile(r"^(.*)\{([^{}]*)\}$")


def split_labels(name: str) -> tuple[str, dict[str, str]]:
    """``"actor/pg_loss{rank=0,step=1}"`` → ``("actor/pg_loss", {"rank": "0", "step": "1"})``.

    The merger puts an RL-Insight metric's labels into its counter name so that each label set gets
    its own Perfetto track; the report wants the metric and its step back.
    """
    m = _LABELLED.match(name)
    if not m:
        return name, {}
    labels = {}
    for part in m.group(2).split(","):
        key, sep, value = part.partition("=")
        if not sep:
            return name, {}
        labels[key.strip()] = value.strip()
    return m.group(1), labels


@dataclass
class TraceData:
    """What the report reads from one trace file."""

    path: str
    # stage candidates (see module docstring); from span shards a :class:`.span_table.SpanTable`
    spans: Sequence[Span] = field(default_factory=list)
    longest: list[Span] = field(default_factory=list)  # the longest spans of any kind, longest first
    counters: list[Counter] = field(default_factory=list)
    process_names: dict[Any, str] = field(default_factory=dict)
    process_args: dict[Any, dict[str, Any]] = field(default_factory=dict)
    thread_names: dict[tuple[Any, Any], str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)  # top-level keys other than traceEvents
    gpu: KernelStore = field(default_factory=KernelStore)  # Kineto kernels and their launches
    events: int = 0  # timeline events, as the merge counts them (its events_kept): names aside
    names: int = 0  # metadata events (process and thread names, sort indexes)
    spans_seen: int = 0
    unmatched_ends: int = 0
    dropped: int = 0  # events whose fields had unexpected types
    mode: str = ""
    missing_parts: list[dict[str, str]] = field(default_factory=list)  # span shard parts left out, why
    missing_note: str | None = None  # the same in one line


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))


def _args(raw: msgspec.Raw | UnsetType | None) -> dict[str, Any]:
    if raw is None or raw is UNSET:
        return {}
    try:
        value = orjson.loads(bytes(raw))
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


class _Collector:
    """Consumes decoded events a chunk at a time; keeps only what the report needs."""

    def __init__(self, data: TraceData, gpu: bool = True) -> None:
        self.data = data
        self.gpu = gpu
        self.spans: list[Span] = []
        data.spans = self.spans
        self._heap: list[tuple[int, int, Span]] = []
        self._open: dict[tuple[Any, Any], list[Event]] = {}
        self._seq = 0

    def feed(self, events: list[Event]) -> None:
        """The hot loop: ~1 M events/s, so only cheap tests before anything is allocated."""
        self.data.events += len(events)
        heap = self._heap
        kernels: list[Event] = []
        launches: list[Event] = []
        for ev in events:
            ph = ev.ph
            if ph == "X":
                if ev.ts is None:
                    continue
                self.data.spans_seen += 1
                name, cat, dur = ev.name, ev.cat, ev.dur or 0
                if type(name) is not str or type(cat) is not str:
                    name, cat = _text(name), _text(cat)
                if cat in GPU_CATEGORIES:
                    kernels.append(ev)
                elif cat in LAUNCH_CATEGORIES:
                    launches.append(ev)
                keep = cat.startswith(STAGE_CATEGORIES) or classify(name) != OTHER
                if keep or len(heap) < LONGEST_KEPT or dur * 1000.0 >= heap[0][0] - 1:
                    self._span(ev, name, cat, us_to_ns(ev.ts), us_to_ns(dur), keep)
            elif ph == "B":
                self._open.setdefault((ev.pid, ev.tid), []).append(ev)
            elif ph == "E":
                self._end(ev)
            elif ph == "C":
                self._counter(ev)
            elif ph == "M":
                self.data.names += 1
                self._meta(ev)
        if self.gpu and (kernels or launches):
            _gpu_columns(self.data.gpu, kernels, launches)

    def _span(self, ev: Event, name: str, cat: str, start_ns: int, dur_ns: int, keep: bool) -> None:
        span = Span(name, cat, ev.pid, ev.tid, start_ns, max(dur_ns, 0))
        if keep:
            span.args = _args(ev.args)
            self.spans.append(span)
        self._seq += 1
        item = (span.dur_ns, -self._seq, span)
        if len(self._heap) < LONGEST_KEPT:
            heapq.heappush(self._heap, item)
        elif item[:2] > self._heap[0][:2]:
            heapq.heapreplace(self._heap, item)

    def _end(self, ev: Event) -> None:
        stack = self._open.get((ev.pid, ev.tid))
        if not stack or ev.ts is None:
            self.data.unmatched_ends += 1
            return
        begin = stack.pop()
        start = us_to_ns(begin.ts or 0)
        name, cat = _text(begin.name), _text(begin.cat)
        self.data.spans_seen += 1
        self._span(
            begin,
            name,
            cat,
            start,
            us_to_ns(ev.ts) - start,
            cat.startswith(STAGE_CATEGORIES) or classify(name) != OTHER,
        )

    def _counter(self, ev: Event) -> None:
        if ev.ts is None:
            return
        ts_ns = us_to_ns(ev.ts)
        name, labels = split_labels(_text(ev.name))
        for key, value in _args(ev.args).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                label = name if key == "value" else f"{name} {key}"
                self.data.counters.append(Counter(label, ev.pid, ts_ns, float(value), labels, _text(ev.cat)))

    def _meta(self, ev: Event) -> None:
        args = _args(ev.args)
        label = args.get("name")
        if ev.name == "process_name" and label is not None:
            self.data.process_names[ev.pid] = _text(label)
            self.data.process_args[ev.pid] = args
        elif ev.name == "thread_name" and label is not None:
            self.data.thread_names[(ev.pid, ev.tid)] = _text(label)

    def finish(self) -> None:
        self.data.unmatched_ends += sum(len(s) for s in self._open.values())
        self.data.longest = [s for _, _, s in sorted(self._heap, key=lambda it: it[:2], reverse=True)]


def _ns(values: list[Any]) -> Any:
    """µs (≤ 3 decimals) → exact ns; below 2**33 µs a product is exact (see _FAST_US): 3x cheaper.
    The GPU loops' compiled twin does it in C into an array (tested equal)."""
    twin = _twin()
    if twin is not None:
        return twin.ns_array(values, us_to_ns)
    return [round(v * 1000) if 0 <= v < _FAST_US else us_to_ns(v) for v in values]


def _twin() -> Any:
    from ...common import twins

    return twins.twin("rl_trace_observer.analysis.gpu._gpu_native")


def _texts(values: list[Any]) -> list[str]:
    return values if set(map(type, values)) <= {str} else [_text(v) for v in values]


def _raws(values: list[Any]) -> list[Any]:
    return [b"{}" if v is UNSET else v for v in values] if UNSET in values else values


def _gpu_columns(gpu: KernelStore, kernels: list[Event], launches: list[Event]) -> None:
    """One chunk's Kineto GPU events and launch calls into the kernel store, column-wise."""
    twin = _twin()
    if twin is not None and _twin_columns(twin, gpu, kernels, launches):
        return
    if kernels:
        gpu.extend_kernels(
            [e.pid for e in kernels], [e.tid for e in kernels], _ns([e.ts for e in kernels]),
            _ns([e.dur or 0 for e in kernels]), _texts([e.name for e in kernels]),
            _texts([e.cat for e in kernels]), _raws([e.args for e in kernels]),
        )  # fmt: skip
    if launches:
        gpu.extend_launches(
            [e.pid for e in launches], [e.tid for e in launches], _ns([e.ts for e in launches]),
            _ns([e.dur or 0 for e in launches]), _raws([e.args for e in launches]),
        )  # fmt: skip


def _twin_columns(twin: Any, gpu: KernelStore, kernels: list[Event], launches: list[Event]) -> bool:
    """:func:`_gpu_columns` through the compiled twin (one C pass per list, ids as columns, tested
    equal); False, with nothing stored, where a value needs the reference path (a pid that is not an
    int, an id past int64)."""
    try:
        k = twin.event_columns(kernels, us_to_ns, True) if kernels else None
        la = twin.event_columns(launches, us_to_ns, False) if launches else None
        if (k is None and kernels) or (la is None and launches):
            return False
        k_ids = twin.id_columns(decode_ids(k[6])) if k is not None else None
        l_corrs = twin.id_columns(decode_ids(la[6]))[1] if la is not None else None
    except OverflowError:
        return False
    if k is not None and k_ids is not None:
        pid, tid, ts, dur, names, cats, _ = k
        streams, corrs = k_ids
        keep = twin.nonneg_positions(streams)
        if len(keep) < len(streams):
            gpu.untracked += len(streams) - len(keep)
            pid, tid, ts, dur, streams, corrs = (
                twin.take(c, keep) for c in (pid, tid, ts, dur, streams, corrs)
            )
            names, cats = [names[i] for i in keep], [cats[i] for i in keep]
        ids = twin.name_codes(names, gpu._name_ids)
        if -1 in ids:  # names first seen in this chunk: numbered as extend_kernel_ids numbers them
            first: dict[str, str] = {}
            for name, cat in zip(names, cats, strict=True):
                if name not in gpu._name_ids:
                    first.setdefault(name, cat)
            gpu.intern(list(first), list(first.values()))
            ids = twin.name_codes(names, gpu._name_ids)
        gpu.extend_kernel_arrays(pid, tid, ts, dur, ids, streams, corrs)
    if la is not None and l_corrs is not None:
        pid, tid, ts, dur = la[:4]
        keep = twin.nonneg_positions(l_corrs)
        if len(keep) < len(l_corrs):
            pid, tid, ts, dur, l_corrs = (twin.take(c, keep) for c in (pid, tid, ts, dur, l_corrs))
        gpu.extend_launch_arrays(pid, tid, ts, dur, l_corrs)
    return True


def open_binary(path: Path) -> BinaryIO:
    with path.open("rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return path.open("rb")


def _read_stream(path: Path, collector: _Collector, chunk_bytes: int) -> dict[str, Any]:
    with open_binary(path) as f, gc_paused():
        stream = EventStream(f, chunk_bytes)
        for events in stream.chunks():
            collector.feed(events)
    collector.data.dropped += stream.dropped
    return stream.metadata


_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])


def _read_document(path: Path, collector: _Collector) -> dict[str, Any]:
    """One decode of the whole file (the fallback): top-level values stay raw until needed."""
    with open_binary(path) as f:
        raw = f.read()
    meta: dict[str, Any] = {}
    try:
        if raw.lstrip().startswith(b"["):
            body = raw
        else:
            top = _TOP.decode(raw)
            if "traceEvents" not in top:
                raise TraceError(f"{path}: not a Chrome trace (no traceEvents array)")
            body = bytes(top.pop("traceEvents"))
            meta = {k: orjson.loads(bytes(v)) for k, v in top.items()}
        with gc_paused():
            events, dropped = decode_events(body)
            collector.feed(events)
    except (msgspec.DecodeError, orjson.JSONDecodeError) as exc:
        raise TraceError(f"{path}: not a Chrome trace JSON file ({exc})") from None
    collector.data.dropped += dropped
    return meta


def load_trace(
    path: str | Path, *, mode: str = "auto", chunk_bytes: int = CHUNK_BYTES, gpu: bool = True
) -> TraceData:
    """Read ``path``. ``mode``: ``auto`` streams and falls back to one whole decode when the layout
    defeats the chunker; ``stream`` / ``document`` force one way (tests, benchmarks). ``gpu=False``
    keeps no kernels (the benchmark's baseline: the report as it was before the GPU section)."""
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"{p}: no such trace file")
    if mode not in ("auto", "stream", "document"):
        raise ValueError(f"unknown mode {mode!r}")
    try:
        if mode != "document":
            data = TraceData(path=str(p), mode="stream")
            collector = _Collector(data, gpu)
            try:
                data.metadata = _read_stream(p, collector, chunk_bytes)
                collector.finish()
                return data
            except NotStreamable as exc:
                if mode == "stream":
                    raise TraceError(f"{p}: cannot stream this trace ({exc})") from None
        data = TraceData(path=str(p), mode="document")
        collector = _Collector(data, gpu)
        data.metadata = _read_document(p, collector)
        collector.finish()
        return data
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TraceError(f"{p}: cannot read ({exc})") from None
