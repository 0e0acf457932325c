"""The samples file: JSONL, one line per event (docs/FORMATS.md, "Metric samples").

Lines (``k`` is the kind):

- ``meta``: first line — schema, host, pid, intervals, a clock snapshot, GPUs found (or why not);
- ``source``: a thing sampled — a Prometheus target (job, address, labels, who registered it), a
  GPU (index, PCI bus id, UUID, name) or the host — with a small integer ``src``;
- ``series``: one time series of a source — Prometheus family, type, sample name, labels — with a
  small integer ``id``;
- ``s``: one sample of a source at wall-clock ``t`` (ns; the request's midpoint), ``d`` its
  duration, and ``v``: ``[[series id, value], ...]`` for the series whose value CHANGED since the
  source's previous sample (every series keeps its last value until a new one is written; a
  sample with an empty ``v`` still says "sampled, nothing moved", which a rate needs);
- ``down`` / ``up``: a source stopped / started answering (noted once per outage, with the error);
- ``stats``: the sampler's own cost so far (CPU seconds, scrapes, failures), every 10 s and at exit.

Append-only and whole lines only: a reader drops a cut last line and keeps everything before it.
The ``meta``, ``source`` and ``series`` lines are the writer's header lines: a file started anew
(after the old one was removed or replaced) begins with all of them again, so it reads on its own.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

from ...common.encoding import dumps_line
from .exposition import Series
from .sink import LineSink

SCHEMA = "rl-trace-samples/1"
SAMPLES_NAME = "metrics-{host}-pid-{pid}.samples.jsonl"


def _value(v: float) -> float | str:
    """JSON has no NaN/Inf: those are written as the Prometheus text spelling."""
    if math.isfinite(v):
        return v
    return "NaN" if math.isnan(v) else ("+Inf" if v > 0 else "-Inf")


class SampleWriter:
    """Numbers sources and series, writes only changed values; used by the sampler loop only."""

    def __init__(self, sink: LineSink) -> None:
        self.sink = sink
        self._sources = 0
        self._series: dict[int, dict[Series, int]] = {}  # per source: one dict lookup per value
        self._last: dict[int, float] = {}
        self._count = 0
        self.samples = 0

    def line(self, obj: dict[str, Any]) -> None:
        self.sink.append(dumps_line(obj))

    def header(self, obj: dict[str, Any]) -> None:
        """A line every file of the samples needs before its samples (meta, sources, series)."""
        self.sink.append_header(dumps_line(obj))

    def source(self, kind: str, **fields: Any) -> int:
        self._sources += 1
        self.header({"k": "source", "src": self._sources, "kind": kind, **fields, "t": time.time_ns()})
        return self._sources

    def _series_id(self, src: int, series: Series) -> int:
        of_src = self._series.setdefault(src, {})
        sid = of_src.get(series)
        if sid is None:
            self._count += 1
            sid = of_src[series] = self._count
            self.header(
                {
                    "k": "series",
                    "id": sid,
                    "src": src,
                    "family": series.family,
                    "type": series.type,
                    "name": series.name,
                    "labels": dict(series.labels),
                }
            )
        return sid

    def sample(self, src: int, t_ns: int, dur_ns: int, values: list[tuple[Series, float]]) -> None:
        changed: list[list[Any]] = []
        last = self._last
        ids = self._series.get(src) or {}
        for series, value in values:
            sid = ids.get(series)
            if sid is None:
                sid = self._series_id(src, series)
                ids = self._series[src]
            old = last.get(sid)
            if old is None or (old != value and not (math.isnan(old) and math.isnan(value))):
                last[sid] = value
                changed.append([sid, _value(value)])
        self.samples += 1
        self.line({"k": "s", "src": src, "t": t_ns, "d": dur_ns, "v": changed})

    def event(self, kind: str, src: int, t_ns: int, *, placement: bool = False, **fields: Any) -> None:
        """``placement``: a fact the merger places tracks by (``server``, ``gpu_users``): a header line."""
        line = {"k": kind, "src": src, "t": t_ns, **fields}
        if placement:
            self.header(line)
        else:
            self.line(line)


@functools.lru_cache(maxsize=1024)
def named(family: str, kind: str) -> Series:
    """A series the sampler makes itself (GPU, host): its family is its sample name, no labels."""
    return Series(family, kind, family, ())
