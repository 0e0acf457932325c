"""Step windows from step-marker spans: ONE rule for the merge (span shards' ``step``, ``--step``,
``--split-steps``, views) and the report (``analysis.report.compute.step_windows`` calls it), so a
row's step is the step the report gives it. The markers themselves are a format's to find
(``Format.step_markers``: RL-Insight's event logs, :mod:`..formats.rl_insight.markers`).

A marker is a ``global_step`` span (the VERL integration and the demo write one per training step),
else VERL's ``train_batch`` annotation: the first name in :data:`STEP_MARKERS` that the trace has
wins (the report's stage table lists the same two names in the same order). Overlapping markers of
that name join (per-rank copies); their step number is the ``step`` (``global_step``,
``global_steps``) argument when every window has exactly one and they differ, else 1, 2, ... in time
order. Traces without markers (plain profiler files) get no windows here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

STEP_MARKERS = ("global_step", "train_batch")  # preference order
STEP_KEYS = ("step", "global_step", "global_steps")


@dataclass(frozen=True)
class Marker:
    priority: int  # 0 = the preferred kind of marker
    start_ns: int
    end_ns: int
    numbers: frozenset[int]  # the step numbers its arguments name (one, when they agree)
    profiled: bool = False
    mode: str | None = None


@dataclass(frozen=True)
class StepWindow:
    step: int
    start_ns: int
    end_ns: int
    profiled: bool = False
    mode: str | None = None


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


def marker(priority: int, start_ns: int, end_ns: int, args: dict[str, Any]) -> Marker:
    modes = {str(args.get("mode") or args.get("trainer_mode") or "")} - {""}
    mode = modes.pop() if modes else None
    return Marker(priority, start_ns, end_ns, step_numbers(args), truthy(args.get("profiled")), mode)


def windows_from_markers(markers: list[Marker]) -> list[StepWindow]:
    """The step windows of the module docstring, in time order."""
    if not markers:
        return []
    best = min(m.priority for m in markers)
    chosen = sorted((m for m in markers if m.priority == best), key=lambda m: m.start_ns)
    groups: list[list[Marker]] = []
    for m in chosen:
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
