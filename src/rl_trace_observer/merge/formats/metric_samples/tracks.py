"""Samples → counter tracks: gauges as sampled, counters as rates, histograms as mean / p50 / p99.

Pure functions over one source's samples (all times wall-clock ns, before clock correction):

- a gauge is a track of its sampled values (a point where the value changed);
- a counter is a track of its rate per second over each sampling interval, put at the interval's
  start so Perfetto's step draws it over the interval it describes, and closed with a 0 at the
  source's last sample (nothing is known after it); a counter that went DOWN was
  reset (its process restarted): the interval counts the new value from zero, as Prometheus'
  ``rate()`` does;
- a histogram (``_bucket``/``_sum``/``_count``) gives, per interval with observations, the mean
  (Δsum / Δcount) and the 50th and 99th percentiles interpolated inside the buckets of the
  interval's new observations (Prometheus' ``histogram_quantile`` rule); intervals without an
  observation add no point, so the last value holds until the next one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from .decode import Sample, SamplesFile, SeriesDef

QUANTILES = (0.5, 0.99)


@dataclass
class Track:
    """One counter track: its name, the quantity, and its points (ts ns, value)."""

    src: int
    name: str
    family: str
    kind: str  # gauge, rate, mean, p50, p99
    labels: dict[str, str]
    points: list[tuple[int, float]] = field(default_factory=list)

    def add(self, t: int, v: float) -> None:
        if math.isfinite(v) and (not self.points or self.points[-1][1] != v or self.points[-1][0] == t):
            if self.points and self.points[-1][0] == t:
                self.points[-1] = (t, v)
            else:
                self.points.append((t, v))


def _is_counter(s: SeriesDef) -> bool:
    return s.type == "counter" or (s.type in ("untyped", "unknown") and s.name.endswith("_total"))


def _hist_part(s: SeriesDef) -> str | None:
    if s.type not in ("histogram", "gaugehistogram"):
        return None
    for part in ("_bucket", "_sum", "_count"):
        if s.name == s.family + part:
            return part
    return None


def snapshots(samples: Iterable[Sample]) -> Iterator[tuple[Sample, dict[int, float]]]:
    """Each sample with every series' value at that moment (series keep their last value)."""
    current: dict[int, float] = {}
    for sample in samples:
        for sid, value in sample.values:
            current[sid] = value
        yield sample, current


def rate(prev: float, cur: float, dt_s: float) -> float:
    """Per-second increase over an interval; a decrease is a reset (the counter restarted from 0)."""
    delta = cur - prev if cur >= prev else cur
    return delta / dt_s


def quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' ``histogram_quantile`` on cumulative ``(le, count)`` pairs sorted by ``le``.

    Linear inside the bucket where the rank falls (the first bucket starts at 0 when its bound is
    positive); a rank in the ``+Inf`` bucket answers the highest finite bound. NaN without data.
    """
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    total = buckets[-1][1]
    rank = q * total
    lower_le, lower_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower_le
            if count == lower_count:
                return le
            lo = lower_le if lower_le < le else (0.0 if le > 0 else le)
            return lo + (le - lo) * (rank - lower_count) / (count - lower_count)
        lower_le, lower_count = le, count
    return lower_le


def _label_key(labels: dict[str, str], drop: set[str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in drop))


def _track_name(family: str, kind: str, labels: tuple[tuple[str, str], ...]) -> str:
    suffix = {"gauge": "", "rate": " /s", "mean": " mean", "p50": " p50", "p99": " p99"}[kind]
    label_text = f" {{{','.join(f'{k}={v}' for k, v in labels)}}}" if labels else ""
    return f"{family}{suffix}{label_text}"


def constant_labels(series: list[SeriesDef]) -> set[str]:
    """Labels with one value wherever they appear in a source's series (``model_name``, a lone
    ``engine``): they say nothing a track name needs. Wherever, not in every series: a real vLLM's
    page also carries prometheus_client's own ``process_*`` / ``python_gc_*`` series, which have no
    ``model_name`` at all."""
    values: dict[str, set[str]] = {}
    for s in series:
        for k, v in s.labels.items():
            values.setdefault(k, set()).add(v)
    return {k for k, vs in values.items() if len(vs) == 1}


def source_tracks(file: SamplesFile, src: int) -> list[Track]:
    """Every counter track of one source of a samples file."""
    series = [s for s in file.series.values() if s.src == src]
    drop = constant_labels(series) | {"le"}
    samples = [s for s in file.samples if s.src == src]
    tracks: dict[tuple[str, str, tuple[tuple[str, str], ...]], Track] = {}

    def track(family: str, kind: str, labels: tuple[tuple[str, str], ...]) -> Track:
        key = (family, kind, labels)
        t = tracks.get(key)
        if t is None:
            t = tracks[key] = Track(src, _track_name(family, kind, labels), family, kind, dict(labels))
        return t

    hist: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, list[SeriesDef]]] = {}
    for s in series:
        part = _hist_part(s)
        if part is not None:
            hist.setdefault((s.family, _label_key(s.labels, drop)), {}).setdefault(part, []).append(s)
    prev_t: int | None = None
    prev: dict[int, float] = {}
    for sample, now in snapshots(samples):
        for s in series:
            if _hist_part(s) is not None or s.id not in now:
                continue
            labels = _label_key(s.labels, drop)
            if _is_counter(s):
                if prev_t is not None and s.id in prev and sample.t > prev_t:
                    dt_s = (sample.t - prev_t) / 1e9
                    track(s.family, "rate", labels).add(prev_t, rate(prev[s.id], now[s.id], dt_s))
            else:
                track(s.family, "gauge", labels).add(sample.t, now[s.id])
        if prev_t is not None:
            for (family, labels), parts in hist.items():
                _histogram_interval(parts, prev, now, prev_t, _bound(track, family, labels))
        prev_t, prev = sample.t, dict(now)
    for t in tracks.values():  # a rate's last interval ends at the last sample: close it there
        if t.kind == "rate" and t.points and prev_t is not None and t.points[-1][0] < prev_t:
            t.points.append((prev_t, 0.0))
    return [t for t in tracks.values() if t.points]


def _bound(
    track: Callable[[str, str, tuple[tuple[str, str], ...]], Track],
    family: str,
    labels: tuple[tuple[str, str], ...],
) -> Callable[[str], Track]:
    return lambda kind: track(family, kind, labels)


def _delta(prev: dict[int, float], now: dict[int, float], s: SeriesDef, reset: bool) -> float:
    cur = now.get(s.id, 0.0)
    return cur if reset else cur - prev.get(s.id, 0.0)


def _histogram_interval(
    parts: dict[str, list[SeriesDef]],
    prev: dict[int, float],
    now: dict[int, float],
    t: int,
    track: Callable[[str], Track],
) -> None:
    counts, sums, buckets = parts.get("_count", []), parts.get("_sum", []), parts.get("_bucket", [])
    if not counts or counts[0].id not in now:
        return
    c = counts[0]
    reset = now[c.id] < prev.get(c.id, 0.0)
    n = _delta(prev, now, c, reset)
    if n <= 0:
        return
    if sums and sums[0].id in now:
        track("mean").add(t, _delta(prev, now, sums[0], reset) / n)
    bounds = [(_le(b), b) for b in buckets if b.id in now]
    cumulative = sorted((le, _delta(prev, now, b, reset)) for le, b in bounds if not math.isnan(le))
    if cumulative:
        for q in QUANTILES:
            track(f"p{round(q * 100)}").add(t, quantile(q, cumulative))


def _le(s: SeriesDef) -> float:
    raw = s.labels.get("le", "")
    try:
        return float(raw)
    except ValueError:
        return math.nan
