"""The one place the pipeline asks for clock corrections (implemented in :mod:`.clock_align`).

Each artifact gets ONE ``ts_ns -> ts_ns`` correction, chosen by its owning process (every source
of a host shares its host's clock), applied by the ``correct_time`` pass. A constant offset stays a
plain integer so the pass is one addition per event; anything else travels to the worker as the
correction object itself (picklable), never as a closure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .model import Problem, ProcessKey
from .passes import IDENTITY, TimeCorrection
from .planning import Plan


@dataclass
class ClockChoice:
    section: dict[str, Any] = field(default_factory=lambda: {"mode": "wall"})
    problems: list[Problem] = field(default_factory=list)
    _plan: Any = None

    def correction_for(self, key: ProcessKey | None) -> TimeCorrection:
        if self._plan is None or key is None:
            return IDENTITY
        corr = self._plan.correction_for(key.host, key.pid if key.pid >= 0 else None)
        const = getattr(corr, "constant_ns", None)
        if const is not None:
            return IDENTITY if const == 0 else TimeCorrection(offset_ns=-int(const), method=self._plan.mode)
        return TimeCorrection(fn=corr, method=self._plan.mode)


def clock_plan(plan: Plan, mode: str, tolerance_us: float = 1000.0) -> ClockChoice:
    records = [p.record for p in plan.processes.values() if p.record]
    try:
        from .clock_align import plan as align
    except ImportError:  # clock alignment not installed in this build: raw wall clocks
        return ClockChoice()
    cp = align(records, mode=mode, tolerance_us=tolerance_us)
    problems = [
        Problem("clock", str(p.get("path") or p.get("host") or "(clock)"), str(p.get("detail", "")))
        for p in cp.problems
    ]
    return ClockChoice(cp.manifest_section(), problems, cp)
