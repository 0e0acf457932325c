"""``rl-trace diff A B``: per stage and role, how much time per step changed, against the noise.

Inputs are report summaries (``rl-trace report --json``) or anything the report reads (a merged
trace, span shards, a run directory). Series, one value per step:

- ``step``: the step's wall time;
- ``<role>/<category>``: the role's mean time per lane in that category (``idle`` included) — the
  report's ``steps[].roles[].mean_ns``;
- ``<role>/gpu_busy``, ``gpu_compute``, ``gpu_comm``, ``gpu_memory``, ``gpu_idle``: the mean per GPU of
  the role of the report's ``gpu.rows`` of the step (:mod:`..gpu.answers`).

Per series: the mean over steps of A and of B, ``delta_ns`` = B − A, ``delta_pct`` against A, and a
noise band ``noise_ns`` = 2·√(s²_A/n_A + s²_B/n_B) from the step-to-step spread (s: the sample
standard deviation; 0 with one step): a change inside it is ``within_noise``; ``noise_known`` is
false when a side has exactly one step (no spread, no band: the verdict is then ``no band``, or ``same`` for
an exact tie). Rows are ranked by how far the change is outside the band, then by size.

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
    """One value per step for every series of the module docstring."""
    out: dict[str, list[float]] = {}
    steps = (summary.get("steps") or [])[skip_first:]
    for st in steps:
        out.setdefault("step", []).append(float(st["dur_ns"]))
        for role in st.get("roles") or []:
            for cat, ns in (role.get("mean_ns") or {}).items():
                out.setdefault(f"{role['role']}/{cat}", []).append(float(ns))
    out.update(gpu_series(summary, [st["step"] for st in steps]))
    return out


def _stats(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def compare(a: dict[str, Any], b: dict[str, Any], *, skip_first: int = 0) -> dict[str, Any]:
    for side, summary in (("A", a), ("B", b)):
        n = len(summary.get("steps") or [])
        if skip_first and n and skip_first >= n:
            raise DiffError(
                f"--skip-first {skip_first} leaves no step of {side} ({n} step(s)): "
                f"use --skip-first {n - 1} or less"
            )
    sa, sb = series(a, skip_first), series(b, skip_first)
    rows = []
    for key in sorted(set(sa) | set(sb)):
        (ma, da), (mb, db) = _stats(sa.get(key, [])), _stats(sb.get(key, []))
        na, nb = len(sa.get(key, [])), len(sb.get(key, []))
        noise = 2 * math.sqrt((da * da / na if na else 0.0) + (db * db / nb if nb else 0.0))
        delta = mb - ma
        if ma == 0 and mb == 0:
            continue
        role, _, cat = key.partition("/")
        rows.append(
            {
                "key": key,
                "role": role if cat else None,
                "category": cat or "step",
                "a_ns": round(ma),
                "b_ns": round(mb),
                "delta_ns": round(delta),
                "delta_pct": round(100.0 * delta / ma, 2) if ma else None,
                "noise_ns": round(noise),
                "within_noise": abs(delta) <= noise,
                "noise_known": na != 1 and nb != 1,  # every side with steps has a spread
                "a_steps": na,
                "b_steps": nb,
            }
        )
    rows.sort(key=lambda r: (-(abs(r["delta_ns"]) / max(r["noise_ns"], 1)), -abs(r["delta_ns"]), r["key"]))
    return {
        "schema": SCHEMA,
        "a": (a.get("source") or {}).get("path"),
        "b": (b.get("source") or {}).get("path"),
        "skip_first": skip_first,
        "rows": rows,
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
                got = math.inf if row["delta_ns"] > 0 else (-math.inf if row["delta_ns"] < 0 else 0.0)
            limit = self.value
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
    return (
        f"{pct}: {row['a_ns'] / 1e6:.1f} ms → {row['b_ns'] / 1e6:.1f} ms per step "
        f"(noise ±{row['noise_ns'] / 1e6:.1f} ms)"
    )
