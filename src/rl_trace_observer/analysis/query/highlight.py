"""The critical path drawn into a merged trace: ``rl-trace report RUN --critical-path OUT.json.gz``.

OUT is the merged Chrome JSON trace with two additions, so Perfetto shows the path where the spans are:

- a process ``critical path`` (pid :data:`PID`) with one thread ``critical path``: one slice per
  path segment (``<span> @ <role>/<lane>``, or ``gap`` where no stage span ran), args
  ``{step, role, lane, stage, dur_ns}``;
- a flow chain (category ``critical_path``) from each path span to the next one, bound to the spans
  themselves in their own processes: follow the arrows across trainer, replicas and driver.

The input is copied byte for byte (our writer ends the file with ``]}``: the events go in before it),
so nothing else changes. Span shards or a ``.pftrace`` with shards are first written as a ``.json.gz``
view of every row (:mod:`rl_trace_observer.merge.views.view`). Times: the summary's ns relative to the
trace's base, written as µs with 3 decimals, as the merge writes them.
"""

from __future__ import annotations

import contextlib
import gzip
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from ...common.atomic import atomic_output
from ...merge.shards.layout import is_shards_dir
from ..report.inputs import InputError, resolve

PID = 999_999_999  # above every merged pid (the merger numbers processes from 256 in steps of 256)
TID = 1
FLOW_ID_BASE = (1 << 53) - (1 << 32)  # above every namespaced flow id (namespace << 40, < 8191 files)
TAIL = b"]}"


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


def path_events(paths: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The critical-path process, its slices and the flow chain, as Chrome JSON events."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": "critical path"}},
        {"ph": "M", "name": "process_sort_index", "pid": PID, "tid": 0, "args": {"sort_index": -1}},
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": TID, "args": {"name": "critical path"}},
    ]
    flow = FLOW_ID_BASE
    for p in paths:
        prev: dict[str, Any] | None = None
        for seg in p["segments"]:
            start = p["start_ns"] + seg["start_ns"]
            where = f" @ {seg['role']}/{seg['lane']}" if seg["lane"] is not None else ""
            events.append(
                {
                    "ph": "X",
                    "cat": "critical_path",
                    "name": f"{seg['name']}{where}",
                    "pid": PID,
                    "tid": TID,
                    "ts": _us(start),
                    "dur": _us(seg["dur_ns"]),
                    "args": {
                        "step": p["step"],
                        "role": seg["role"],
                        "lane": seg["lane"],
                        "stage": seg["stage"],
                        "dur_ns": seg["dur_ns"],
                    },
                }
            )
            if seg["trace_pid"] is None or seg["dur_ns"] < 2:
                continue
            if prev is not None:
                flow += 1
                end = p["start_ns"] + prev["start_ns"] + prev["dur_ns"]
                common = {"cat": "critical_path", "name": "critical path", "id": flow}
                events.append(
                    {
                        "ph": "s",
                        **common,
                        "pid": prev["trace_pid"],
                        "tid": prev["trace_tid"],
                        "ts": _us(end - 1),
                    }
                )
                events.append(
                    {
                        "ph": "f",
                        "bp": "e",
                        **common,
                        "pid": seg["trace_pid"],
                        "tid": seg["trace_tid"],
                        "ts": _us(start + 1),
                    }
                )
            prev = seg
    return events


@contextlib.contextmanager
def merged_json(path: str | Path) -> Iterator[Path]:
    """A merged Chrome JSON trace of ``path``: itself, or a view written from its span shards."""
    p = Path(path)
    if p.is_file() and p.name.endswith((".json", ".json.gz")):
        yield p
        return
    if p.is_dir() and not is_shards_dir(p):
        raise InputError(
            f"{p}: give the merged trace (.json.gz) or its span shards to draw the critical path"
        )
    with resolve(p) as src:
        if src.shards is None:
            raise InputError(f"{p}: no span shards to draw the critical path from; give the .json.gz")
        from ...merge.options import MergeOptions
        from ...merge.views.view import merge_view

        tmp = Path(tempfile.mkdtemp(prefix="rl-trace-path-"))
        try:
            out = tmp / "view.json.gz"
            result = merge_view(str(src.shards), str(out), MergeOptions())
            if not result.written:
                raise InputError(f"{src.shards}: the span shards hold no rows")
            yield out
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _reader(path: Path) -> Any:
    with path.open("rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else path.open("rb")


def write_with_path(trace: Path, paths: list[dict[str, Any]], output: Path) -> int:
    """Copy ``trace`` to ``output`` (gzip when it ends in ``.gz``) with the path's events added;
    returns how many were added. Raises ``InputError`` when the file does not end as ours do."""
    extra = b",\n" + b",\n".join(orjson.dumps(e) for e in path_events(paths)) + b"\n"
    keep = b""
    with _reader(trace) as src, atomic_output(output) as raw:
        dst: Any = (
            gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) if output.name.endswith(".gz") else raw
        )
        try:
            while block := src.read(8 << 20):
                data = keep + block
                dst.write(data[:-64])
                keep = data[-64:]
            body = keep.rstrip()
            if not body.endswith(TAIL):
                raise InputError(
                    f"{trace}: not a trace written by rl-trace merge (it does not end with ']}}')"
                )
            head = body[: -len(TAIL)].rstrip()
            dst.write(head + (extra[1:] if head.endswith(b"[") else extra) + TAIL + b"\n")
        finally:
            if dst is not raw:
                dst.close()
    return len(path_events(paths))
