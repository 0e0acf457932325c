"""A three-host run laid out as three node-local output directories, written by the real capture layer.

- ``a`` (host ``h-a``, the clock reference): the trainer (``global_step`` spans, step windows 1 and
  2, the reference clock measurement) and actor rank 0 (RL-Insight ``actor_update`` spans, a Kineto
  trace of step 1 with the same ``record_function`` region, kernels and ``ac2g`` flows);
- ``b`` (host ``h-b``, its wall clock ``OFFSET_NS`` ahead of the reference, measured so): actor rank 1
  with the SAME OS pid as rank 0 (two hosts, two processes) and its own Kineto trace; every time it
  wrote is on its own clock, so the merge must move it back by the offset;
- ``c`` (host ``h-c``, measured 0): a rollout server's ``vllm_generate`` spans and metrics, and one
  TokenSpeed scheduler rank (VizTracer + Proton, synthetic: Proton needs a GPU).

``truth`` is what a correct merge shows: every span at its reference-clock time.
"""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path
from typing import Any

from rl_trace_observer.capture import Recorder
from rl_trace_observer.config import Config

from .recorded import FixedClock
from .tokenspeed_files import write_rank

S, MS = 1_000_000_000, 1_000_000
OFFSET_NS = 25 * MS  # host h-b's clock minus the reference's
RUN = "run-cluster"
ACTOR_PID = 4242  # on h-a AND h-b


def _measurement(t0: int, wall: int, offset: int, unc: int) -> dict[str, Any]:
    return {
        "reference": "h-a:1", "reference_host": "h-a", "reference_pid": 1, "method": "ray_ntp",
        "offset_ns": offset, "uncertainty_ns": unc, "round_trip_ns": 2 * unc, "rounds": 4,
        "wall_ns": wall, "reference_wall_ns": wall - offset, "mono_ns": None, "phase": "periodic",
    }  # fmt: skip


def _recorder(
    folder: Path, host: str, pid: int, role: str, rank: int | None, t0: int
) -> tuple[Recorder, FixedClock]:
    clock = FixedClock(t0)
    rec = Recorder(Config(output_dir=folder.resolve(), run_id=RUN, role=role), clock, host=host, pid=pid)
    rec.update_identity(role=role, rank=rank, world_size=2 if rank is not None else None)
    return rec, clock


def _kineto(path: Path, pid: int, start: int, regions: list[tuple[str, int, int]], kernels: int) -> None:
    """Kineto's shape: µs relative to ``baseTimeNanoseconds``, CPU ops, kernels on the GPU with flows."""
    base = start - start % (86400 * S)
    us = lambda ns: round((ns - base) / 1000, 3)  # noqa: E731
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
    ]
    for name, lo, hi in regions:
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": name,
                "pid": pid,
                "tid": pid,
                "ts": us(lo),
                "dur": (hi - lo) / 1000,
            }
        )
        step = (hi - lo) // (kernels + 1)
        for k in range(kernels):
            at = lo + (k + 1) * step
            corr = k + 1
            events.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": pid,
                    "tid": pid,
                    "ts": us(at),
                    "dur": 4.0,
                    "args": {"correlation": corr},
                }
            )
            events.append(
                {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": pid, "tid": pid, "ts": us(at)}
            )
            events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": f"gemm_{k % 3}",
                    "pid": 0,
                    "tid": 7,
                    "ts": us(at + 10_000),
                    "dur": 30.0,
                    "args": {"correlation": corr, "device": 0, "stream": 7},
                }
            )
            events.append(
                {
                    "ph": "f",
                    "cat": "ac2g",
                    "name": "ac2g",
                    "id": corr,
                    "pid": 0,
                    "tid": 7,
                    "ts": us(at + 10_000),
                    "bp": "e",
                }
            )
    doc = {"schemaVersion": 1, "deviceProperties": [], "baseTimeNanoseconds": base, "traceEvents": events}
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)


def build_cluster_run(base: Path, kernels: int = 40) -> dict[str, Any]:
    """The three node directories under ``base``; returns them and the true times to check."""
    t0 = (time.time_ns() - 600 * S) // S * S
    dirs = {name: base / name for name in ("a", "b", "c")}
    for d in dirs.values():
        d.mkdir(parents=True)
    steps = {1: (t0 + 1 * S, t0 + 2 * S), 2: (t0 + 3 * S, t0 + 4 * S)}
    truth: dict[str, Any] = {"steps": steps, "actor_update": {}}

    trainer, clock = _recorder(dirs["a"], "h-a", 1, "trainer", None, t0)
    trainer.add_clock_offset({**_measurement(t0, t0, 0, 0), "method": "reference"})
    for step, (lo, hi) in steps.items():
        clock.wall = lo
        trainer.clock_snapshot("step_begin", step=step)
        clock.wall = hi
        trainer.clock_snapshot("step_end", step=step)
        trainer.span(
            "global_step", lo, hi, lane="global_step", cat="verl", args={"step": step, "profiled": step == 1}
        )
        trainer.counter("actor/pg_loss", 0.5 / step, wall_ns=hi - 10 * MS)
    trainer.close()

    for name, host, rank, shift in (("a", "h-a", 0, 0), ("b", "h-b", 1, OFFSET_NS)):
        rec, clock = _recorder(dirs[name], host, ACTOR_PID, "actor", rank, t0 + shift)
        if shift:  # measured twice, bracketing the run: the host's correction is this constant
            rec.add_clock_offset(_measurement(t0, t0 + shift, shift, 50_000))
            rec.add_clock_offset(_measurement(t0, t0 + 5 * S + shift, shift, 50_000))
        regions = []
        for step, (lo, _hi) in steps.items():
            start, end = lo + 100 * MS + rank * 5 * MS, lo + 600 * MS + rank * 5 * MS
            rec.span("actor_update", start + shift, end + shift, lane=f"rank_{rank}")
            truth["actor_update"][(host, step)] = start
            regions.append((step, "actor_update", start + shift, end + shift))
        trace = dirs[name] / "torch" / f"actor_train_step1_rank{rank}_pid{ACTOR_PID}_1.json.gz"
        trace.parent.mkdir(exist_ok=True)
        _kineto(trace, ACTOR_PID, t0 + shift, [(n, lo, hi) for s, n, lo, hi in regions if s == 1], kernels)
        rec.register_artifact(trace, "torch", step=1, role="actor", rank=rank)
        rec.close()

    rollout, clock = _recorder(dirs["c"], "h-c", 300, "rollout", None, t0)
    rollout.add_clock_offset(_measurement(t0, t0, 0, 30_000))
    rollout.add_clock_offset(_measurement(t0, t0 + 5 * S, 0, 30_000))
    for step, (lo, _hi) in steps.items():
        rollout.span("vllm_generate", lo + 10 * MS, lo + 90 * MS, lane="replica_0")
        rollout.counter("rollout/tokens_per_s", 1000.0 * step, wall_ns=lo + 95 * MS)
    rollout.close()
    write_rank(
        dirs["c"] / "tokenspeed", profile_id="gen", tp=0, pid=5000, start_wall_ns=steps[1][0] + 20 * MS
    )
    return {"dirs": dirs, "truth": truth, "t0": t0}
