"""TokenSpeed scheduler-rank profiles (VizTracer report + Proton ``chrome_trace``) written by a
generator, because Proton needs a GPU. NOT real captures: the wire format follows what the real
writers produce (Triton Proton's ChromeTraceDump and TokenSpeed's profiling hooks):

- names ``{profile_id}-[DPd-][CPc-]TPt[-STAGE].viztracer.json`` and ``....proton[.part_N].chrome_trace``;
- VizTracer: ``viztracer_metadata.baseTimeNanoseconds`` = wall − monotonic, ``ts`` monotonic µs,
  OS pid/tid, and a ``viztracer->proton`` flow start (cat ``tokenspeed.proton``, ``id`` = Proton
  scope id, ``bp`` ``e``) just before each Proton scope is entered;
- Proton: ``displayTimeUnit`` ``us``, everything in pid 0 named "Trace", CPU lanes named
  ``CPU Thread <tid>``, GPU lanes ``200000 + stream`` named ``GPU Stream <n>``, CPU scopes
  (cat ``scope``, ``args.call_stack`` and ``args.scope_id``), kernels (cat ``kernel``), and
  ``launch->kernel`` flows (cat ``flow``, ``bp`` ``e``) whose ids restart at 1 in every rank and repeat
  when one launch runs several kernels; TokenSpeed's build adds ``baseTimeNanoseconds``
  (``anchored=False`` writes the upstream form, without it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GPU_LANE = 200_000


def write_rank(
    folder: Path,
    *,
    profile_id: str,
    tp: int,
    pid: int,
    start_wall_ns: int,
    mono_offset_ns: int = 1_000_000_000_000,
    steps: int = 4,
    anchored: bool = True,
    parts: int = 1,
) -> dict[str, Any]:
    """One rank's pair of files; returns what a test needs to check (counts, names, times)."""
    folder.mkdir(parents=True, exist_ok=True)
    tid = pid + 7
    viz_base = start_wall_ns - mono_offset_ns  # VizTracer: wall − monotonic
    t0_us = mono_offset_ns / 1000
    viz_events: list[dict[str, Any]] = [
        {"ph": "M", "pid": pid, "tid": tid, "name": "process_name", "args": {"name": "MainProcess"}},
        {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": "MainThread"}},
    ]
    part_events: list[list[dict[str, Any]]] = [[] for _ in range(parts)]
    launch_id = 0
    scope_id = 100
    for step in range(steps):
        at = step * 1000.0  # µs after start
        viz_events.append(
            {
                "pid": pid,
                "tid": tid,
                "ts": round(t0_us + at, 3),
                "ph": "X",
                "dur": 900.0,
                "name": "forward_batch",
                "cat": "FEE",
            }
        )
        for k in range(2):
            scope_id += 1
            launch_id += 1
            s_at = at + 100.0 + k * 300.0
            viz_events.append(
                {
                    "name": "viztracer->proton",
                    "cat": "tokenspeed.proton",
                    "ph": "s",
                    "ts": round(t0_us + s_at, 3),
                    "id": scope_id,
                    "bp": "e",
                    "pid": pid,
                    "tid": tid,
                }
            )
            part = part_events[min(step * parts // steps, parts - 1)]
            part.append(
                {
                    "name": f"attention_{k}",
                    "cat": "scope",
                    "ph": "X",
                    "pid": 0,
                    "tid": tid,
                    "ts": s_at + 1.0,
                    "dur": 50.0,
                    "args": {"call_stack": ["forward", f"attention_{k}"], "scope_id": scope_id},
                }
            )
            kernels = 2 if k == 1 else 1  # one launch, two kernels: Proton repeats the launch id
            for j in range(kernels):
                k_at = s_at + 60.0 + j * 40.0
                part.append(
                    {
                        "name": "launch->kernel",
                        "cat": "flow",
                        "ph": "s",
                        "pid": 0,
                        "tid": tid,
                        "ts": s_at + 1.0,
                        "id": launch_id % 3 + 1,
                        "bp": "e",
                    }
                )
                part.append(
                    {
                        "name": "launch->kernel",
                        "cat": "flow",
                        "ph": "f",
                        "pid": 0,
                        "tid": GPU_LANE + 7,
                        "ts": k_at,
                        "id": launch_id % 3 + 1,
                        "bp": "e",
                    }
                )
                part.append(
                    {
                        "name": f"kernel_{k}_{j}",
                        "cat": "kernel",
                        "ph": "X",
                        "pid": 0,
                        "tid": GPU_LANE + 7,
                        "ts": k_at,
                        "dur": 30.0,
                        "args": {"call_stack": ["forward", f"kernel_{k}_{j}"]},
                    }
                )
    tag = f"{profile_id}-TP{tp}"
    viz_path = folder / f"{tag}.viztracer.json"
    viz_path.write_text(
        json.dumps(
            {
                "traceEvents": viz_events,
                "viztracer_metadata": {
                    "version": "1.1.1",
                    "overflow": False,
                    "baseTimeNanoseconds": viz_base,
                },
            }
        )
    )
    paths = [viz_path]
    for n, events in enumerate(part_events):
        first = min(e["ts"] for e in events)
        meta = [
            {"ph": "M", "pid": 0, "tid": 0, "name": "process_name", "args": {"name": "Trace"}},
            {"ph": "M", "pid": 0, "tid": 0, "name": "process_sort_index", "args": {"sort_index": 0}},
            {"ph": "M", "pid": 0, "tid": tid, "name": "thread_name", "args": {"name": f"CPU Thread {tid}"}},
            {
                "ph": "M",
                "pid": 0,
                "tid": GPU_LANE + 7,
                "name": "thread_name",
                "args": {"name": "GPU Stream 7"},
            },
        ]
        rel = [{**e, "ts": round(e["ts"] - first, 3)} for e in events]  # Proton: relative to its first event
        doc: dict[str, Any] = {"displayTimeUnit": "us", "traceEvents": meta + rel}
        if anchored:
            doc["baseTimeNanoseconds"] = start_wall_ns + int(first * 1000)
        suffix = f".part_{n}" if parts > 1 else ""
        path = folder / f"{tag}.proton{suffix}.chrome_trace"
        path.write_text(json.dumps(doc))
        paths.append(path)
    flows = sum(1 for events in part_events for e in events if e["ph"] == "s")
    return {"paths": paths, "launch_flows": flows, "scope_links": 2 * steps, "viz_slices": steps, "pid": pid}
