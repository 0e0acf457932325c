"""Step windows: where each step starts and ends, from the step markers (:mod:`.stages`).

Markers that state their step (an arg, or ``ProfilerStep#N``) group by it; per process, its own
markers say which step its kernels were launched in (:func:`process_windows`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from .load import Span
from .stages import marker_number, marker_priority

__all__ = ["STEP_KEYS", "Window", "process_windows", "step_windows"]

STEP_KEYS = ("step", "global_step", "global_steps")


@dataclass
class Window:
    step: int | None
    start_ns: int
    end_ns: int
    profiled: bool = False
    mode: str | None = None


def _int(value: Any) -> int | None:
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


def _truthy(value: Any) -> bool:
    return value is True or value == 1 or (isinstance(value, str) and value.lower() in ("true", "1"))


def step_windows(markers: list[Span]) -> list[Window]:
    """Windows from the preferred kind of step marker. Markers that all state their step (an arg,
    or ``ProfilerStep#N``) group by it — per-rank copies of one step join, and the next step of a
    rank that runs ahead stays apart; otherwise overlapping markers join."""
    chosen = _chosen_markers(markers)
    groups: list[list[Span]] = []
    own = [_marker_step(m) for m in chosen]
    if chosen and None not in own:
        by: dict[int | None, list[Span]] = {}
        for m, n in zip(chosen, own, strict=True):
            by.setdefault(n, []).append(m)
        groups = sorted(by.values(), key=lambda g: min(x.start_ns for x in g))
    for m in chosen if not groups else ():
        if groups and m.start_ns < max(x.end_ns for x in groups[-1]):
            groups[-1].append(m)
        else:
            groups.append([m])
    numbers = []
    for g in groups:
        found = {n for m in g for k in STEP_KEYS if (n := _int(m.args.get(k))) is not None}
        found |= {n for m in g if not found and (n := marker_number(m.name)) is not None}
        numbers.append(found.pop() if len(found) == 1 else None)
    usable = None not in numbers and len(set(numbers)) == len(numbers)
    windows = []
    for i, g in enumerate(groups):
        modes = {str(m.args.get("mode") or m.args.get("trainer_mode") or "") for m in g} - {""}
        windows.append(
            Window(
                step=numbers[i] if usable else i + 1,
                start_ns=min(m.start_ns for m in g),
                end_ns=max(m.end_ns for m in g),
                profiled=any(_truthy(m.args.get("profiled")) for m in g),
                mode=modes.pop() if len(modes) == 1 else None,
            )
        )
    return windows


def _chosen_markers(markers: list[Span]) -> list[Span]:
    if not markers:
        return []
    best = min(p for p in (marker_priority(m.name) for m in markers) if p is not None)
    return sorted((m for m in markers if marker_priority(m.name) == best), key=lambda m: m.start_ns)


def _marker_step(m: Span) -> int | None:
    found = {n for k in STEP_KEYS if (n := _int(m.args.get(k))) is not None}
    return found.pop() if len(found) == 1 else marker_number(m.name) if not found else None


def process_windows(markers: list[Span], windows: list[Window]) -> dict[Any, list[tuple[int, int, int]]]:
    """Per process, its own markers' spans as (start, end, window index): a kernel's step is the
    step its own rank was in when it launched it (HTA's per-rank iterations), where ranks mark steps."""
    index = {w.step: i for i, w in enumerate(windows) if w.step is not None}
    out: dict[Any, list[tuple[int, int, int]]] = defaultdict(list)
    for m in _chosen_markers(markers):
        n = _marker_step(m)
        if n in index:
            out[m.pid].append((m.start_ns, m.end_ns, index[n]))
    return {pid: sorted(v) for pid, v in out.items()}
