"""One step's figures: every per-step row of the report summary (schema ``rl-trace-report/4``).

The same function reads the watch's per-step report and the post-hoc report of the whole run, so
"the watch equals the post-hoc answer" is one dict comparison per step.
"""

from __future__ import annotations

from typing import Any

# (path in the summary, as keys) of lists whose rows carry a ``step``
STEP_LISTS: tuple[tuple[str, ...], ...] = (
    ("steps",),
    ("stragglers",),
    ("idle", "steps"),
    ("goodput", "steps"),
    ("arrivals", "events"),
    ("critical_path",),
    ("rollout", "steps"),
    ("rollout", "staleness"),
    ("rollout", "weight_sync", "syncs"),  # each sync's step: rollout.sync_step
    ("telemetry", "engines"),
    ("telemetry", "gpus"),
    ("telemetry", "host_cpu"),
    ("gpu", "rows"),
)


def _at(summary: dict[str, Any], path: tuple[str, ...]) -> list[Any]:
    node: Any = summary
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, list) else []


def step_figures(summary: dict[str, Any], step: int) -> dict[str, Any]:
    """Every row of ``summary`` that belongs to ``step``, keyed by its section's path."""
    out: dict[str, Any] = {}
    for path in STEP_LISTS:
        rows = [r for r in _at(summary, path) if isinstance(r, dict) and r.get("step") == step]
        if rows:
            out[".".join(path)] = rows
    metrics = {
        m["name"]: row
        for m in summary.get("metrics") or []
        for row in m.get("steps", [])
        if row.get("step") == step
    }
    if metrics:
        out["metrics"] = metrics
    return out


def steps_in(summary: dict[str, Any]) -> list[int]:
    return [int(r["step"]) for r in summary.get("steps") or []]
