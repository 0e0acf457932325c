"""The shard directory's document (``rl-trace-shards/1``) and the plan facts every job is given.

The document is what makes a directory of parts one table: which parts belong (a reader never
globs), the run's processes and threads as the merged trace names them (views and the report name
tracks the same way), the step windows, the trace header, and counts. docs/FORMATS.md §6.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ... import __version__
from ..plan.plan import Plan
from ..shards.layout import write_doc
from ..shards.schema import DOC_SCHEMA, NAMES, PARTITIONS, SPAN_SCHEMA
from ..timeline.identity import process_title

if TYPE_CHECKING:
    from ..job.stitch import RunState


def tracks(state: RunState) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Processes and threads exactly as the merged trace's metadata names them."""
    procs = []
    for pid, decl in sorted(state.processes.items()):
        key = decl.key
        procs.append(
            {
                "trace_pid": pid,
                "name": process_title(decl, state.titles),
                "sort_index": pid,
                "host": key.host if key is not None else None,
                "pid": key.pid if key is not None and key.pid >= 0 else None,
                "device": decl.sub,
            }
        )
    threads = [
        {"trace_pid": t.merged_pid, "trace_tid": t.merged_tid, "name": t.name, "sort_index": t.sort_index}
        for _, t in sorted(state.threads.items())
    ]
    return procs, threads


def build_doc(
    plan: Plan,
    state: RunState,
    manifest: dict[str, Any],
    parts: list[dict[str, Any]],
    header: dict[str, Any],
) -> dict[str, Any]:
    procs, threads = tracks(state)
    kept = int(manifest.get("counts", {}).get("events_kept", 0))
    files = sorted(parts, key=lambda p: (p["job"], p["path"]))
    return {
        "schema": DOC_SCHEMA,
        "span_schema": SPAN_SCHEMA,
        "columns": list(NAMES),
        "partitions": list(PARTITIONS),
        "tool": {"name": "rl-trace-observer", "version": __version__},
        "created_wall_ns": time.time_ns(),
        "trace": {
            "path": manifest.get("output", {}).get("path"),
            "format": manifest.get("output", {}).get("format"),
            "header": header,
            "events": kept + 2 * (len(procs) + len(threads)),  # + the process/thread metadata events
        },
        "base_ns": state.base_ns,
        "runs": sorted(plan.runs),
        "steps": {str(s): [lo, hi] for s, (lo, hi) in sorted(plan.step_windows.items())},
        "processes": procs,
        "threads": threads,
        "rows": sum(p["rows"] for p in files),
        "bytes": sum(p["bytes"] for p in files),
        "files": files,
    }


def finish(
    root: str,
    plan: Plan,
    state: RunState,
    manifest: dict[str, Any],
    parts: list[dict[str, Any]],
    header: dict[str, Any],
) -> dict[str, Any]:
    """Write the document (and the manifest copy); the manifest gets a ``shards`` section. Both carry
    one ``merge_id``: a reader that finds another id in the directory than its manifest names knows a
    later merge (killed before its output was committed, :mod:`.pair`) wrote the shards."""
    doc = build_doc(plan, state, manifest, parts, header)
    doc["merge_id"] = uuid.uuid4().hex
    manifest["shards"] = {
        "dir": str(Path(root).resolve()),
        "rows": doc["rows"],
        "bytes": doc["bytes"],
        "files": len(doc["files"]),
        "merge_id": doc["merge_id"],
    }
    write_doc(Path(root), doc, manifest)
    return doc
