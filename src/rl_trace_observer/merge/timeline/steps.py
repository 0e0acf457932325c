"""Step windows from step-marker spans: ONE rule for the merge (span shards' ``step``, ``--step``,
``--split-steps``, views), the report (``analysis.report.windows.step_windows`` calls it) and the
report's SQL tables, so a row's step is the step the report gives it. The markers themselves are a
format's to find (``MarksSteps.step_markers``: RL-Insight's event logs, :mod:`..formats.rl_insight.markers`;
a profiler trace's CPU ranges of these names, ``ProfilerStep#N`` mostly, :mod:`..formats.kineto.markers`).

A marker is a span whose whole name is one of :data:`STEP_MARKERS`, in preference order: a
``global_step`` span (the VERL integration and the demo write one per training step), else VERL's
``train_batch`` annotation, else NeMo-RL's ``rl.<algo>.step`` (its OTLP spans, and its Perfetto
tracer's step events joined into spans by that reader), else torch.profiler's ``ProfilerStep#N``
(``prof.step()``: a trace without RL-Insight spans). The first kind the trace has wins (the
report's stage table lists the same rows in the same order). A marker states its step by a ``step``
(``global_step``, ``global_steps``, NeMo-RL's ``rl.iteration`` / ``rl.step``) argument, else by its
name (``ProfilerStep#12``). When every marker states one
step, markers group by it (per-rank copies of a step join, the next step of a rank that runs ahead
stays apart); otherwise overlapping markers join. A window's number is the step its markers state
when every window has exactly one and they differ, else 1, 2, ... in time order. Traces without
markers get no windows here.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

# (pattern, why): searched case-insensitively in the whole name, as the report's stage table does
STEP_MARKERS: tuple[tuple[str, str], ...] = (
    (r"^global_step$", "one span per training step (the VERL integration's step marker)"),
    (r"^train_batch$", "VERL's per-step annotation; windows when there is no global_step"),
    (r"^rl\.[a-z0-9_]+\.step$", "NeMo-RL's step spans (nemo-lens rl.<algo>.step; its Perfetto tracer's)"),
    (r"^ProfilerStep\s*#\s*\d+$", "torch.profiler's prof.step() ranges: steps of a profiler-only trace"),
)
NAMED_MARKERS = ("global_step", "train_batch")  # the rows above that are one plain name
STEP_KEYS = ("step", "global_step", "global_steps", "rl.iteration", "rl.step")
_COMPILED = tuple(re.compile(pattern, re.IGNORECASE) for pattern, _ in STEP_MARKERS)
_NUMBERED = re.compile(r"^ProfilerStep\s*#\s*(\d+)$", re.IGNORECASE)


@dataclass(frozen=True)
class Marker:
    priority: int  # 0 = the preferred kind of marker (its row in STEP_MARKERS)
    start_ns: int
    end_ns: int
    numbers: frozenset[int]  # the steps its arguments name, else the one its name states
    profiled: bool = False
    mode: str | None = None

    @property
    def stated(self) -> int | None:
        """The one step this marker states, else None."""
        return next(iter(self.numbers)) if len(self.numbers) == 1 else None


@dataclass(frozen=True)
class StepWindow:
    step: int
    start_ns: int
    end_ns: int
    profiled: bool = False
    mode: str | None = None


@functools.lru_cache(maxsize=4096)
def marker_priority(name: str) -> int | None:
    """The row of :data:`STEP_MARKERS` that ``name`` matches (0 = preferred), None if not a marker."""
    for rank, regex in enumerate(_COMPILED):
        if regex.search(name):
            return rank
    return None


def marker_number(name: str) -> int | None:
    """The step number a marker's name states (``ProfilerStep#12`` → 12), else None."""
    m = _NUMBERED.match(name)
    return int(m.group(1)) if m else None


def step_numbers(args: dict[str, Any]) -> frozenset[int]:
    """The steps a marker's arguments name (ints, or integral floats or strings)."""
    return frozenset(n for k in STEP_KEYS if (n := as_int(args.get(k))) is not None)


def as_int(value: Any) -> int | None:
    """An int, or an integral float or string, as an int; else None (bools too)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str | float):
        try:
            number = float(value)
        except ValueError:
            return None
        return int(number) if number.is_integer() else None
    return None


def truthy(value: Any) -> bool:
    return value is True or value == 1 or (isinstance(value, str) and value.lower() in ("true", "1"))


def marker(name: str, start_ns: int, end_ns: int, args: dict[str, Any]) -> Marker | None:
    """The marker a span of this name is (None: not a marker)."""
    priority = marker_priority(name)
    if priority is None:
        return None
    numbers = step_numbers(args)
    if not numbers and (n := marker_number(name)) is not None:
        numbers = frozenset((n,))
    modes = {str(args.get("mode") or args.get("trainer_mode") or "")} - {""}
    mode = modes.pop() if modes else None
    return Marker(priority, start_ns, end_ns, numbers, truthy(args.get("profiled")), mode)


def chosen(markers: list[Marker]) -> list[Marker]:
    """The markers of the preferred kind the trace has, in time order."""
    if not markers:
        return []
    best = min(m.priority for m in markers)
    return sorted((m for m in markers if m.priority == best), key=lambda m: m.start_ns)


def windows_from_markers(markers: list[Marker]) -> list[StepWindow]:
    """The step windows of the module docstring, in time order."""
    picked = chosen(markers)
    groups: list[list[Marker]] = []
    if picked and all(m.stated is not None for m in picked):  # group by the step each one states
        by: dict[int | None, list[Marker]] = {}
        for m in picked:
            by.setdefault(m.stated, []).append(m)
        groups = list(by.values())  # in order of their first marker's start
    else:
        for m in picked:
            if groups and m.start_ns < max(x.end_ns for x in groups[-1]):
                groups[-1].append(m)
            else:
                groups.append([m])
    numbers = []
    for g in groups:
        found = {n for m in g for n in m.numbers}
        numbers.append(found.pop() if len(found) == 1 else None)
    usable = None not in numbers and len(set(numbers)) == len(numbers)
    out = []
    for i, g in enumerate(groups):
        modes = {m.mode for m in g} - {None}
        step = numbers[i] if usable else i + 1
        assert step is not None
        out.append(
            StepWindow(
                step,
                min(m.start_ns for m in g),
                max(m.end_ns for m in g),
                any(m.profiled for m in g),
                modes.pop() if len(modes) == 1 else None,
            )
        )
    return out
