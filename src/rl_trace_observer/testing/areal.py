"""Run AReaL's OWN tracer (``areal/utils/perf_tracer.py`` from the areal 1.0.4 wheel) on CPU.

``import areal`` cannot work here: ``areal/__init__.py`` imports its whole runtime (``areal.infra``:
colorlog, ray, ...), and ``areal.api.cli_args`` pulls transformers 5, numba, uvloop and hydra 1.4 at
import; the wheel pins torch < 2.11 beside our 2.13. So only ``perf_tracer.py`` is taken from the wheel,
unchanged, and imported the ordinary way (so import hooks see it), with the smallest stand-ins for
what it imports and does not need to run:

- the packages ``areal``, ``areal.utils``, ``areal.api``: empty modules whose ``__path__`` is the
  wheel's folders (their ``__init__`` files are not run);
- ``areal.api.cli_args``: ``PerfTracerConfig`` / ``SessionTracerConfig`` as plain dataclasses with
  AReaL's field names and defaults (the tracer only reads their attributes);
- ``areal.utils.logging``: ``getLogger`` from the standard library (AReaL's adds colorlog colours).

Everything else the tracer does — ``configure``, scopes, instants, the session tracer, ``save``, its
JSONL — is AReaL's code. :func:`main` is one worker process of a test run (a role and a rank, a
deliberate start delay so origins differ), driving the tracer the way AReaL's trainer and workflow
executor do, and writing the truth (its origin on the wall clock) beside it. It knows nothing of our
integration: a test runs it under ``python -m rl_trace_observer.integrations.areal -m
rl_trace_observer.testing.areal ...``, as a user runs an unmodified AReaL entry point.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import json
import logging
import os
import random
import sys
import time
import types
import zipfile
from pathlib import Path
from typing import Any

WHEEL_NAME = "areal-1.0.4-py3-none-any.whl"
TRACER_MEMBER = "areal/utils/perf_tracer.py"
MODULE = "areal.utils.perf_tracer"
# A skip a user can act on: which data set is missing and what fetches it (scripts/light_check.sh
# accepts skips that name a missing tool or data set).
WHEEL_MISSING = f"needs the areal wheel (data set: .wheels/{WHEEL_NAME}; scripts/bootstrap.sh downloads it)"


def find_wheel(root: Path | None = None) -> Path | None:
    """The wheel scripts/bootstrap.sh downloads into ``.wheels/`` (None when absent)."""
    root = root or Path(__file__).resolve().parents[3]
    path = root / ".wheels" / WHEEL_NAME
    return path if path.is_file() else None


def unpack_tracer(wheel: Path, into: Path) -> Path:
    """Extract only ``areal/utils/perf_tracer.py``; returns the folder that holds ``areal/``."""
    with zipfile.ZipFile(wheel) as z:
        z.extract(TRACER_MEMBER, into)
    return into


@dataclasses.dataclass
class SessionTracerConfig:
    enabled: bool = False
    flush_threshold: int = 256


@dataclasses.dataclass
class PerfTracerConfig:
    experiment_name: str = ""
    trial_name: str = ""
    fileroot: str = ""
    enabled: bool = False
    save_interval: int = 1
    profile_steps: list[int] | None = None
    session_tracer: SessionTracerConfig | None = None


def _package(name: str, folder: Path) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [str(folder)]
    sys.modules[name] = module
    return module


def load_tracer(root: Path) -> types.ModuleType:
    """Import AReaL's ``perf_tracer`` from ``root/areal/utils/perf_tracer.py`` with the stand-ins."""
    _package("areal", root / "areal")
    _package("areal.utils", root / "areal" / "utils")
    _package("areal.api", root / "areal" / "api")
    cli_args = types.ModuleType("areal.api.cli_args")
    cli_args.PerfTracerConfig = PerfTracerConfig  # type: ignore[attr-defined]
    cli_args.SessionTracerConfig = SessionTracerConfig  # type: ignore[attr-defined]
    sys.modules["areal.api.cli_args"] = cli_args
    areal_logging = types.ModuleType("areal.utils.logging")
    areal_logging.getLogger = logging.getLogger  # type: ignore[attr-defined]
    sys.modules["areal.utils.logging"] = areal_logging
    return importlib.import_module(MODULE)


async def _session(pt: Any, task_id: int, rng: random.Random, reject: bool) -> None:
    """One rollout task as AReaL's workflow runs it: a session, generate, reward, finalize."""
    pt.set_task_id(task_id)

    @pt.session_context()
    async def collect() -> None:
        async with pt.atrace_session_phase("generate"):
            await asyncio.sleep(rng.uniform(0.004, 0.02))

        @pt.trace_session("reward")
        async def reward() -> None:
            await asyncio.sleep(rng.uniform(0.001, 0.004))

        await reward()

    await collect()
    status = {"status": "rejected", "reason": "rejected"} if reject else {"status": "accepted"}
    pt.trace_session_event("mark_finalized", task_id=task_id, **status)


def _rollout_batch(pt: Any, step: int, tasks: int, rng: random.Random) -> None:
    @pt.trace_perf("workflow_executor.rollout_batch", category="scheduler")
    def rollout_batch() -> None:
        pt.instant("workflow_executor.rollout_batch", category="scheduler", args={"data": tasks})
        base = step * tasks
        for t in range(tasks):
            pt.register_task(base + t)

        async def run() -> None:
            await asyncio.gather(*(_session(pt, base + t, rng, reject=(t % 5 == 4)) for t in range(tasks)))

        asyncio.run(run())

    rollout_batch()


def _meet(folder: Path, world: int, me: str, timeout_s: float = 120.0) -> float:
    """Wait until ``world`` workers have arrived; all return the same start time (wall seconds)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{me}"
    tmp.write_text(str(time.time()))
    tmp.rename(folder / me)  # whole or absent: another worker never reads half a number
    deadline = time.monotonic() + timeout_s
    while True:
        arrived = [f for f in folder.iterdir() if not f.name.startswith(".")]
        if len(arrived) >= world:
            return max(float(f.read_text()) for f in arrived) + 0.1
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(arrived)} of {world} workers arrived")
        time.sleep(0.01)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tracer-root", required=True, type=Path)
    p.add_argument("--fileroot", required=True)
    p.add_argument("--role", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tasks", type=int, default=6)
    p.add_argument("--truth", required=True, type=Path)
    p.add_argument("--barrier", type=Path, help="folder where the run's workers meet before step 0")
    p.add_argument("--world", type=int, default=1, help="workers that meet there")
    p.add_argument("--every", type=float, default=0.25, help="seconds between step starts (with --barrier)")
    p.add_argument("--first-step", type=float, default=1.0, help="step 0 starts this long after the meeting")
    a = p.parse_args(argv)
    pt = load_tracer(a.tracer_root)
    # meet the others first (start-up times vary), then configure after this worker's own delay: its
    # perf_counter origin is that far from theirs, whatever the machine's load
    met = _meet(a.barrier, a.world, f"{a.role}-{a.rank}") if a.barrier else time.time()
    time.sleep(max(0.0, met + a.delay - time.time()))
    rollout = a.role == "rollout"
    config = PerfTracerConfig(
        experiment_name="exp",
        trial_name="trial",
        fileroot=a.fileroot,
        enabled=True,
        session_tracer=SessionTracerConfig(enabled=rollout, flush_threshold=1),
    )
    tracer = pt.configure(config, rank=a.rank, role=a.role)
    p0 = time.perf_counter_ns()
    wall = time.time_ns()
    p1 = time.perf_counter_ns()
    origin_wall = wall - ((p0 + p1) // 2 - tracer._origin_ns)
    rng = random.Random(a.rank * 7 + len(a.role))
    start_at = met + a.first_step if a.barrier else None
    for step in range(a.steps):
        if start_at is not None:  # as AReaL's controller does: every role on step N together
            time.sleep(max(0.0, start_at + step * a.every - time.time()))
        with pt.trace_scope(f"{a.role}.step", category="compute", args={"global_step": step}):
            if rollout:
                _rollout_batch(pt, step, a.tasks, rng)
            else:
                with pt.trace_scope("actor.ppo_update", category="compute", args={"global_step": step}):
                    time.sleep(rng.uniform(0.02, 0.05))
            pt.instant("areal_test.mark", category="instr", args={"global_step": step, "rank": a.rank})
        pt.save(step=step)
    pt.save(force=True)
    a.truth.write_text(
        json.dumps(
            {
                "role": a.role,
                "rank": a.rank,
                "pid": os.getpid(),
                "origin_wall_ns": origin_wall,
                "read_ns": p1 - p0,
                "perf_path": tracer._output_path,
                "sessions_path": getattr(tracer.session_tracer, "_output_path", None),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
