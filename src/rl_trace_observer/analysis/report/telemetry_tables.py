"""The telemetry section as plain tables (:class:`.rollout_tables.PlainTable`), shared by the
terminal and the HTML report."""

from __future__ import annotations

from typing import Any

from .rollout_tables import PlainTable
from .style import LABELS, step_label

MAX_ROWS = 64
NO_SAMPLE = "no sample"


def _n(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _tokens(row: dict[str, Any], key: str) -> str:
    low, high = row.get(f"{key}_tokens_low"), row.get(f"{key}_tokens_high")
    mid = row.get(f"{key}_tokens")
    if mid is None:
        return "—"
    return f"{mid:.0f} [{low:.0f}–{high:.0f}]" if low != high else f"{mid:.0f}"


def tables(telemetry: dict[str, Any] | None) -> list[PlainTable]:
    """Engine, GPU and host tables; empty when the trace has no metric samples."""
    if not telemetry:
        return []
    out = []
    if telemetry.get("engines"):
        t = PlainTable(
            "Engines per step and replica, from their /metrics, next to our request spans",
            [
                "step",
                "replica",
                "running",
                "waiting",
                "KV max",
                "preempt",
                "gen tokens",
                "spans",
                "gen tok/s",
                "spans",
                "check",
            ],
            left=(10,),
            short={1: "rep", 4: "KV", 5: "pre", 6: "gen tok", 8: "tok/s", 10: "chk"},
            drop=(5, 4),  # a narrow terminal keeps the engine-vs-spans comparison, not preemptions/KV
            note=f"running/waiting: time-weighted mean/max ({NO_SAMPLE}: the sampler took none in the step); "
            "gen tokens: the engine's count in the step "
            "[sampling bracket]; tok/s over the step; check: DISAGREE when the spans' count lies outside "
            f"the bracket by more than {telemetry.get('slack_pct', 5):g}%",
        )
        for r in telemetry["engines"][:MAX_ROWS]:
            check = "—" if "disagrees" not in r else ("DISAGREE" if r["disagrees"] else "ok")
            sampled = r.get("samples_in_step") != 0  # absent (an older report): as before
            t.rows.append(
                [
                    step_label(r["step"]),
                    _n(r["replica"]),
                    f"{_n(r['running_mean'], 2)}/{_n(r['running_max'])}" if sampled else NO_SAMPLE,
                    f"{_n(r['waiting_mean'], 2)}/{_n(r['waiting_max'])}" if sampled else NO_SAMPLE,
                    _n(r["kv_cache_max"], 2) if sampled else "—",
                    _n(r["preemptions"]),
                    _tokens(r, "generation"),
                    _n(r.get("span_generation_tokens")),
                    _n(r["generation_tokens_per_s"], 4),
                    _n(r.get("span_generation_tokens_per_s"), 4),
                    check,
                ]
            )
        out.append(t)
    gpus = PlainTable(
        "GPUs per step, role and stage (NVML utilisation time-weighted over the stage's spans)",
        ["step", "role", "stage", "util mean %", "util max %", "memory max GiB"],
        left=(1, 2),
        note=telemetry.get("gpu_note") or "",
    )
    for r in telemetry.get("gpus", [])[:MAX_ROWS]:
        mem = r.get("memory_max_bytes")
        gpus.rows.append(
            [
                step_label(r["step"]),
                r["role"],
                LABELS.get(r["stage"], r["stage"]),
                _n(r["mean"]),
                _n(r["max"]),
                "—" if mem is None else f"{mem / 2**30:.1f}",
            ]
        )
    out.append(gpus)
    if telemetry.get("host_cpu"):
        cpu = PlainTable(
            "Host CPU per role and stage (busy %, time-weighted over the stage's spans, all steps)",
            ["role", "stage", "cpu mean %", "cpu max %"],
            left=(0, 1),
        )
        for (role, stage), (mean, top) in _over_steps(telemetry["host_cpu"]).items():
            cpu.rows.append([role, LABELS.get(stage, stage), _n(mean), _n(top)])
        out.append(cpu)
    return out


def _over_steps(rows: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[float, float]]:
    """Per (role, stage): the mean of the per-step means (weighted by their span counts) and the max."""
    acc: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        a = acc.setdefault((r["role"], r["stage"]), [0.0, 0.0, float("-inf")])
        a[0] += r["mean"] * r["spans"]
        a[1] += r["spans"]
        a[2] = max(a[2], r["max"])
    return {k: (total / n, top) for k, (total, n, top) in sorted(acc.items()) if n}
