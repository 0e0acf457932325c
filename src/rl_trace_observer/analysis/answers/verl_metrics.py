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
- ``trainer/idle_ratio``, ``rollouter/idle_ratio``: the goodput idle share of the role that trains
  (``trainer``, or VERL's ``actor_rollout``) / of the rollout role.

A timer disagrees when it differs from ours by more than 5 % of ours; a ratio, by more than 5
percentage points. Metrics we cannot reproduce are left out (never guessed).

Names as VERL logs them: ``timing_s/gen``, ``fully_async/trainer/idle_ratio`` (its fully-async
policy); through VERL's RL-Insight logger every ``/`` becomes ``_`` (``timing_s_gen``,
``fully_async_trainer_idle_ratio``) — each spelling is read as the same metric.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from . import intervals as iv
from .model import ROLLOUT, TRAINER, StepWindow, WorkSpan, by_lane, lane_kinds

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
RATIOS = {"trainer/idle_ratio": TRAINER, "rollouter/idle_ratio": ROLLOUT}  # → the lane kind
TIMER_PREFIXES = ("timing_s/", "timing_s_")
RATIO_SPELLINGS = {
    spelling: ratio
    for ratio in RATIOS
    for spelling in (ratio, f"fully_async/{ratio}", f"fully_async_{ratio}".replace("/", "_"))
}


def canonical(name: str) -> str | None:
    """``timing_s/<phase>`` or a key of :data:`RATIOS` for any spelling VERL logs; None otherwise."""
    for prefix in TIMER_PREFIXES:
        if name.startswith(prefix):
            return "timing_s/" + name[len(prefix) :]
    return RATIO_SPELLINGS.get(name)


def _ours_timer(metric: str, spans: list[WorkSpan], w: StepWindow) -> int | None:
    phase = metric.removeprefix("timing_s/")
    if phase == "step":
        return w.end_ns - w.start_ns
    match = TIMERS.get(phase)
    if match is None:
        return None
    hits = [(s.start_ns, s.end_ns) for s in spans if match(s)]
    return iv.covered(hits, w.start_ns, w.end_ns) if hits else None


def _role_of_kind(spans: list[WorkSpan]) -> dict[str, str]:
    """The role whose idle share stands for VERL's trainer / rollouter: the role named so, else the
    only role whose lanes train (log-prob, update) / only generate (``actor_rollout`` in VERL)."""
    kinds: dict[str, set[str]] = {}
    for (role, _), kind in lane_kinds(by_lane(spans)).items():
        kinds.setdefault(role, set()).add(kind)
    out = {}
    for kind in (TRAINER, ROLLOUT):
        named = [r for r in kinds if r == kind]
        doing = [r for r, k in kinds.items() if kind in k]
        pick = named or (doing if len(doing) == 1 else [])
        if pick:
            out[pick[0]] = kind
    return out


def metric_check(
    spans: list[WorkSpan], windows: list[StepWindow], metrics: list[dict[str, Any]], goodput: dict[str, Any]
) -> dict[str, Any] | None:
    """The report's ``metric_check`` section; None when the trace has none of these metrics."""
    by_step = {w.step: w for w in windows}
    names = [canonical(m["name"]) for m in metrics]
    idle: dict[tuple[Any, str], float] = {}
    if any(n is not None and not n.startswith("timing_s/") for n in names):  # a ratio to compare
        role_of_kind = _role_of_kind(spans)  # a grouping of every span: only when it is needed
        idle = {
            (st["step"], kind): r["idle_ns"] / st["dur_ns"]
            for st in goodput.get("steps") or []
            for r in st["roles"]
            if st["dur_ns"] and (kind := role_of_kind.get(r["role"])) is not None
        }
    rows = []
    for m, name in zip(metrics, names, strict=True):
        if name is None:
            continue
        timer = name.startswith("timing_s/")
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
                rows.append(_row(m["name"], w.step, "ns", theirs, ours, diff, bad))
            else:
                share = idle.get((w.step, RATIOS[name]))
                if share is None:
                    continue
                diff = 100.0 * (point["mean"] - share)  # percentage points
                rows.append(
                    _row(
                        m["name"],
                        w.step,
                        "ratio",
                        point["mean"],
                        round(share, 4),
                        diff,
                        abs(diff) > THRESHOLD_PCT,
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
