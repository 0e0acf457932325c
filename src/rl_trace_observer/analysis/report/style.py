"""Presentation shared by the terminal and HTML reports: labels, colours, number formats."""

from __future__ import annotations

from typing import Any

from .stages import SYNC_ROOT_NAME

LABELS = {
    "generation": "generation",
    "log_prob": "log-prob",
    "update": "update",
    "weight_sync": "weight sync",
    "other": "other",
    "idle": "idle",
    "step": "step marker",
}
# Colour-blind-safe (Okabe-Ito) for the work categories; idle is a light grey.
COLORS = {
    "generation": "#0072B2",
    "log_prob": "#E69F00",
    "update": "#D55E00",
    "weight_sync": "#CC79A7",
    "other": "#009E73",
    "idle": "#D9D9D9",
    "step": "#999999",
}
OVERLAP_KEYS = (
    ("generation_only_ns", "generation only", "#0072B2"),
    ("both_ns", "both (overlap)", "#7B3294"),
    ("training_only_ns", "training only", "#D55E00"),
    ("neither_ns", "neither", "#D9D9D9"),
)


# One definition per figure, stated where it is shown (terminal and HTML use the same words).
SLOWEST_TITLE = "Slowest lane per stage, by duration (not stragglers: see stragglers by arrival)"
SLOWEST_NOTE = (
    "lag: the slowest lane's time in the stage minus the median lane's; an all-reduce makes durations "
    "equal, so who held a step up is in the arrivals table"
)
STEP_TABLE_NOTE = (
    "each cell: the mean per lane of the window-clipped union of that lane's stage spans of the "
    "category; weight sync = the lanes' own weight-sync stage spans (each rank's and replica's part), "
    f"not the trainer's {SYNC_ROOT_NAME} call (the weight-sync table); idle = the step minus the lane's "
    "busy time"
)


def problem_groups(problems: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The merge's problems by kind, in order of first appearance: eight Kineto files without a process
    record are one "unlinked" line, not eight."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for p in problems:
        groups.setdefault(str(p.get("kind")), []).append(p)
    return list(groups.items())


def problem_line(kind: str, items: list[dict[str, Any]]) -> str:
    first = items[0]
    more = f" (+{len(items) - 1} more like it)" if len(items) > 1 else ""
    return f"{kind}: {first.get('path')}: {first.get('detail')}{more}"


def worst_arrival(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The sync point whose usual last lane kept the others waiting longest (median lag)."""
    rows = (summary.get("arrivals") or {}).get("summary") or []
    return max(rows, key=lambda r: r["median_lag_ns"], default=None)


def fmt_ns(value: float | int | None) -> str:
    """A duration for humans: ``1.23 s``, ``289.6 ms``, ``12.3 µs``, ``850 ns``."""
    if value is None:
        return "—"
    v = float(value)
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:.2f} s"
    if a >= 1e6:
        return f"{v / 1e6:.1f} ms"
    if a >= 1e3:
        return f"{v / 1e3:.1f} µs"
    return f"{v:.0f} ns"


def fmt_pct(part: float | int, whole: float | int) -> str:
    return f"{100.0 * part / whole:.0f}%" if whole else "—"


def fmt_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "—" if value is None else str(value)


def step_label(step: Any) -> str:
    return "all" if step is None else str(step)


def span_step_label(step: Any) -> str:
    """A span's step: ``—`` for one in no step (the demo's set-up), where a row of figures says ``all``."""
    return "—" if step is None else str(step)
