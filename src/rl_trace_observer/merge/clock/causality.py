"""Causality checks on corrected events: structure in the data that a wrong clock would break.

A clock correction can only be trusted as far as the data agrees with it. Three checks use
structure that is there anyway, on normalised merge events (docs/FORMATS.md §3: ``ph``, ``name``,
``pid``, ``tid``, ``ts_ns``, ``dur_ns``) after correction:

- ``check_durations``: no complete event has a negative duration (a correction that is not
  monotonic, e.g. across a wall-clock jump, would produce one);
- ``check_nesting``: on one thread, a span that starts inside another ends inside it (Perfetto
  itself rejects partially overlapping slices on a thread);
- ``check_stage_alignment``: in one process, a stage recorded by two sources (an RL-Insight
  ``actor_update`` span and the Torch trace's region of the same name) must nest, one inside the
  other, within the tolerance — the two sources can disagree only by the clock error between them.

Each returns a ``CausalityReport``; ``ClockPlan.add_causality(report)`` folds it into the manifest.
Only the first ``MAX_DETAILED`` failures of a report get their own problem line.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_DETAILED = 20


@dataclass
class CausalityReport:
    """How many relations were checked, how many failed, and one ``clock`` problem per failure."""

    checked: int = 0
    failed: int = 0
    problems: list[dict[str, Any]] = field(default_factory=list)

    def fail(self, detail: str, path: str | None) -> None:
        self.failed += 1
        if self.failed <= MAX_DETAILED:
            self.problems.append({"kind": "clock", "path": path, "detail": detail})
        elif self.failed == MAX_DETAILED + 1:
            self.problems.append(
                {"kind": "clock", "path": path, "detail": "more causality failures; see clock.causality"}
            )


@dataclass(frozen=True, slots=True)
class _Span:
    name: str
    start: int
    end: int
    pid: Any
    tid: Any


def _spans(events: Iterable[Mapping[str, Any]]) -> list[_Span]:
    out = []
    for e in events:
        ts, dur = e.get("ts_ns"), e.get("dur_ns")
        if e.get("ph") == "X" and isinstance(ts, int) and isinstance(dur, int):
            out.append(_Span(str(e.get("name")), ts, ts + dur, e.get("pid"), e.get("tid")))
    return out


def check_durations(events: Iterable[Mapping[str, Any]], *, path: str | None = None) -> CausalityReport:
    """Every complete event keeps a non-negative duration after correction."""
    report = CausalityReport()
    for s in _spans(events):
        report.checked += 1
        if s.end < s.start:
            report.fail(
                f"{s.name!r} (pid {s.pid}, tid {s.tid}) has a negative duration {s.end - s.start} ns", path
            )
    return report


def check_nesting(
    events: Iterable[Mapping[str, Any]], tolerance_ns: int, *, path: str | None = None
) -> CausalityReport:
    """Children inside parents, per (pid, tid): a span starting inside another must end inside it.

    Spans that touch within ``tolerance_ns`` count as siblings, so rounding never fails the check.
    """
    report = CausalityReport()
    tracks: dict[tuple[Any, Any], list[_Span]] = defaultdict(list)
    for s in _spans(events):
        tracks[(s.pid, s.tid)].append(s)
    for spans in tracks.values():
        spans.sort(key=lambda s: (s.start, -(s.end - s.start)))
        stack: list[_Span] = []
        for s in spans:
            while stack and stack[-1].end <= s.start + tolerance_ns:
                stack.pop()
            if stack:
                parent = stack[-1]
                report.checked += 1
                if s.end > parent.end + tolerance_ns:
                    report.fail(
                        f"{s.name!r} (pid {s.pid}, tid {s.tid}) starts inside {parent.name!r} but ends "
                        f"{(s.end - parent.end) / 1000:.1f} µs after it",
                        path,
                    )
                    continue  # do not let a broken span become everyone's parent
            stack.append(s)
    return report


def _nesting_gap(a: _Span, b: _Span) -> int:
    """The smallest shift of ``b`` that puts one span inside the other (0 when they already nest)."""
    b_in_a = max(a.start - b.start, b.end - a.end, 0) if (b.end - b.start) <= (a.end - a.start) else None
    a_in_b = max(b.start - a.start, a.end - b.end, 0) if (a.end - a.start) <= (b.end - b.start) else None
    return min(g for g in (b_in_a, a_in_b) if g is not None)


def check_stage_alignment(
    spans: Iterable[Mapping[str, Any]],
    regions: Iterable[Mapping[str, Any]],
    tolerance_ns: int,
    *,
    edges: bool = False,
    path: str | None = None,
) -> CausalityReport:
    """Each region (e.g. Torch) must nest with the same-named span (e.g. RL-Insight) of one process.

    The partner is the same-named span that overlaps the region most, else the nearest one. With
    ``edges=True`` both starts and both ends must also agree within ``tolerance_ns`` (use it when
    the two sources record the very same call).
    """
    by_name: dict[str, list[_Span]] = defaultdict(list)
    for s in _spans(spans):
        by_name[s.name].append(s)
    report = CausalityReport()
    for r in _spans(regions):
        candidates = by_name.get(r.name)
        if not candidates:
            continue

        def rank(s: _Span, r: _Span = r) -> tuple[int, int]:
            overlap = min(s.end, r.end) - max(s.start, r.start)
            return (overlap, -abs(s.start - r.start))

        partner = max(candidates, key=rank)
        report.checked += 1
        gap = _nesting_gap(partner, r)
        if edges:
            gap = max(gap, abs(partner.start - r.start), abs(partner.end - r.end))
        if gap > tolerance_ns:
            report.fail(
                f"pid {r.pid}: stage {r.name!r} in two sources is {gap / 1000:.1f} µs apart "
                f"(tolerance {tolerance_ns / 1000:.0f} µs): clock correction or capture is wrong",
                path,
            )
    return report
