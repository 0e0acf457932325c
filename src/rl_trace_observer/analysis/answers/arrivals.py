"""Stragglers by arrival: who reached each synchronisation point last, and by how much, over steps.

Durations hide stragglers (an all-reduce makes every rank's backward equally long); arrival times do
not. A lane's **arrival** at a point is the end of its last span there inside the step window:

- ``stage <name>``: the end of a stage span of that name, across the lanes of one role that run it
  in the step (≥2 lanes): e.g. each trainer rank's ``actor_update``, each replica's weight-sync phase;
- ``step end``: each trainer / rollout lane's last stage span of the step, across every role (the
  driver's step boundary waits for all of them).

Per point and step: the last lane, ``lag_ns`` = its arrival − the next-latest arrival (how long the
point waited for it alone), ``spread_ns`` = last − first arrival. Per point over steps: the lane
that came last most often, in how many of the steps, and the median lag of those steps.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from . import interval_arrays as ia
from .model import ROLLOUT, TRAINER, Lane, RowTable, StepWindow, WorkSpan, by_lane, lane_kinds, natural

STEP_END = "step end"
MAX_EVENTS = 500


def _last(arrivals: dict[str, int]) -> tuple[str, int, int]:
    """(last lane, lag behind the next-latest, spread); ties go to the lane named first."""
    ranked = sorted(arrivals, key=lambda lane: (-arrivals[lane], natural(lane)))
    last = ranked[0]
    return last, arrivals[last] - arrivals[ranked[1]], arrivals[last] - min(arrivals.values())


def _median(values: list[int]) -> int:
    return round(statistics.median(values)) if values else 0


def arrivals(
    spans: list[WorkSpan], windows: list[StepWindow], lanes: dict[Lane, list[WorkSpan]] | None = None
) -> dict[str, Any]:
    """The report's ``arrivals`` section; ``lanes``: ``by_lane(spans)`` when the caller has it."""
    lanes = by_lane(spans) if lanes is None else lanes
    kinds = lane_kinds(lanes)
    events: list[dict[str, Any]] = []
    for w in windows:
        points: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
        for (role, lane), mine in lanes.items():
            last = _last_ends(mine, w)  # per stage name, the last (clipped) end inside the window
            for name, end in last.items():
                points[(role, f"stage {name}")][lane] = end
            if last and kinds[(role, lane)] in (TRAINER, ROLLOUT):
                points[("*", STEP_END)][f"{role}/{lane}"] = max(last.values())
        for (role, point), arrived in sorted(points.items()):
            if len(arrived) < 2:
                continue
            last, lag, spread = _last(arrived)
            events.append(
                {
                    "step": w.step,
                    "point": point,
                    "role": role,
                    "lanes": len(arrived),
                    "last_lane": last,
                    "arrival_ns": arrived[last] - w.start_ns,
                    "lag_ns": lag,
                    "spread_ns": spread,
                }
            )
    return {"events": events[:MAX_EVENTS], "summary": _summary(events), "events_total": len(events)}


def _last_ends(spans: Sequence[WorkSpan], w: StepWindow) -> dict[str, int]:
    """Per span name, the latest end (at most the window's) of the spans inside ``w``."""
    if isinstance(spans, RowTable) and spans.columnar() and ia.available(w.start_ns, w.end_ns):
        return _last_ends_columns(spans, w)
    out: dict[str, int] = {}
    for s in spans:
        if s.start_ns < w.end_ns and s.end_ns > w.start_ns:
            end = min(s.end_ns, w.end_ns)
            out[s.name] = max(out.get(s.name, end), end)
    return out


def _last_ends_columns(table: RowTable, w: StepWindow) -> dict[str, int]:
    """:func:`_last_ends` over the table's arrays: a maximum per context, then per name (a lane's
    1M-span step has a few dozen contexts)."""
    np = ia.numpy_or_none()
    starts, ends, ids = table.arrays()
    inside = (starts < w.end_ns) & (ends > w.start_ns)
    ids, ends = ids[inside], np.minimum(ends[inside], w.end_ns)
    if not len(ids):
        return {}
    contexts, where = np.unique(ids, return_inverse=True)
    last = np.full(len(contexts), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(last, where, ends)
    out: dict[str, int] = {}
    for c, end in zip(contexts.tolist(), last.tolist(), strict=True):
        name = table.contexts[c][2]
        out[name] = max(out.get(name, end), end)
    return out


def _summary(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        grouped[(e["role"], e["point"])].append(e)
    out = []
    for (role, point), rows in grouped.items():
        counts = Counter(r["last_lane"] for r in rows)
        lane, n = min(counts.items(), key=lambda kv: (-kv[1], natural(kv[0])))
        lags = [r["lag_ns"] for r in rows if r["last_lane"] == lane]
        out.append(
            {
                "role": role,
                "point": point,
                "lane": lane,
                "last_in": n,
                "steps": len(rows),
                "median_lag_ns": _median(lags),
                "max_lag_ns": max(lags),
                "median_spread_ns": _median([r["spread_ns"] for r in rows]),
            }
        )
    out.sort(key=lambda r: (-r["last_in"] / r["steps"], -r["median_lag_ns"], r["role"], r["point"]))
    return out


def sentence(row: dict[str, Any]) -> str:
    """'rank_3 arrived last at stage actor_update (trainer) in 9 of 10 steps, median 41.0 ms'."""
    where = row["point"] if row["role"] == "*" else f"{row['point']} ({row['role']})"
    return (
        f"{row['lane']} arrived last at {where} in {row['last_in']} of {row['steps']} steps, "
        f"median {row['median_lag_ns'] / 1e6:.1f} ms behind the next"
    )
