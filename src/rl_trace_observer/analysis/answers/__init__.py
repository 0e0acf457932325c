"""Answers on top of the timeline: idle time with a cause and goodput (:mod:`.idle`), stragglers by
arrival (:mod:`.arrivals`), the critical path with what-ifs (:mod:`.critical_path`), VERL's own timing
metrics against the spans (:mod:`.verl_metrics`), on interval arithmetic (:mod:`.intervals`).

Each answer is a pure function of the same flat input (:mod:`.model`: stage spans and step windows),
so the report (which shows them), tests with hand-built rows and ``rl-trace sql``
(:mod:`..query.sql`) all agree. Nothing here imports the report.
"""

from __future__ import annotations

from typing import Any

from .arrivals import arrivals
from .critical_path import critical_paths
from .idle import idle_and_goodput
from .model import Lane, StepWindow, WorkSpan, by_lane

__all__ = ["StepWindow", "WorkSpan", "answer_sections"]


def answer_sections(
    spans: list[WorkSpan], windows: list[StepWindow], lanes: dict[Lane, list[WorkSpan]] | None = None
) -> dict[str, Any]:
    """The report keys ``idle``, ``goodput``, ``arrivals`` and ``critical_path``; ``lanes``:
    ``by_lane(spans)`` where the caller has it (the report's stage index groups its rows so)."""
    lanes = by_lane(spans) if lanes is None else lanes  # grouped once for both (1M rows: 0.3 s)
    out = idle_and_goodput(spans, windows, lanes)
    out["arrivals"] = arrivals(spans, windows, lanes)
    out["critical_path"] = critical_paths(spans, windows)
    return out
