"""The watch's figures in the Prometheus text format (version 0.0.4), for the Grafana people run.

Naming by Prometheus' conventions: base units (seconds, ratios), ``_seconds``/``_ratio``/``_total``
suffixes, ``rl_trace_`` prefix. A gauge holds the figure of the LATEST answered step; the step
number is a value (``rl_trace_watch_last_step``), never a label, and so is nothing unbounded (no
request id): labels are role, stage, cause, replica, quantile and, for the GPU series, rank, device
and kind, so the series count stays bounded by the cluster's size over a run of any length. Every
figure here is a pure function of a step record (:func:`step_samples`), so a test can compare what
Prometheus stored with the report's rows.

Served as ``text/plain; version=0.0.4`` whatever the scraper asks for (no OpenMetrics
negotiation: the names and values are the same either way, and nothing is rewritten).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
NS = 1e9

Sample = tuple[dict[str, str], float]

# name -> (type, help)
FAMILIES: dict[str, tuple[str, str]] = {
    "rl_trace_watch_last_step": (
        "gauge",
        "Number of the latest answered step (the step the rl_trace_step_* gauges describe).",
    ),
    "rl_trace_watch_steps_answered_total": (
        "counter",
        "Steps answered since the watch began on this output directory.",
    ),
    "rl_trace_watch_steps_corrected_total": (
        "counter",
        "Steps answered again because later clock data changed their alignment.",
    ),
    "rl_trace_watch_bad_lines_total": (
        "counter",
        "Lines of the run's logs that did not parse (named in /api/steps).",
    ),
    "rl_trace_watch_answer_seconds": ("gauge", "Time the watch took to merge and report the latest step."),
    "rl_trace_step_duration_seconds": ("gauge", "Wall time of the latest step's window."),
    "rl_trace_step_stage_seconds": (
        "gauge",
        "Mean time per lane of a role in each stage during the latest step (idle: no stage).",
    ),
    "rl_trace_step_idle_seconds": (
        "gauge",
        "Idle time of a role's lanes during the latest step, summed, by cause.",
    ),
    "rl_trace_step_straggler_lag_seconds": (
        "gauge",
        "How much later than the median lane the slowest lane finished a stage.",
    ),
    "rl_trace_step_critical_path_seconds": (
        "gauge",
        "Time of the latest step's critical path spent in each stage (gap: waiting).",
    ),
    "rl_trace_step_rollout_requests": ("gauge", "Rollout requests that started in the latest step."),
    "rl_trace_step_rollout_latency_seconds": (
        "gauge",
        "Rollout request latency quantiles in the latest step.",
    ),
    "rl_trace_step_rollout_tail_ratio": (
        "gauge",
        "Share of the latest step spent in the rollout long tail (after 90% of requests ended).",
    ),
    "rl_trace_step_weight_sync_seconds": (
        "gauge",
        "Time the latest step spent in weight syncs (the trainer's update_weights calls, summed).",
    ),
    "rl_trace_step_weight_sync_replica_seconds": (
        "gauge",
        "Time a rollout replica spent in the latest step's weight syncs (its phases, summed over syncs).",
    ),
    "rl_trace_step_engine_requests_running": (
        "gauge",
        "Mean requests running on an engine replica during the latest step.",
    ),
    "rl_trace_step_engine_requests_waiting": (
        "gauge",
        "Mean requests waiting on an engine replica during the latest step.",
    ),
    "rl_trace_step_engine_kv_cache_usage_ratio": (
        "gauge",
        "Highest KV-cache use of an engine replica during the latest step.",
    ),
    "rl_trace_step_gpu_busy_ratio": (
        "gauge",
        "Share of the latest step's window a rank's GPU was busy (union of its kernels and copies).",
    ),
    "rl_trace_step_gpu_seconds": (
        "gauge",
        "GPU time of a rank in a stage of the latest step, by kind (busy, compute, comm, memory, idle).",
    ),
    "rl_trace_step_staleness_max_lag_steps": (
        "gauge",
        "Largest lag, in policy versions, of a sample the trainer consumed in the latest step.",
    ),
    "rl_trace_step_staleness_mean_lag_steps": (
        "gauge",
        "Mean lag, in policy versions, of the samples the trainer consumed in the latest step.",
    ),
    "rl_trace_step_staleness_samples": (
        "gauge",
        "Samples of known policy version the trainer consumed in the latest step.",
    ),
}
GPU_KINDS = ("busy", "compute", "comm", "memory", "idle")


def _one(fig: dict[str, Any], key: str) -> dict[str, Any] | None:
    rows = fig.get(key) or []
    return rows[0] if rows else None


def step_samples(record: dict[str, Any]) -> dict[str, list[Sample]]:
    """The ``rl_trace_step_*`` samples of one answered step (name -> [(labels, value)])."""
    fig = record.get("figures") or {}
    out: dict[str, list[Sample]] = defaultdict(list)
    row = _one(fig, "steps")
    if row is not None:
        out["rl_trace_step_duration_seconds"].append(({}, row["dur_ns"] / NS))
        for role in row.get("roles", []):
            for stage, ns in sorted(role.get("mean_ns", {}).items()):
                out["rl_trace_step_stage_seconds"].append(({"role": role["role"], "stage": stage}, ns / NS))
    idle = _one(fig, "idle.steps")
    if idle is not None:
        causes: dict[tuple[str, str], int] = defaultdict(int)
        for lane in idle.get("lanes", []):
            for cause, ns in lane.get("causes_ns", {}).items():
                causes[(lane["role"], cause)] += ns
        for (role, cause), ns in sorted(causes.items()):
            out["rl_trace_step_idle_seconds"].append(({"role": role, "cause": cause}, ns / NS))
    lags: dict[tuple[str, str], int] = {}
    for s in fig.get("stragglers", []):
        key = (s["role"], s["stage"])
        lags[key] = max(lags.get(key, 0), s["lag_ns"])
    for (role, stage), ns in sorted(lags.items()):
        out["rl_trace_step_straggler_lag_seconds"].append(({"role": role, "stage": stage}, ns / NS))
    path = _one(fig, "critical_path")
    if path is not None:
        for stage, ns in sorted(path.get("by_stage_ns", {}).items()):
            out["rl_trace_step_critical_path_seconds"].append(({"stage": stage}, ns / NS))
    _rollout(fig, row, out)
    _weight_sync(fig, out)
    _gpu(fig, out)
    _staleness(fig, out)
    for eng in fig.get("telemetry.engines", []):
        labels = {"replica": str(eng.get("replica"))}
        for name, key in (
            ("rl_trace_step_engine_requests_running", "running_mean"),
            ("rl_trace_step_engine_requests_waiting", "waiting_mean"),
            ("rl_trace_step_engine_kv_cache_usage_ratio", "kv_cache_max"),
        ):
            if isinstance(eng.get(key), int | float):
                out[name].append((labels, float(eng[key])))
    return dict(out)


def _rollout(fig: dict[str, Any], row: dict[str, Any] | None, out: dict[str, list[Sample]]) -> None:
    ro = _one(fig, "rollout.steps")
    if ro is None:
        return
    out["rl_trace_step_rollout_requests"].append(({}, float(ro.get("requests", 0))))
    for q, ns in sorted((ro.get("latency_ns") or {}).items()):
        if q.startswith("p") and isinstance(ns, int | float):
            out["rl_trace_step_rollout_latency_seconds"].append(
                ({"quantile": str(int(q[1:]) / 100)}, ns / NS)
            )
    tail = ro.get("tail") or {}
    if row is not None and row.get("dur_ns") and isinstance(tail.get("dur_ns"), int | float):
        out["rl_trace_step_rollout_tail_ratio"].append(({}, tail["dur_ns"] / row["dur_ns"]))


def _weight_sync(fig: dict[str, Any], out: dict[str, list[Sample]]) -> None:
    syncs = fig.get("rollout.weight_sync.syncs") or []
    if not syncs:
        return
    out["rl_trace_step_weight_sync_seconds"].append(({}, sum(s.get("dur_ns") or 0 for s in syncs) / NS))
    per: dict[str, int] = defaultdict(int)
    for s in syncs:
        for r in s.get("replicas") or []:
            per[str(r.get("replica"))] += r.get("dur_ns") or 0
    for replica, ns in sorted(per.items()):
        out["rl_trace_step_weight_sync_replica_seconds"].append(({"replica": replica}, ns / NS))


def _gpu(fig: dict[str, Any], out: dict[str, list[Sample]]) -> None:
    """Per rank and device: the step's busy share, and each stage's GPU time by kind (``gpu.rows``;
    the stage ``all`` is the whole step window, ``none`` its time outside every stage span)."""
    for r in fig.get("gpu.rows") or []:
        who = {"role": str(r.get("role")), "rank": str(r.get("rank")), "device": str(r.get("device"))}
        if r.get("scope") == "step" and r.get("wall_ns"):
            out["rl_trace_step_gpu_busy_ratio"].append((who, (r.get("busy_ns") or 0) / r["wall_ns"]))
        for kind in GPU_KINDS:
            if isinstance(r.get(f"{kind}_ns"), int | float):
                labels = {**who, "stage": str(r.get("stage")), "kind": kind}
                out["rl_trace_step_gpu_seconds"].append((labels, r[f"{kind}_ns"] / NS))


def _staleness(fig: dict[str, Any], out: dict[str, list[Sample]]) -> None:
    """Over every batch the trainer consumed in the step (``rollout.staleness``: samples per lag)."""
    counts: dict[int, int] = defaultdict(int)
    for r in fig.get("rollout.staleness") or []:
        for lag, n in (r.get("lag_steps") or {}).items():
            if str(lag).lstrip("-").isdigit() and isinstance(n, int):
                counts[int(lag)] += n
    total = sum(counts.values())
    if not total:
        return
    out["rl_trace_step_staleness_samples"].append(({}, float(total)))
    out["rl_trace_step_staleness_max_lag_steps"].append(({}, float(max(k for k, n in counts.items() if n))))
    mean = sum(k * n for k, n in counts.items()) / total
    out["rl_trace_step_staleness_mean_lag_steps"].append(({}, mean))


def exposition(status: dict[str, Any]) -> str:
    """The whole ``/metrics`` page for the watch's status (:meth:`..watch.Watch.status`)."""
    steps = status.get("steps") or []
    samples: dict[str, list[Sample]] = defaultdict(list)
    samples["rl_trace_watch_steps_answered_total"].append(({}, float(len(steps))))
    samples["rl_trace_watch_steps_corrected_total"].append(
        ({}, float(sum(1 for s in steps if s.get("corrected"))))
    )
    samples["rl_trace_watch_bad_lines_total"].append(
        ({}, float((status.get("bad_lines") or {}).get("total", 0)))
    )
    if steps:
        latest = max(steps, key=lambda s: s["step"])
        samples["rl_trace_watch_last_step"].append(({}, float(latest["step"])))
        samples["rl_trace_watch_answer_seconds"].append(({}, float(latest.get("answer_s", 0.0))))
        for name, rows in step_samples(latest).items():
            samples[name].extend(rows)
    lines: list[str] = []
    for name, (kind, help_text) in FAMILIES.items():
        if name not in samples:
            continue
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{_labels(labels)} {_value(v)}" for labels, v in samples[name])
    return "\n".join(lines) + "\n"


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))
