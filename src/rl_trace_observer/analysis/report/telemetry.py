"""The report's ``telemetry`` section: engines, GPUs and hosts as the metric sampler saw them.

Fed by the counter tracks of metric samples files (category ``metrics.*``, docs/metrics.md): step
functions, each point holding until the next. Definitions (key ``telemetry`` of the summary, added to
``rl-trace-report/3`` as an additive change):

- **engines**, per step and replica (the process its tracks are under): time-weighted mean and max
  of running and waiting requests over the step window (``samples_in_step``: how many gauge samples
  fell inside it; with none, the figures are the value held from the last sample before the step,
  and the tables say ``no sample``), max KV-cache use, preemptions, and prompt /
  generation tokens counted by the engine in the window, with tokens/s over the window. Sampling
  brackets the count: ``*_tokens_low`` counts only sampling intervals wholly inside the window,
  ``*_tokens_high`` every interval that overlaps it; the estimate apportions the edge intervals
  linearly. Next to them the same figures from our request spans (the rollout section's replica rows);
  ``disagrees`` when the spans' count lies outside the engine's bracket by more than
  :data:`SLACK_PCT` — the engine and the spans then do not count the same work.
- **gpus**, per step, role and stage: GPU utilisation (NVML's "a kernel ran" share) time-weighted over
  the role's stage spans on the GPUs its processes used, and the highest memory used in them.
- **host_cpu**, per step, role and stage: the host's CPU busy share, time-weighted the same way.
- **gpu_note**: why there are no GPU rows (the sampler's reason: no NVML, no GPU), when there are none.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from ..answers.model import StepWindow, WorkSpan

SLACK_PCT = 5.0
METRICS_CAT = "metrics."
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
KV = ("vllm:kv_cache_usage_perc", "sglang:token_usage")
PREEMPT = ("vllm:num_preemptions /s",)
PROMPT = ("vllm:prompt_tokens /s", "sglang:prompt_tokens /s")
GENERATION = ("vllm:generation_tokens /s", "sglang:generation_tokens /s")
GPU_UTIL, GPU_MEM, HOST_CPU = "gpu_utilization_percent", "gpu_memory_used_bytes", "host_cpu_percent"
_REPLICA = re.compile(r"replica[ _]?(\d+)")

Points = list[tuple[int, float]]


def _value_at(points: Points, t: int) -> float | None:
    value = None
    for ts, v in points:
        if ts > t:
            break
        value = v
    return value


def time_mean(points: Points, lo: int, hi: int) -> float | None:
    """Time-weighted mean of a step function over ``[lo, hi)``; only where it has a value."""
    total = weight = 0.0
    for i, (ts, v) in enumerate(points):
        end = points[i + 1][0] if i + 1 < len(points) else hi
        a, b = max(ts, lo), min(end, hi)
        if b > a:
            total += v * (b - a)
            weight += b - a
    return total / weight if weight else None


def peak(points: Points, lo: int, hi: int) -> float | None:
    values = [v for ts, v in points if lo <= ts < hi]
    held = _value_at(points, lo)
    if held is not None:
        values.append(held)
    return max(values) if values else None


def bracket(points: Points, lo: int, hi: int) -> tuple[float, float, float]:
    """A rate track (points at interval starts, each interval ending at the next point) over
    ``[lo, hi)``: (intervals wholly inside, linear share of the overlapping ones, all overlapping)."""
    low = mid = high = 0.0
    for i, (ts, rate) in enumerate(points[:-1]):
        end = points[i + 1][0]
        amount = rate * (end - ts) / 1e9
        a, b = max(ts, lo), min(end, hi)
        if b <= a:
            continue
        high += amount
        mid += amount * (b - a) / (end - ts)
        if ts >= lo and end <= hi:
            low += amount
    return low, mid, high


def _series(counters: Sequence[Any]) -> dict[tuple[Any, str], Points]:
    out: dict[tuple[Any, str], Points] = defaultdict(list)
    for c in counters:
        if getattr(c, "cat", "").startswith(METRICS_CAT):
            out[(c.pid, c.name)].append((c.ts_ns, c.value))
    for points in out.values():
        points.sort()
    return out


def _first(series: dict[tuple[Any, str], Points], pid: Any, names: Sequence[str]) -> Points | None:
    for name in names:
        if (pid, name) in series:
            return series[(pid, name)]
    return None


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _engine_row(series: dict[tuple[Any, str], Points], pid: Any, w: StepWindow) -> dict[str, Any]:
    lo, hi = w.start_ns, w.end_ns
    secs = (hi - lo) / 1e9
    row: dict[str, Any] = {}
    gauges = [p for p in (_first(series, pid, n) for n in (RUNNING, WAITING, KV)) if p]
    row["samples_in_step"] = max((sum(1 for ts, _ in pts if lo <= ts < hi) for pts in gauges), default=0)
    for key, names in (("running", RUNNING), ("waiting", WAITING)):
        pts = _first(series, pid, names) or []
        row[f"{key}_mean"], row[f"{key}_max"] = _round(time_mean(pts, lo, hi)), _round(peak(pts, lo, hi))
    row["kv_cache_max"] = _round(peak(_first(series, pid, KV) or [], lo, hi), 4)
    row["preemptions"] = _round(bracket(_first(series, pid, PREEMPT) or [], lo, hi)[1], 1)
    for key, names in (("prompt", PROMPT), ("generation", GENERATION)):
        low, mid, high = bracket(_first(series, pid, names) or [], lo, hi)
        row[f"{key}_tokens"], row[f"{key}_tokens_low"], row[f"{key}_tokens_high"] = (
            round(mid, 1),
            round(low, 1),
            round(high, 1),
        )
        row[f"{key}_tokens_per_s"] = round(mid / secs, 2) if secs > 0 else None
    return row


def _replica_of(name: str) -> int | None:
    m = _REPLICA.search(name)
    return int(m.group(1)) if m else None


def engines(
    series: dict[tuple[Any, str], Points],
    process_names: dict[Any, str],
    windows: Sequence[StepWindow],
    rollout: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    pids = sorted({pid for pid, name in series if name in RUNNING + GENERATION}, key=str)
    spans = {
        (st["step"], r["replica"]): r
        for st in (rollout or {}).get("steps") or []
        for r in st.get("replicas") or []
    }
    rows = []
    for w in windows:
        secs = (w.end_ns - w.start_ns) / 1e9
        for pid in pids:
            name = process_names.get(pid, str(pid))
            replica = _replica_of(name)
            row = {"step": w.step, "replica": replica, "process": name, **_engine_row(series, pid, w)}
            ours = spans.get((w.step, replica))
            if ours is not None:
                row["span_prompt_tokens"] = ours.get("prompt_tokens")
                row["span_generation_tokens"] = ours.get("response_tokens")
                got = ours.get("response_tokens") or 0
                row["span_generation_tokens_per_s"] = round(got / secs, 2) if secs > 0 else None
                slack = SLACK_PCT / 100 * max(got, row["generation_tokens_high"])
                low, high = row["generation_tokens_low"] - slack, row["generation_tokens_high"] + slack
                row["disagrees"] = not low <= got <= high
            rows.append(row)
    return rows


def _by_role_stage(
    series_of: dict[Any, list[Points]],
    spans: Sequence[WorkSpan],
    windows: Sequence[StepWindow],
    owner: Any,
) -> list[dict[str, Any]]:
    """Time-weighted mean (and max) of ``series_of[owner(span)]`` over each (step, role, stage);
    ``spans``: how many (span, series) pairs went into it."""
    acc: dict[tuple[Any, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, float("-inf"), 0.0])
    for s in spans:
        for pts in series_of.get(owner(s), []):
            step = next((w.step for w in windows if w.start_ns <= s.start_ns < w.end_ns), None)
            mean = time_mean(pts, s.start_ns, s.end_ns)
            if mean is None:
                continue
            a = acc[(step, s.role, s.stage)]
            a[0] += mean * (s.end_ns - s.start_ns)
            a[1] += s.end_ns - s.start_ns
            a[2] = max(a[2], peak(pts, s.start_ns, s.end_ns) or mean)
            a[3] += 1
    out = []
    for (step, role, stage), (total, weight, top, n) in sorted(acc.items(), key=lambda kv: str(kv[0])):
        if weight:
            row = {"step": step, "role": role, "stage": stage, "mean": round(total / weight, 2)}
            out.append({**row, "max": round(top, 2), "spans": int(n)})
    return out


def _owner(span: WorkSpan) -> Any:
    """The process a span ran in, as the owner of its ``GPU k`` sub-processes (low 8 bits clear)."""
    return span.pid & ~0xFF if isinstance(span.pid, int) else None


def telemetry_section(
    counters: Sequence[Any],
    process_names: dict[Any, str],
    windows: Sequence[StepWindow],
    spans: Sequence[WorkSpan],
    rollout: dict[str, Any] | None,
    sampled: Sequence[dict[str, Any]] = (),
) -> dict[str, Any] | None:
    """The ``telemetry`` section; None when the trace has no metric samples."""
    series = _series(counters)
    if not series and not sampled:
        return None
    gpu_util: dict[Any, list[Points]] = defaultdict(list)
    gpu_mem: dict[Any, list[Points]] = defaultdict(list)
    host_cpu: dict[str, list[Points]] = defaultdict(list)
    for (pid, name), pts in series.items():
        title = process_names.get(pid, "")
        if name == GPU_UTIL and isinstance(pid, int):
            gpu_util[pid & ~0xFF].append(pts)  # GPU k is a sub-process of the process using it
        elif name == GPU_MEM and isinstance(pid, int):
            gpu_mem[pid & ~0xFF].append(pts)
        elif name == HOST_CPU:
            host_cpu[title.split(" · ")[0]].append(pts)
    gpus = _by_role_stage(gpu_util, spans, windows, _owner)
    memory = {
        (r["step"], r["role"], r["stage"]): r["max"] for r in _by_role_stage(gpu_mem, spans, windows, _owner)
    }
    for r in gpus:
        r["memory_max_bytes"] = memory.get((r["step"], r["role"], r["stage"]))
    host_of = {pid: name.split(" · ")[0] for pid, name in process_names.items()}
    cpu = _by_role_stage(host_cpu, spans, windows, lambda s: host_of.get(s.pid))
    reasons = sorted(
        {str((m.get("gpus") or {}).get("reason")) for m in sampled if not (m.get("gpus") or {}).get("found")}
    )
    return {
        "engines": engines(series, process_names, windows, rollout),
        "gpus": gpus,
        "host_cpu": cpu,
        "gpu_note": None
        if gpu_util
        else ("no GPU was found: " + "; ".join(reasons) if reasons else "no GPU samples"),
        "slack_pct": SLACK_PCT,
    }
