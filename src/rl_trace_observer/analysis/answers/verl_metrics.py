"""VERL's own timing metrics side by side with the timeline's, flagged where they disagree by > 5 %.

VERL logs per-step timers (``timing_s/<name>``, seconds, measured by the driver around each phase)
and, in its async trainers, ``trainer/idle_ratio`` / ``rollouter/idle_ratio``; through RL-Insight
they arrive as counter tracks, which the report already averages per step (``metrics``). Users size
resources by them, and they have been wrong (verl#6693: both idle ratios ≈ 0 on a training-bound
run), so each is compared with what the spans say for the same step:

- ``timing_s/step``: the step window's length;
- ``timing_s/<phase>``: the wall-clock union of that phase's stage spans over every lane, inside the
  step (``gen`` → generation, ``update_actor`` / ``update_critic`` → update spans of the actor /
  critic, ``old_log_prob`` → log-prob spans not of the reference model, ``ref`` → the reference's,
  ``update_weights`` → weight sync);
- ``trainer/idle_ratio``, ``rollouter/idle_ratio``: the trainer / rollout role's goodput idle share.

A timer disagrees when it differs from ours by more than 5 % of ours; a ratio, by more than 5
percentage points. Metrics we cannot reproduce are left out (never guessed).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from . import intervals as iv
from .model import StepWindow, WorkSpan

THRESHOLD_PCT = 5.0
Match = Callable[[WorkSpan], bool]

TIMERS: dict[str, Match] = {
    "gen": lambda s: s.stage == "generation",
    "update_actor": lambda s: s.stage == "update" and "critic" not in s.name.lower(),
    "update_critic": lambda s: s.stage == "update" and "critic" in s.name.lower(),
    "old_log_prob": lambda s: s.stage == "log_prob" and not re.search(r"(^|_)ref", s.name.lower()),
    "ref": lambda s: s.stage == "log_prob" and bool(re.search(r"(^|_)ref", s.name.lower())),
    "update_weights": lambda s: s.stage == "weight_sync",
}
RATIOS = {"trainer/idle_ratio": "trainer", "rollouter/idle_ratio": "rollout"}


def _ours_timer(metric: str, spans: list[WorkSpan], w: StepWindow) -> int | None:
    phase = metric.removeprefix("timing_s/")
    if phase == "step":
        return w.end_ns - w.start_ns
    match = TIMERS.get(phase)
    if match is None:
        return None
    hits = [(s.start_ns, s.end_ns) for s in spans if match(s)]
    return iv.covered(hits, w.start_ns, w.end_ns) if hits else None


def metric_check(
    spans: list[WorkSpan], windows: list[StepWindow], metrics: list[dict[str, Any]], goodput: dict[str, Any]
) -> dict[str, Any] | None:
    """The report's ``metric_check`` section; None when the trace has none of these metrics."""
    by_step = {w.step: w for w in windows}
    idle = {
        (st["step"], r["role"]): r["idle_ns"] / st["dur_ns"]
        for st in goodput.get("steps") or []
        for r in st["roles"]
        if st["dur_ns"]
    }
    rows = []
    for m in metrics:
        name = m["name"]
        timer = name.startswith("timing_s/")
        if not timer and name not in RATIOS:
            continue
        for point in m["steps"]:
            w = by_step.get(point["step"])
            if w is None:
                continue
            if timer:
                ours = _ours_timer(name, spans, w)
                if ours is None:
                    continue
                theirs = round(point["mean"] * 1e9)
                diff = 100.0 * (theirs - ours) / ours if ours else None
                bad = diff is None or abs(diff) > THRESHOLD_PCT
                rows.append(_row(name, w.step, "ns", theirs, ours, diff, bad))
            else:
                share = idle.get((w.step, RATIOS[name]))
                if share is None:
                    continue
                diff = 100.0 * (point["mean"] - share)  # percentage points
                rows.append(
                    _row(
                        name, w.step, "ratio", point["mean"], round(share, 4), diff, abs(diff) > THRESHOLD_PCT
                    )
                )
    if not rows:
        return None
    return {
        "threshold_pct": THRESHOLD_PCT,
        "rows": rows,
        "disagreements": sum(1 for r in rows if r["disagree"]),
    }


def _row(
    name: str, step: Any, unit: str, theirs: Any, ours: Any, diff: float | None, bad: bool
) -> dict[str, Any]:
    return {
        "metric": name,
        "step": step,
        "unit": unit,
        "verl": theirs,
        "ours": ours,
        "diff_pct": round(diff, 2) if diff is not None else None,
        "disagree": bad,
    }
