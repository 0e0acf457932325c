"""Step windows: where each step starts and ends, from the step markers — by the merge's rule
(:mod:`rl_trace_observer.merge.timeline.steps`), so span shards, ``--step`` views and the SQL tables
give a row the step the report gives it. Per process, its own markers say which step its kernels
were launched in (:func:`process_windows`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ...merge.timeline.steps import Marker, marker, windows_from_markers
from .load import Span

__all__ = ["Window", "process_windows", "step_windows"]


@dataclass
class Window:
    step: int | None
    start_ns: int
    end_ns: int
    profiled: bool = False
    mode: str | None = None


def _markers(spans: list[Span]) -> list[tuple[Marker, Span]]:
    return [(m, s) for s in spans if (m := marker(s.name, s.start_ns, s.end_ns, s.args)) is not None]


def step_windows(markers: list[Span]) -> list[Window]:
    """Windows from the preferred kind of step marker (the module docstring's rule)."""
    found = [m for m, _ in _markers(markers)]
    return [Window(w.step, w.start_ns, w.end_ns, w.profiled, w.mode) for w in windows_from_markers(found)]


def process_windows(markers: list[Span], windows: list[Window]) -> dict[Any, list[tuple[int, int, int]]]:
    """Per process, its own markers' spans as (start, end, window index): a kernel's step is the
    step its own rank was in when it launched it (HTA's per-rank iterations), where ranks mark steps."""
    index = {w.step: i for i, w in enumerate(windows) if w.step is not None}
    found = _markers(markers)
    if not found:
        return {}
    best = min(m.priority for m, _ in found)
    out: dict[Any, list[tuple[int, int, int]]] = defaultdict(list)
    for m, span in found:
        if m.priority == best and (n := m.stated) in index:
            out[span.pid].append((m.start_ns, m.end_ns, index[n]))
    return {pid: sorted(v) for pid, v in out.items()}
