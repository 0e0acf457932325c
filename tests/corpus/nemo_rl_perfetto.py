"""Files in the shape NeMo-RL's Perfetto workload tracer writes (NVIDIA-NeMo/RL PR #3879 / #3887), for
tests: that tracer is in review and not in any release, so it cannot run here; this writes what its
code writes, field by field (docs/FORMATS.md, "NeMo-RL Perfetto tracer"):

- one JSON array (compact separators), sorted by ``(ts, ph)`` with metadata (no ``ts``) first;
- ``ts``: the driver's ``time.monotonic`` µs; each actor's events shifted by the midpoint of one round
  trip (the offset itself is not written);
- pids/tids: 31-bit blake2s hashes of ``host:pid:process name`` (and ``...:virtual``, ``...:track:<name>``);
- ``process_name`` / ``process_sort_index`` / ``thread_name`` / ``thread_sort_index`` metadata;
- driver spans as ``B``/``E`` (cat ``driver``; ``E`` has no name), instants with ``"s": "t"``,
  counters, per-sample ``X`` slices on virtual lanes (cat ``rollout``), and the step instants
  ``grpo_step_start`` / ``grpo_step_complete`` with ``step``, ``algorithm``, ``mode``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

HOST = "node-a"


def trace_id(value: str) -> int:
    digest = hashlib.blake2s(value.encode(), digest_size=4).digest()
    return (int.from_bytes(digest, "big") & 0x7FFF_FFFF) or 1


class _Proc:
    def __init__(
        self, events: list[dict[str, Any]], name: str, os_pid: int, virtual: str | None = None
    ) -> None:
        ident = f"{HOST}:{os_pid}:{name}"
        self.events, self.pid = events, trace_id(ident)
        self.tid = trace_id(f"{self.pid}:thread:1")
        self.vpid = trace_id(f"{ident}:virtual")
        events.append({"name": "process_name", "ph": "M", "pid": self.pid, "tid": 0, "args": {"name": name}})
        events.append(
            {"name": "process_sort_index", "ph": "M", "pid": self.pid, "tid": 0, "args": {"sort_index": 0}}
        )
        events.append(
            {
                "name": "thread_name",
                "ph": "M",
                "pid": self.pid,
                "tid": self.tid,
                "args": {"name": "MainThread"},
            }
        )
        if virtual:
            events.append(
                {"name": "process_name", "ph": "M", "pid": self.vpid, "tid": 0, "args": {"name": virtual}}
            )

    def span(
        self, name: str, ts: int, dur: int, args: dict[str, Any] | None = None, cat: str = "driver"
    ) -> None:
        begin: dict[str, Any] = {
            "name": name,
            "cat": cat,
            "ph": "B",
            "ts": ts,
            "pid": self.pid,
            "tid": self.tid,
        }
        if args:
            begin["args"] = args
        self.events.append(begin)
        self.events.append({"ph": "E", "ts": ts + dur, "pid": self.pid, "tid": self.tid})

    def instant(self, name: str, ts: int, args: dict[str, Any]) -> None:
        self.events.append(
            {
                "name": name,
                "cat": "driver",
                "ph": "i",
                "s": "t",
                "ts": ts,
                "pid": self.pid,
                "tid": self.tid,
                "args": args,
            }
        )

    def sample(self, track: str, ts: int, dur: int, args: dict[str, Any]) -> None:
        tid = trace_id(f"{self.vpid}:track:{track}")
        self.events.append(
            {"name": "thread_name", "ph": "M", "pid": self.vpid, "tid": tid, "args": {"name": track}}
        )
        self.events.append(
            {
                "name": "sample_rollout",
                "cat": "rollout",
                "ph": "X",
                "ts": ts,
                "dur": dur,
                "pid": self.vpid,
                "tid": tid,
                "args": args,
            }
        )


def write_trace(
    path: Path, steps: int = 2, mono0_us: int = 5_000_000, actor_offset_us: int = 0
) -> dict[str, Any]:
    """A two-step async-GRPO trace; returns what it holds (step windows in driver µs, counts)."""
    events: list[dict[str, Any]] = []
    driver = _Proc(events, "driver", 1000)
    collector = _Proc(events, "trajectory_collector_actor", 2000, virtual="grpo_async_rollouts")
    windows = []
    t = mono0_us
    for step in range(1, steps + 1):
        start = t
        meta = {"step": step, "algorithm": "grpo", "mode": "async"}
        driver.instant("grpo_step_start", t, meta)
        driver.span("generation", t, 3000, {"step": step})
        # the collector's work, already shifted onto the driver's clock by the tracer's round trip
        collector.span("collect_batch", t + 100 + actor_offset_us, 2600, cat="collector")
        for i in range(2):
            collector.sample(
                f"sample {step}.{i}", t + 200 + 300 * i, 2000, {"sample_idx": i, "output_tokens": 17}
            )
        t += 3000
        driver.span("policy_training", t, 2000, {"step": step})
        t += 2000
        driver.events.append(
            {
                "name": "replay_buffer",
                "cat": "driver",
                "ph": "C",
                "ts": t,
                "pid": driver.pid,
                "tid": driver.tid,
                "args": {"size": 4},
            }
        )
        driver.instant("grpo_step_complete", t, {**meta, "replay_buffer_size": 4, "avg_trajectory_age": 0.5})
        windows.append((step, start, t))
        t += 500
    events.sort(key=lambda e: (e.get("ts", -1), e.get("ph", "")))
    path.write_text(json.dumps(events, separators=(",", ":")))
    return {"windows": windows, "events": len(events), "driver_pid": driver.pid}


def write_record(folder: Path, trace: Path, anchor_ns: int, pid: int = 1000) -> Path:
    """Our process record for the driver, registering the trace with the anchor a capture knows."""
    record = {
        "schema": "rl-trace-process/1",
        "hostname": HOST,
        "pid": pid,
        "role": "driver",
        "artifacts": [{"path": trace.name, "kind": "nemo_rl_perfetto", "anchor_ns": anchor_ns}],
    }
    path = folder / f"rl-trace-process-{HOST}-{pid}.json"
    path.write_text(json.dumps(record, sort_keys=True))
    return path
