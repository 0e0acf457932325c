"""The answers (goodput, idle causes, stragglers by arrival, critical path) as plain tables, so the
terminal and the HTML report show the same cells (see :mod:`.rollout_tables`)."""

from __future__ import annotations

from typing import Any

from .rollout_tables import PlainTable
from .style import fmt_ns, fmt_pct, step_label

CAUSE_LABELS = {
    "weight_sync": "weight sync",
    "waiting_for_rollout": "wait rollout",
    "waiting_for_trainer": "wait trainer",
    "waiting_for_peers": "wait peers",
    "driver": "driver/boundary",
    "unexplained": "unexplained",
}
# narrow terminals: headers wrap by word, so each word is as wide as its column must be
SHORT_CAUSES = {"weight_sync": "sync", "driver": "driver boundary", "unexplained": "unexpl."}
MAX_PATH_STEPS = 12
MAX_ARRIVALS = 20


def _goodput(goodput: dict[str, Any]) -> PlainTable | None:
    rows = []
    for r in goodput.get("roles") or []:
        wall = r["wall_ns"]
        rows.append(
            [r["role"], fmt_ns(wall)]
            + [
                f"{fmt_ns(r.get(k, 0))} {fmt_pct(r.get(k, 0), wall)}"
                for k in ("productive_ns", "overhead_ns", "idle_ns", "wasted_ns")
            ]
        )
    if not rows:
        return None
    return PlainTable(
        "Goodput per role (all steps; productive = generation, log-prob, update)",
        ["role", "wall", "productive", "overhead", "idle", "wasted"],
        rows,
        (0,),
        "overhead = weight sync and unclassified stages; a span's own rl.bucket (NeMo-RL) wins; the four "
        "sum to the wall time",
    )


def _idle(idle: dict[str, Any]) -> PlainTable | None:
    causes = idle.get("causes") or []
    rows = []
    for r in idle.get("roles") or []:
        total = r["idle_ns"]
        if not total:
            continue
        rows.append(
            [r["role"], str(r["lanes"]), fmt_ns(total)]
            + [fmt_pct(r["causes_ns"][c], total) if r["causes_ns"][c] else "—" for c in causes]
        )
    if not rows:
        return None
    return PlainTable(
        "Idle time by cause (summed over lanes and steps; % of the role's idle time)",
        ["role", "lanes", "idle", *(CAUSE_LABELS.get(c, c) for c in causes)],
        rows,
        (0,),
        short={3 + i: SHORT_CAUSES[c] for i, c in enumerate(causes) if c in SHORT_CAUSES},
        drop=(1,),
    )


def _arrivals(arrivals: dict[str, Any], limit: int) -> PlainTable | None:
    rows = []
    for r in (arrivals.get("summary") or [])[:limit]:
        role = "all roles" if r["role"] == "*" else r["role"]
        rows.append(
            [
                r["point"],
                role,
                r["lane"],
                f"{r['last_in']} of {r['steps']}",
                fmt_ns(r["median_lag_ns"]),
                fmt_ns(r["max_lag_ns"]),
                fmt_ns(r["median_spread_ns"]),
            ]
        )
    if not rows:
        return None
    return PlainTable(
        "Stragglers by arrival (who reached each sync point last)",
        ["sync point", "role", "last most often", "steps", "median lag", "max lag", "median spread"],
        rows,
        (0, 1, 2),
        "lag: behind the next-latest lane; spread: last − first arrival",
        short={2: "last most often"},
        drop=(6, 5),
    )


def _path_text(segments: list[dict[str, Any]]) -> str:
    parts = [
        f"{s['name']}@{s['lane']} {fmt_ns(s['dur_ns'])}" + (" [GPU-bound]" if s.get("bound") == "gpu" else "")
        for s in segments
        if s["stage"] != "gap" and s["dur_ns"] >= 0.02 * max(1, sum(x["dur_ns"] for x in segments))
    ]
    return " → ".join(parts) or "—"


def _critical(paths: list[dict[str, Any]]) -> PlainTable | None:
    rows = []
    for p in paths[:MAX_PATH_STEPS]:
        top = p["what_if"][0] if p["what_if"] else None
        gap = p["by_stage_ns"].get("gap", 0)
        rows.append(
            [
                step_label(p["step"]),
                fmt_ns(p["dur_ns"]),
                _path_text(p["segments"]),
                fmt_ns(gap),
                (f"{top['stage']}: −{fmt_ns(top['saving_ns']['10'])} / −{fmt_ns(top['saving_ns']['50'])}")
                if top
                else "—",
            ]
        )
    if not rows:
        return None
    return PlainTable(
        "Critical path per step (spans ≥ 2 % of the step)",
        ["step", "wall", "path", "gaps", "biggest what-if (10 % / 50 % shorter)"],
        rows,
        (2, 4),
        "what-if: first-order saving while the path stays critical; gaps: no stage span ran (driver)",
        short={4: "what-if (10 % / 50 %)"},
    )


def _metric_check(check: dict[str, Any] | None) -> PlainTable | None:
    if not check:
        return None
    rows = []
    for r in check["rows"]:
        show = fmt_ns if r["unit"] == "ns" else (lambda v: f"{100 * v:.1f}%")
        diff = (
            "—" if r["diff_pct"] is None else f"{r['diff_pct']:+.1f}" + (" %" if r["unit"] == "ns" else " pt")
        )
        rows.append(
            [r["metric"], step_label(r["step"]), show(r["verl"]), show(r["ours"]), diff,
             "DISAGREES" if r["disagree"] else "ok"]
        )  # fmt: skip
    return PlainTable(
        f"VERL's own timing metrics vs the timeline ({check['disagreements']} disagree by > "
        f"{check['threshold_pct']:.0f} %)",
        ["metric", "step", "VERL", "timeline", "difference", "verdict"],
        rows,
        (0, 5),
        "timeline: the union of the phase's stage spans over every lane in the step (idle ratios: goodput)",
    )


def tables(summary: dict[str, Any], *, top: int = MAX_ARRIVALS) -> list[PlainTable]:
    out = [
        _goodput(summary.get("goodput") or {}),
        _idle(summary.get("idle") or {}),
        _arrivals(summary.get("arrivals") or {}, top),
        _critical(summary.get("critical_path") or []),
        _metric_check(summary.get("metric_check")),
    ]
    return [t for t in out if t is not None]
