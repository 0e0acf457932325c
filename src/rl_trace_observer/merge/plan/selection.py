"""Which artifacts and which time ranges go into the output (``--run``, ``--role``, ``--step``).

A file is kept or skipped as a whole by its run, role and step (from its process record, else its
name); ``--step`` also keeps only events inside the selected steps' windows when the run has them
(its step markers, the report's rule: :mod:`..timeline.steps`; else ``step_begin``/``step_end`` snapshots).
A step without a window is reported (``no_step_window``) rather than guessed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..formats import EVENT_KINDS
from ..timeline.model import Problem, ProcessInfo
from .plan import Plan

EPOCH_S = 1e9  # --time-window values at least this large are Unix seconds, smaller ones are relative


@dataclass(frozen=True)
class Selection:
    run: str | None = None
    steps: tuple[tuple[int, int], ...] = ()  # inclusive ranges
    roles: tuple[str, ...] = ()

    def wants_step(self, step: int) -> bool:
        return any(lo <= step <= hi for lo, hi in self.steps)


def select(plan: Plan, sel: Selection) -> tuple[tuple[int, int], ...]:
    """Mark skipped artifacts; return the step windows (absolute ns) events must fall in, if any."""
    runs = Counter(p.run_id for p in plan.processes.values() if p.run_id)
    plan.runs = dict(runs)
    if sel.run is None and len(runs) > 1:
        listed = ", ".join(f"{r} ({n} processes)" for r, n in runs.most_common())
        plan.problems.append(
            Problem("mixed_runs", "(inputs)", f"several runs: {listed}; choose one with --run")
        )
    wanted_steps = sorted(s for s in plan.step_windows if sel.wants_step(s))
    missing = [
        f"{lo}-{hi}" if lo != hi else str(lo) for lo, hi in sel.steps if not _covered(lo, hi, wanted_steps)
    ]
    if sel.steps and missing:
        plan.problems.append(
            Problem(
                "no_step_window",
                "(inputs)",
                f"no step window (global_step/train_batch marker or step_begin/step_end snapshots) "
                f"for step {', '.join(missing)}",
            )
        )
    windows = tuple(plan.step_windows[s] for s in wanted_steps)
    for art in plan.artifacts:
        info = art.info
        if info.kind not in EVENT_KINDS or not info.selected:
            continue
        owner = plan.processes.get(info.owner) if info.owner else None
        reason = _skip_reason(sel, info.step, info.role, owner.role if owner else None, owner, windows)
        if reason:
            info.selected, info.skip_reason = False, reason
    return windows


def _covered(lo: int, hi: int, steps: list[int]) -> bool:
    return any(lo <= s <= hi for s in steps)


def _skip_reason(
    sel: Selection,
    step: int | None,
    art_role: str | None,
    role: str | None,
    owner: ProcessInfo | None,
    windows: tuple[tuple[int, int], ...],
) -> str | None:
    if sel.run is not None:
        run = owner.run_id if owner else None
        if run != sel.run:
            return f"run {run or 'unknown (no process record)'} is not {sel.run}"
    if sel.roles and role not in sel.roles and art_role not in sel.roles:
        return f"role {role or art_role or 'unknown'} not selected"
    if sel.steps:
        if step is not None and not sel.wants_step(step):
            return f"step {step} not selected"
        if step is None and not windows:
            return "step unknown and no step window to cut it to"
    return None


def parse_steps(values: list[str]) -> tuple[tuple[int, int], ...]:
    """``["3", "5-7"]`` → ``((3, 3), (5, 7))``; ValueError with the bad value otherwise."""
    out = []
    for raw in values:
        for part in str(raw).split(","):
            part = part.strip()
            lo_s, sep, hi_s = part.partition("-")
            try:
                lo = int(lo_s)
                hi = int(hi_s) if sep else lo
            except ValueError:
                raise ValueError(f"--step {raw!r}: expected N or A-B") from None
            if hi < lo:
                raise ValueError(f"--step {raw!r}: range ends before it starts")
            out.append((lo, hi))
    return tuple(out)


def parse_time_window(value: str | None) -> tuple[float | None, float | None] | None:
    """``START:END`` in seconds (either side may be empty); see :func:`window_ns`."""
    if value is None:
        return None
    start, sep, end = value.partition(":")
    if not sep:
        raise ValueError(f"--time-window {value!r}: expected START:END (seconds)")
    try:
        lo = float(start) if start.strip() else None
        hi = float(end) if end.strip() else None
    except ValueError:
        raise ValueError(f"--time-window {value!r}: START and END must be numbers of seconds") from None
    if lo is not None and hi is not None and hi < lo:
        raise ValueError(f"--time-window {value!r}: END is before START")
    return lo, hi


def window_ns(window: tuple[float | None, float | None], base_ns: int) -> tuple[int | None, int | None]:
    """Seconds → absolute ns: Unix seconds as they are, smaller values relative to ``base_ns``."""

    def conv(v: float | None) -> int | None:
        if v is None:
            return None
        return int(v * 1e9) if v >= EPOCH_S else base_ns + int(v * 1e9)

    return conv(window[0]), conv(window[1])
