"""A step's one-line answer and the alert when a step leaves the noise band of the steps before it.

**The alert** uses the diff's noise model (:mod:`..report.noise`): a step's duration is outside
the band when it differs from the mean of the (up to 5) steps before it by more than
``2·s·√(1/n + 1)``, and by more than 5 % of that mean (steps of equal length have no spread: a
tick of jitter is not an alert).

**Weight sync growing** (verl#4896: a sync that grows over a run). A step's sync time is the sum of
its weight syncs' durations (``rollout.weight_sync.syncs[].dur_ns``, each sync in the step whose
window holds its start). Among the (up to 5) steps before it that synced, at least 2, it is
*growing* when it is either

- a **jump**: longer than the longest of them by more than the noise floor, or
- a **climb**: longer than the sync before it, which was longer than the one before, and so on for
  3 rises in a row, and longer than the first of those by more than the noise floor;

the noise floor being 5 % of the sync it is compared with, and at least 1 ms (a sub-millisecond
jitter is never growth). A sync that stays within the floor of the steps before never is.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from ..report.noise import one_step_band

NOISE_STEPS = 5  # the band is drawn from at most this many steps before
NOISE_FLOOR = 0.05  # relative: a band never narrower than ±5 % of the mean (steps of equal length)
SYNC_FLOOR_NS = 1_000_000  # a sync this much longer than before (or less) is jitter, not growth
SYNC_RISES = 3  # a climb: this many rises in a row


def one_line(record: dict[str, Any], steps: Sequence[dict[str, Any]] = ()) -> str:
    """ "rollout-bound: generation 61% of the step; straggler trainer rank_1 in update (+0.20 s); …";
    ``steps``: every answered step (the earlier ones tell whether the weight sync grows)."""
    fig = record.get("figures") or {}
    rows = fig.get("steps") or []
    growth = sync_growth(steps, record)
    if not rows:
        return growth or "no stage spans in this step"
    row = rows[0]
    dur = row.get("dur_ns") or 1
    ov = row.get("overlap") or {}
    gen = ov.get("generation_only_ns", 0) + ov.get("both_ns", 0)
    train = ov.get("training_only_ns", 0) + ov.get("both_ns", 0)
    parts = []
    if gen or train:
        bound = "rollout-bound" if gen >= train else "train-bound"
        parts.append(
            f"{bound}: generation {100 * gen / dur:.0f}%, training {100 * train / dur:.0f}% of the step"
        )
    stragglers = sorted(fig.get("stragglers") or [], key=lambda s: -s.get("lag_ns", 0))
    if stragglers:
        s = stragglers[0]
        parts.append(
            f"straggler {s['role']} {s['slowest_lane']} in {s['stage']} (+{s['lag_ns'] / 1e9:.3f} s)"
        )
    ro = (fig.get("rollout.steps") or [None])[0]
    if ro and (ro.get("tail") or {}).get("dur_ns"):
        parts.append(f"long tail {100 * ro['tail']['dur_ns'] / dur:.0f}% of the step")
    if growth:
        parts.append(growth)
    return "; ".join(parts) or "no stage spans in this step"


def sync_ns(record: dict[str, Any]) -> int:
    """A step's weight-sync time: its syncs' durations summed (0: it synced none)."""
    syncs = (record.get("figures") or {}).get("rollout.weight_sync.syncs") or []
    return sum(int(s.get("dur_ns") or 0) for s in syncs)


def _sync_floor(ns: int) -> float:
    return max(NOISE_FLOOR * ns, SYNC_FLOOR_NS)


def sync_growth(steps: Sequence[dict[str, Any]], record: dict[str, Any]) -> str | None:
    """ "weight sync growing: …" with the figures when this step's sync is clearly above the steps
    before it (the rule in the module's docstring), else None."""
    now = sync_ns(record)
    earlier = sorted((s for s in steps if s["step"] < record["step"]), key=lambda s: s["step"])
    before = [n for n in map(sync_ns, earlier) if n][-NOISE_STEPS:]
    if not now or len(before) < 2:
        return None
    top = max(before)
    if now - top > _sync_floor(top):
        return (
            f"weight sync growing: {now / 1e9:.3f} s, longer than in the {len(before)} steps before "
            f"(at most {top / 1e9:.3f} s)"
        )
    climb = [*before[-SYNC_RISES:], now]
    if (
        len(climb) == SYNC_RISES + 1
        and all(a < b for a, b in pairwise(climb))
        and now - climb[0] > _sync_floor(climb[0])
    ):
        return (
            f"weight sync growing: {now / 1e9:.3f} s, longer {SYNC_RISES} steps in a row "
            f"(from {climb[0] / 1e9:.3f} s)"
        )
    return None


def alert(steps: list[dict[str, Any]], record: dict[str, Any]) -> str | None:
    """Why this step's duration is outside the noise band of the (up to 5) steps before it, else None."""
    before = [s for s in steps if s["step"] < record["step"]][-NOISE_STEPS:]
    durs = [_dur(s) for s in before]
    durs = [d for d in durs if d]
    dur = _dur(record)
    if len(durs) < 2 or not dur:
        return None
    mean = statistics.fmean(durs)
    band = max(one_step_band(durs), NOISE_FLOOR * mean)
    if abs(dur - mean) <= band:
        return None
    word = "slower" if dur > mean else "faster"
    return (
        f"step {record['step']} took {dur / 1e9:.3f} s, {word} than the {len(durs)} steps before "
        f"({mean / 1e9:.3f} s ± {band / 1e9:.3f} s)"
    )


def _dur(record: dict[str, Any]) -> int:
    rows = (record.get("figures") or {}).get("steps") or []
    return int(rows[0].get("dur_ns") or 0) if rows else 0
