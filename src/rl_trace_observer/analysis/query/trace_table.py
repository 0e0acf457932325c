"""A merged Chrome JSON trace (``.json``/``.json.gz``) → one Parquet file in the span table's schema,
for ``rl-trace sql`` on a trace merged without ``--shards``.

Two streaming passes (:mod:`..report.stream`, a few MB at a time): the first reads the process and
thread names (the merge writes ``host · pid N · role rank R (actor) [· device]`` and ``Source · lane``),
the second writes rows in batches. What a Chrome JSON file does not keep is null: ``run``, ``step``
(``stage_spans`` takes its step from the windows), flow and async ids, ``artifact``, ``job`` (the
file's order is in ``ordinal``). Span shards are the exact and fast path; this is the fallback.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
from msgspec import UNSET

from ...common.atomic import atomic_output
from ...merge.shards.arrow import parquet, pyarrow
from ...merge.shards.schema import NAMES, arrow_schema
from ...merge.timeline.model import us_to_ns
from ..report.load import TraceError, open_binary
from ..report.stream import EventStream, NotStreamable

BATCH = 200_000
_WHO = re.compile(r"^(?P<role>[A-Za-z][\w.-]*)(?:\s+(?:rank|replica)\s+(?P<rank>\d+))?")
_RANKED = re.compile(r"\srank\s+\d+")


def _process(label: str) -> tuple[str | None, int | None, str | None, int | None, str | None]:
    """(host, pid, role, rank, device) from a merged process name."""
    parts = [p.strip() for p in label.split(" · ")]
    host = parts[0] if parts else None
    pid = int(parts[1][4:]) if len(parts) > 1 and re.fullmatch(r"pid \d+", parts[1]) else None
    role = rank = device = None
    if len(parts) > 2:
        m = _WHO.match(parts[2])
        if m and not parts[2].startswith("clock"):
            role = m.group("role")
            rank = int(m.group("rank")) if m.group("rank") and _RANKED.search(parts[2]) else None
    if len(parts) > 3:
        device = parts[-1]
    return host, pid, role, rank, device


def _names(
    path: Path,
) -> tuple[dict[Any, tuple[Any, ...]], dict[tuple[Any, Any], tuple[str, str | None]], int]:
    procs: dict[Any, tuple[Any, ...]] = {}
    threads: dict[tuple[Any, Any], tuple[str, str | None]] = {}
    with open_binary(path) as f:
        stream = EventStream(f)
        for events in stream.chunks():
            for ev in events:
                if ev.ph != "M" or _unset(ev.args):
                    continue
                args = orjson.loads(bytes(ev.args))
                label = args.get("name") if isinstance(args, dict) else None
                if not isinstance(label, str):
                    continue
                if ev.name == "process_name":
                    procs[ev.pid] = _process(label)
                elif ev.name == "thread_name":
                    source, sep, lane = label.partition(" · ")
                    threads[(ev.pid, ev.tid)] = (source, lane if sep else None)
    header = stream.metadata.get("rl_trace_observer") or {}
    return procs, threads, int(header.get("base_ns") or 0)


def convert(path: Path, output: Path) -> int:
    """Write ``output``; returns the trace's ``base_ns``. Raises ``TraceError`` naming the file."""
    try:
        procs, threads, base_ns = _names(path)
        pa, pq = pyarrow(), parquet()
        schema = arrow_schema()
        with atomic_output(output) as tmp, pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            cols: dict[str, list[Any]] = {n: [] for n in NAMES}
            ordinal = 0
            with open_binary(path) as f:
                for events in EventStream(f).chunks():
                    for ev in events:
                        if ev.ph == "M" or ev.ts is None:
                            continue
                        _row(cols, ev, procs, threads, base_ns, ordinal)
                        ordinal += 1
                        if len(cols["ts_ns"]) >= BATCH:
                            writer.write_table(pa.table(cols, schema=schema))
                            cols = {n: [] for n in NAMES}
            writer.write_table(pa.table(cols, schema=schema))
    except NotStreamable as exc:
        raise TraceError(f"{path}: cannot read this trace for SQL ({exc}); merge with --shards DIR") from None
    except (OSError, ValueError) as exc:
        raise TraceError(f"{path}: cannot convert to a span table ({exc})") from None
    return base_ns


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _row(
    cols: dict[str, list[Any]],
    ev: Any,
    procs: dict[Any, tuple[Any, ...]],
    threads: dict[tuple[Any, Any], tuple[str, str | None]],
    base_ns: int,
    ordinal: int,
) -> None:
    host, pid, role, rank, device = procs.get(ev.pid, (None, None, None, None, None))
    source, lane = threads.get((ev.pid, ev.tid), ("Trace", None))
    args = None if _unset(ev.args) else bytes(ev.args).decode("utf-8", "replace")
    values = {
        "run": None,
        "host": host,
        "pid": pid,
        "role": role,
        "rank": rank,
        "step": None,
        "source": source,
        "lane": lane,
        "device": device,
        "name": ev.name if isinstance(ev.name, str) else str(ev.name),
        "category": ev.cat if isinstance(ev.cat, str) else None,
        "ph": ev.ph,
        "ts_ns": base_ns + us_to_ns(ev.ts),
        "dur_ns": us_to_ns(ev.dur) if ev.ph == "X" and ev.dur is not None else None,
        "flow_out_id": None,
        "flow_in_id": None,
        "async_id": None,
        "args": args,
        "extra": None,
        "trace_pid": _int(ev.pid),
        "trace_tid": _int(ev.tid),
        "artifact": None,
        "job": None,
        "ordinal": ordinal,
    }
    for name, value in values.items():
        cols[name].append(value)


def _unset(value: Any) -> bool:
    return value is UNSET or value is None
