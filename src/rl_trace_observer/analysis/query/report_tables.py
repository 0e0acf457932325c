"""The report's own rows as ``rl-trace sql`` tables: ``steps``, ``stage_spans``, ``kernels``, ``gpu_time``.

One definition: the tables are filled from the report's computation on the same input
(:func:`..report.compute.model` over :mod:`..report.shards` or :mod:`..report.load`), never
re-derived in SQL, so a trace without RL-Insight spans has the steps and stage spans the report
shows (its ``ProfilerStep#N`` windows, or none), and ``gpu_time`` holds exactly the report's
``gpu.rows``. They are built only when a query names them (reading the run for the report costs
what ``rl-trace report`` costs); ``spans`` and ``trace`` are views over the shards as before.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from ..gpu.breakdown import FIGURES
from ..gpu.section import KERNEL_COLUMNS, kernel_columns
from ..report.compute import Model, model, process_identity
from ..report.load import TraceData
from ..report.stages import classify

__all__ = ["TABLES", "create", "named_in"]

TABLES = ("steps", "stage_spans", "kernels", "gpu_time")
_NAMED = re.compile(r"\b(" + "|".join(TABLES) + r")\b", re.IGNORECASE)
_TYPES = {"int": "int64", "str": "string"}
STEP_COLUMNS = {"step": "int", "start_ns": "int", "end_ns": "int", "dur_ns": "int"}
STAGE_COLUMNS = {
    "run": "str", "host": "str", "pid": "int", "role": "str", "rank": "int", "step": "int", "lane": "str",
    "name": "str", "stage": "str", "category": "str", "ts_ns": "int", "dur_ns": "int", "end_ns": "int",
    "source": "str", "args": "str",
}  # fmt: skip
KERNEL_TYPES = {c: "str" for c in KERNEL_COLUMNS} | {
    c: "int" for c in ("step", "rank", "stream", "ts_ns", "dur_ns", "launch_ts_ns", "correlation",
                       "trace_pid", "trace_tid")
}  # fmt: skip
GPU_COLUMNS = {"scope": "str", "step": "int", "role": "str", "rank": "int", "host": "str", "device": "str",
               "stage": "str"} | dict.fromkeys(FIGURES, "int")  # fmt: skip


_SAMPLES = re.compile(r"\bsamples\b", re.IGNORECASE)


def named_in(query: str) -> set[str]:
    """The report tables a query mentions (by word; a false hit only costs time); ``samples`` (the
    metric sampler's points, with the step window each falls in) needs ``steps``."""
    named = {m.group(1).lower() for m in _NAMED.finditer(query)}
    return named | {"steps"} if _SAMPLES.search(query) else named


def create(con: Any, load: Callable[[], TraceData], base_ns: int, run: str | None, wanted: set[str]) -> None:
    """Create the ``wanted`` tables on ``con`` (all four when asked for all)."""
    if not wanted:
        return
    data = load()
    m = model(data)
    builders = {
        "steps": lambda: _steps(m, base_ns),
        "stage_spans": lambda: _stage_spans(m, data, base_ns, run),
        "kernels": lambda: (kernel_columns(m.gpu, base_ns), KERNEL_TYPES),
        "gpu_time": lambda: _gpu_time(m),
    }
    for name in TABLES:
        if name in wanted:
            columns, types = builders[name]()
            _register(con, name, columns, types)


def _register(con: Any, name: str, columns: dict[str, list[Any]], types: dict[str, str]) -> None:
    import pyarrow as pa

    schema = pa.schema([(c, _TYPES[t]) for c, t in types.items()])
    table = pa.table({c: columns[c] for c in types}, schema=schema)
    con.register(f"_report_{name}", table)
    con.execute(f"CREATE TABLE {name} AS SELECT * FROM _report_{name}")
    con.unregister(f"_report_{name}")


def _steps(m: Model, base_ns: int) -> tuple[dict[str, list[Any]], dict[str, str]]:
    cols: dict[str, list[Any]] = {c: [] for c in STEP_COLUMNS}
    for w in m.windows:
        values = (w.step, base_ns + w.start_ns, base_ns + w.end_ns, w.end_ns - w.start_ns)
        for c, v in zip(STEP_COLUMNS, values, strict=True):
            cols[c].append(v)
    return cols, STEP_COLUMNS


def _step_of(m: Model, ts: int) -> int | None:
    for w in m.windows:
        if w.start_ns <= ts < w.end_ns:
            return w.step
    return None


def _stage_spans(
    m: Model, data: TraceData, base_ns: int, run: str | None
) -> tuple[dict[str, list[Any]], dict[str, str]]:
    cols: dict[str, list[Any]] = {c: [] for c in STAGE_COLUMNS}
    for who in m.idx.whos:
        for s in m.idx.spans_of[who]:
            _, rank, host = process_identity(data, s.pid)
            label = data.process_names.get(s.pid, "")
            pid = re.search(r"·\s*pid (\d+)", label)
            thread = data.thread_names.get((s.pid, s.tid), "")
            values = (
                run, host, int(pid.group(1)) if pid else None, who.role, rank, _step_of(m, s.start_ns),
                who.lane, s.name, classify(s.name), s.cat, base_ns + s.start_ns, s.dur_ns,
                base_ns + s.end_ns, thread.split(" · ", 1)[0] if " · " in thread else None,
                orjson.dumps(s.args).decode() if s.args else None,
            )  # fmt: skip
            for c, v in zip(STAGE_COLUMNS, values, strict=True):
                cols[c].append(v)
    return cols, STAGE_COLUMNS


def _gpu_time(m: Model) -> tuple[dict[str, list[Any]], dict[str, str]]:
    cols: dict[str, list[Any]] = {c: [r[c] for r in m.gpu.rows] for c in GPU_COLUMNS}
    return cols, GPU_COLUMNS
