"""``rl-trace diff A B``: per stage and role, how much time per step changed, against the noise.

Inputs are report summaries (``rl-trace report --json``) or anything the report reads (a merged
trace, span shards, a run directory). Series, one value per step:

- ``step``: the step's wall time;
- ``<role>/<category>``: the role's mean time per lane in that category (``idle`` included) — the
  report's ``steps[].roles[].mean_ns``;
- ``<role>/gpu_busy``, ``gpu_compute``, ``gpu_comm``, ``gpu_memory``, ``gpu_idle``: the mean per GPU of
  the role of the report's ``gpu.rows`` of the step (:mod:`..gpu.answers`);
- from the metric sampler (the report's ``telemetry``), when both runs have it:
  ``engine/running`` and ``engine/waiting`` (mean over replicas of the time-weighted mean, requests),
  ``engine/kv_cache_max`` (highest over replicas, fraction), ``engine/generation_tokens_per_s`` and
  ``engine/prompt_tokens_per_s`` (summed over replicas), ``engine/preemptions`` (summed);
  ``gpu_util/<role>/<stage>`` (%), ``gpu_memory_used/<role>/<stage>`` (bytes), ``host_cpu/<role>/<stage>``
  (%). Their category is the part before the first ``/`` (``gpu_util<-10%`` gates every role's).

Every row has ``unit`` and ``a``/``b``/``delta``/``noise`` in it; time series also keep their
``*_ns`` fields.

Per series: the mean over steps of A and of B, ``delta_ns`` = B − A, ``delta_pct`` against A, and a
noise band ``noise_ns`` = 2·√(s²_A/n_A + s²_B/n_B) (:mod:`..report.noise`, which the watch's alert
uses too) from the step-to-step spread (s: the sample standard deviation; 0 with one step): a
change inside it is ``within_noise``; ``noise_known`` is false when a side has exactly one step (no
spread, no band: the verdict is then ``no band``, or ``same`` for an exact tie). Rows are ranked by
how far the change is outside the band, then by size.

Thresholds (``--fail-if``): ``KEY OP VALUE`` — KEY a series (``step``, ``trainer/update``) or a
category (``update``: every role's), OP ``>`` or ``<``, VALUE a signed number with ``%``, ``ns``,
``us``, ``ms`` or ``s``: ``update>+10%``, ``step>+50ms``, ``rollout/generation<-20%``.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..gpu.answers import gpu_series
from ..report.noise import noise_band

SCHEMA = "rl-trace-diff/1"
_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_EXPR = re.compile(r"^\s*([A-Za-z_][\w./-]*)\s*([<>])\s*([+-]?\d+(?:\.\d+)?)\s*(%|ns|us|µs|ms|s)\s*$")


class DiffError(ValueError):
    """A bad input or threshold; the message says which and how to fix it."""


class ThresholdError(DiffError):
    """A ``--fail-if`` expression that cannot be read or names no series (a usage error)."""


def load_summary(path: str | Path) -> dict[str, Any]:
    """A report summary: a report JSON as is, else the report of ``path`` (computed now)."""
    p = Path(path)
    if p.is_file() and p.name.endswith(".json") and not p.name.endswith(".manifest.json"):
        try:
            doc = orjson.loads(p.read_bytes())
        except orjson.JSONDecodeError:
            doc = None
        if isinstance(doc, dict) and str(doc.get("schema", "")).startswith("rl-trace-report/"):
            return doc
    from ..report.inputs import InputError
    from ..report.load import TraceError
    from ..report.output import summarize

    try:
        return summarize(p)
    except (InputError, TraceError) as exc:
        raise DiffError(str(exc)) from None


def series(summary: dict[str, Any], skip_first: int = 0) -> dict[str, list[float]]:
    """One value per step for every time series of the module docstring (ns)."""
    out: dict[str, list[float]] = {}
    steps = (summary.get("steps") or [])[skip_first:]
    for st in steps:
        out.setdefault("step", []).append(float(st["dur_ns"]))
        for role in st.get("roles") or []:
            for cat, ns in (role.get("mean_ns") or {}).items():
                out.setdefault(f"{role['role']}/{cat}", []).append(float(ns))
    out.update(gpu_series(summary, [st["step"] for st in steps]))
    return out


_ENGINE = (  # series, report field, how replicas combine, unit
    ("running", "running_mean", "mean", "requests"),
    ("waiting", "waiting_mean", "mean", "requests"),
    ("kv_cache_max", "kv_cache_max", "max", "fraction"),
    ("generation_tokens_per_s", "generation_tokens_per_s", "sum", "tokens/s"),
    ("prompt_tokens_per_s", "prompt_tokens_per_s", "sum", "tokens/s"),
    ("preemptions", "preemptions", "sum", "count"),
)


def telemetry_series(summary: dict[str, Any], skip_first: int = 0) -> dict[str, tuple[str, list[float]]]:
    """The sampler's series of the module docstring: key → (unit, one value per step)."""
    tel = summary.get("telemetry") or {}
    steps = [st.get("step") for st in (summary.get("steps") or [])[skip_first:]]
    keep = set(steps)
    out: dict[str, tuple[str, list[float]]] = {}
    by_step: dict[Any, list[dict[str, Any]]] = {}
    for r in tel.get("engines") or []:
        by_step.setdefault(r.get("step"), []).append(r)
    for name, field_, how, unit in _ENGINE:
        values = []
        for step in steps:
            got = [float(r[field_]) for r in by_step.get(step, []) if r.get(field_) is not None]
            if got:
                values.append(max(got) if how == "max" else sum(got) / (len(got) if how == "mean" else 1))
        if values:
            out[f"engine/{name}"] = (unit, values)
    for section, key, field_, unit in (
        ("gpus", "gpu_util", "mean", "%"),
        ("gpus", "gpu_memory_used", "memory_max_bytes", "bytes"),  # not gpu_memory: the kernels' time
        ("host_cpu", "host_cpu", "mean", "%"),
    ):
        for r in tel.get(section) or []:
            if r.get("step") in keep and r.get(field_) is not None:
                out.setdefault(f"{key}/{r['role']}/{r['stage']}", (unit, []))[1].append(float(r[field_]))
    return out


def _stats(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _row(key: str, unit: str, va: list[float], vb: list[float]) -> dict[str, Any] | None:
    (ma, da), (mb, db) = _stats(va), _stats(vb)
    na, nb = len(va), len(vb)
    noise = noise_band(da, na, db, nb)
    delta = mb - ma
    if ma == 0 and mb == 0:
        return None
    if unit == "ns":
        role, _, cat = key.partition("/")
        row: dict[str, Any] = {"key": key, "role": role if cat else None, "category": cat or "step"}
        row.update(a_ns=round(ma), b_ns=round(mb), delta_ns=round(delta))
    else:  # a sampler series: <category>/<role>/<stage> or engine/<name>
        parts = key.split("/")
        role = parts[1] if parts[0] != "engine" and len(parts) > 2 else None
        row = {"key": key, "role": role, "category": parts[0] if parts[0] != "engine" else key}
    row.update(
        unit=unit,
        a=round(ma, 6),
        b=round(mb, 6),
        delta=round(delta, 6),
        delta_pct=round(100.0 * delta / ma, 2) if ma else None,
        noise=round(noise, 6),
        within_noise=abs(delta) <= noise,
        noise_known=na != 1 and nb != 1,  # every side with steps has a spread
        a_steps=na,
        b_steps=nb,
    )
    if unit == "ns":
        row["noise_ns"] = round(noise)
    return row


def _rank(r: dict[str, Any]) -> tuple[float, float, str]:
    """How far outside its noise band (then how large) a change is: the table's order."""
    floor = 1.0 if r["unit"] == "ns" else 1e-9
    return (-(abs(r["delta"]) / max(r["noise"], floor)), -abs(r["delta"]), r["key"])


def compare(a: dict[str, Any], b: dict[str, Any], *, skip_first: int = 0) -> dict[str, Any]:
    for side, summary in (("A", a), ("B", b)):
        n = len(summary.get("steps") or [])
        if skip_first and n and skip_first >= n:
            raise DiffError(
                f"--skip-first {skip_first} leaves no step of {side} ({n} step(s)): "
                f"use --skip-first {n - 1} or less"
            )
    sa, sb = series(a, skip_first), series(b, skip_first)
    rows = [
        r for key in sorted(set(sa) | set(sb)) if (r := _row(key, "ns", sa.get(key, []), sb.get(key, [])))
    ]
    ta, tb = telemetry_series(a, skip_first), telemetry_series(b, skip_first)
    for key in sorted(set(ta) & set(tb)):  # only what both runs sampled
        r = _row(key, ta[key][0], ta[key][1], tb[key][1])
        if r is not None:
            rows.append(r)
    rows.sort(key=_rank)
    return {
        "schema": SCHEMA,
        "a": (a.get("source") or {}).get("path"),
        "b": (b.get("source") or {}).get("path"),
        "skip_first": skip_first,
        "rows": rows,
        # span shard parts a side was read without (damaged): its figures cover the other parts
        "incomplete": [n for s in (a, b) if (n := (s.get("source") or {}).get("missing_note"))],
    }


@dataclass(frozen=True)
class Threshold:
    text: str
    key: str
    op: str
    value: float
    unit: str

    @classmethod
    def parse(cls, text: str) -> Threshold:
        m = _EXPR.match(text)
        if not m:
            raise ThresholdError(
                f"--fail-if {text!r}: expected KEY>VALUE or KEY<VALUE with a unit, "
                "e.g. 'update>+10%', 'step>+50ms', 'trainer/idle<-5%'"
            )
        return cls(text.strip(), m.group(1), m.group(2), float(m.group(3)), m.group(4))

    def matches(self, row: dict[str, Any]) -> bool:
        return self.key in (row["key"], row["category"])

    def tripped(self, row: dict[str, Any]) -> bool:
        if self.unit == "%":
            got = row["delta_pct"]
            if got is None:  # from zero: any growth is infinite
                got = math.inf if row["delta"] > 0 else (-math.inf if row["delta"] < 0 else 0.0)
            limit = self.value
        elif row.get("unit", "ns") != "ns":
            raise ThresholdError(
                f"--fail-if {self.text!r}: {row['key']} is in {row['unit']}, not time; use a % threshold"
            )
        else:
            got, limit = row["delta_ns"], self.value * _UNITS[self.unit]
        return got > limit if self.op == ">" else got < limit


def check(result: dict[str, Any], thresholds: list[Threshold]) -> list[str]:
    """One line per tripped threshold (empty: the gate passes). A key no row has is an error."""
    failures = []
    for t in thresholds:
        rows = [r for r in result["rows"] if t.matches(r)]
        if not rows:
            known = sorted({r["key"] for r in result["rows"]} | {r["category"] for r in result["rows"]})
            raise ThresholdError(f"--fail-if {t.text!r}: no series {t.key!r}; known: {', '.join(known)}")
        for r in rows:
            if t.tripped(r):
                failures.append(f"{r['key']} {describe(r)} (threshold {t.text})")
    return failures


def describe(row: dict[str, Any]) -> str:
    pct = f"{row['delta_pct']:+.1f} %" if row["delta_pct"] is not None else "new"
    if row.get("unit", "ns") != "ns":
        return f"{pct}: {row['a']:.4g} → {row['b']:.4g} {row['unit']} per step (noise ±{row['noise']:.3g})"
    return (
        f"{pct}: {row['a_ns'] / 1e6:.1f} ms → {row['b_ns'] / 1e6:.1f} ms per step "
        f"(noise ±{row['noise_ns'] / 1e6:.1f} ms)"
    )
