"""One GPU computation for the report's ``gpu`` section and the ``kernels`` / ``gpu_time`` tables.

Rows (the same dicts in the JSON and in SQL), per device (a GPU sub-process of one OS process):

- scope ``run``: every kernel of the device — HTA's per-rank view (wall = first kernel start to
  last kernel end); with the device's per-stream idle split (HTA's own table) and top kernels;
- scope ``step``: the kernels the step launched (stage ``all``); wall = the step window joined with
  their busy time. Kernels outside every step window: step ``None``, wall = their own span;
- scope ``stage``: the kernels one stage category launched in the step; wall = the process's
  spans of that stage inside the step window joined with their busy time (stage ``none``: the
  window's time in no stage span).
"""

from __future__ import annotations

from array import array
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..answers import intervals as iv
from .attribute import NONE, RULES, Attribution, StageSpan, attribute, owner_of
from .breakdown import (
    KERNEL_WAIT_BELOW_NS,
    Columns,
    Pieces,
    columns,
    figures,
    name_totals,
    stream_idle,
    top_kernels,
)  # fmt: skip
from .loops import UNKNOWN, native
from .store import KernelStore

__all__ = ["ALL", "STAGE_ORDER", "GpuResult", "analyze", "kernel_columns", "section"]

ALL = "all"
STAGE_ORDER = ("generation", "log_prob", "update", "weight_sync", "other", NONE)
TOP_PER_DEVICE = 5
TOP_RUN = 15
Who = Callable[[Any], tuple[str, int | None, str | None]]  # owner pid → (role, rank, host)


@dataclass
class GpuResult:
    store: KernelStore
    at: Attribution
    windows: Sequence[tuple[Any, int, int]]
    devices: dict[int, dict[str, Any]]  # interned GPU pid → role, rank, host, device, owner
    rows: list[dict[str, Any]] = field(default_factory=list)
    details: list[dict[str, Any]] = field(default_factory=list)
    top: list[dict[str, Any]] = field(default_factory=list)
    busy: dict[tuple[int, int], Pieces] = field(default_factory=dict)  # (device, window): starts, ends


def _device_label(name: str | None, pid: Any) -> str:
    if name and "·" in name:
        return name.rsplit("·", 1)[-1].strip()
    return name or f"GPU {pid}"


def _order(store: KernelStore, at: Attribution) -> dict[int, array]:  # type: ignore[type-arg]
    """Kernel indices per device, each by (start, launch, index): the order every figure walks;
    devices in the order of their first kernel (by the same key)."""
    loops = native()
    idx = loops.order_kernels(store.k_pid, store.k_ts, at.launch_ts)
    runs = loops.group(loops.take(store.k_pid, idx))  # one run of positions per device
    first = {p: idx[pos[0]] for p, pos in runs.items()}
    ts, launch = store.k_ts, at.launch_ts
    devices = sorted(runs, key=lambda p: (ts[first[p]], launch[first[p]], first[p]))
    return {p: idx[runs[p][0] : runs[p][-1] + 1] for p in devices}


def _cpu_sets(stage_spans: Sequence[StageSpan], merged: bool) -> dict[tuple[Any, str], list[iv.Interval]]:
    per: dict[tuple[Any, str], list[iv.Interval]] = defaultdict(list)
    for s in stage_spans:
        owner = owner_of(s.pid, merged)
        per[(owner, s.category)].append((s.start_ns, s.end_ns))
        per[(owner, "*")].append((s.start_ns, s.end_ns))
    return {k: iv.union(v) for k, v in per.items()}


def analyze(
    store: KernelStore,
    windows: Sequence[tuple[Any, int, int]],
    stage_spans: Sequence[StageSpan],
    own_windows: dict[Any, list[tuple[int, int, int]]] | None = None,
    *,
    who: Who,
    process_names: dict[Any, str],
    merged: bool,
    threshold_ns: int = KERNEL_WAIT_BELOW_NS,
) -> GpuResult:
    at = attribute(store, windows, stage_spans, merged, own_windows or {})
    devices = {}
    for p in sorted(set(store.k_pid)):
        pid = store.value(p)
        owner = at.owner[p]
        role, rank, host = who(owner)
        label = _device_label(process_names.get(pid), pid)
        devices[p] = {"role": role, "rank": rank, "host": host, "device": label, "owner": owner}
    result = GpuResult(store, at, windows, devices)
    per_device = _order(store, at)
    cpu_sets = _cpu_sets(stage_spans, merged) if per_device else {}

    def key(p: int) -> tuple[Any, ...]:
        d = devices[p]
        return (d["role"], d["rank"] is None, d["rank"] or 0, d["device"])

    every = [array("q", [0]) * len(store.names) for _ in range(3)]
    for p in sorted(per_device, key=key):
        order = per_device[p]
        ident = {k: devices[p][k] for k in ("role", "rank", "host", "device")}
        cols = columns(order, store, at)
        run, _ = figures(cols, None, threshold_ns)
        result.rows.append({"scope": "run", "step": None, **ident, "stage": ALL, **run})
        totals = name_totals(order, store)
        _add_totals(every, totals)
        result.details.append(
            {**ident, "streams": stream_idle(order, store, at, threshold_ns),
             "top_kernels": top_kernels(totals, store, TOP_PER_DEVICE)}
        )  # fmt: skip
        _step_rows(result, p, order, cols, ident, cpu_sets, threshold_ns)
    result.top = top_kernels((every[0], every[1], every[2]), store, TOP_RUN)
    result.rows.sort(key=lambda r: (r["scope"] != "run", r["step"] is None, r["step"] or 0))
    return result


def _add_totals(into: list[array], totals: tuple[array, array, array]) -> None:  # type: ignore[type-arg]
    count, total, longest = totals
    for n in range(len(count)):
        if count[n]:
            into[0][n] += count[n]
            into[1][n] += total[n]
            into[2][n] = max(into[2][n], longest[n])


def _step_rows(
    result: GpuResult,
    p: int,
    order: array,  # type: ignore[type-arg]
    cols: Columns,
    ident: dict[str, Any],
    cpu_sets: dict[tuple[Any, str], list[iv.Interval]],
    threshold_ns: int,
) -> None:
    at, loops = result.at, native()
    by_window = loops.group(loops.take(at.window, order))  # positions in ``order``
    categories: dict[str, int] = {}
    category_of = array("q", [categories.setdefault(c, len(categories)) for c, _ in at.stages])
    names = list(categories)
    stage_category = loops.take(category_of, loops.take(at.stage, order))  # per position
    owner = result.devices[p]["owner"]
    for w in sorted(by_window, key=lambda w: (w < 0, w)):
        positions = by_window[w]
        step, lo, hi = result.windows[w] if w >= 0 else (None, 0, 0)
        sub = cols.subset(positions) if len(positions) < len(order) else cols
        step_fig, busy = figures(sub, [(lo, hi)] if w >= 0 else None, threshold_ns)
        result.busy[(p, w)] = busy
        result.rows.append({"scope": "step", "step": step, **ident, "stage": ALL, **step_fig})
        grouped = loops.group(loops.take(stage_category, positions))
        by_stage = {names[c]: ks for c, ks in grouped.items()}
        for name in sorted(by_stage, key=_stage_key):
            cpu = None
            if w >= 0:
                mine = cpu_sets.get((owner, "*" if name == NONE else name), [])
                clipped = iv.clip(mine, lo, hi)
                cpu = iv.subtract([(lo, hi)], clipped) if name == NONE else clipped
            part = sub.subset(by_stage[name]) if len(by_stage) > 1 else sub
            fig, _ = figures(part, cpu, threshold_ns)
            result.rows.append({"scope": "stage", "step": step, **ident, "stage": name, **fig})


def _stage_key(stage: str) -> tuple[int, str]:
    return (STAGE_ORDER.index(stage) if stage in STAGE_ORDER else len(STAGE_ORDER), stage)


def section(result: GpuResult | None, untracked: int = 0) -> dict[str, Any] | None:
    """The report's ``gpu`` key (docs/FORMATS.md §10); None when the trace has no Kineto GPU work."""
    if result is None or not len(result.store):
        return None
    at, store = result.at, result.store
    rules = {rule: at.rule.count(r) for r, rule in enumerate(RULES)}
    kinds = {"compute": 0, "comm": 0, "memory": 0}
    for n, count in enumerate(name_totals(range(len(store)), store)[0]):
        kinds[store.kinds[n]] += count
    return {
        "kernels": len(store),
        "untracked_events": untracked,
        "rules": rules,
        "no_stage": at.stage.count(0),
        "no_step": at.window.count(-1),
        "kinds": kinds,
        "kernel_wait_below_ns": KERNEL_WAIT_BELOW_NS,
        "rows": result.rows,
        "devices": result.details,
        "top_kernels": result.top,
    }


def kernel_columns(result: GpuResult, base_ns: int) -> dict[str, list[Any]]:
    """One row per kernel (the ``kernels`` SQL table), absolute ns like the span table."""
    store, at, devices = result.store, result.at, result.devices
    cols: dict[str, list[Any]] = {c: [] for c in KERNEL_COLUMNS}
    for i in range(len(store)):
        d = devices[store.k_pid[i]]
        w = at.window[i]
        category, name = at.stages[at.stage[i]]
        launch = at.launch_ts[i]
        values = (
            result.windows[w][0] if w >= 0 else None, d["host"], d["rank"], d["role"], d["device"],
            store.k_stream[i], store.names[store.k_name[i]], store.kinds[store.k_name[i]],
            base_ns + store.k_ts[i], store.k_dur[i], None if launch == UNKNOWN else base_ns + launch,
            category, None if name == NONE else name, RULES[at.rule[i]],
            store.k_corr[i] if store.k_corr[i] >= 0 else None,
            store.value(store.k_pid[i]), store.value(store.k_tid[i]),
        )  # fmt: skip
        for c, v in zip(KERNEL_COLUMNS, values, strict=True):
            cols[c].append(v)
    return cols


KERNEL_COLUMNS = (
    "step", "host", "rank", "role", "device", "stream", "name", "kind", "ts_ns", "dur_ns", "launch_ts_ns",
    "stage", "stage_name", "rule", "correlation", "trace_pid", "trace_tid",
)  # fmt: skip
