"""Profile windows of one TokenSpeed replica: ``/start_profile`` and ``/stop_profile`` at VERL's
profiled steps, then every file of every rank waited for and registered for the merger.

- One directory per window: ``<RL_TRACE_OUTPUT_DIR>/tokenspeed/<run>/step-<N>/replica-<r>/``
  (TokenSpeed drops ``profile_id`` behind ``ts serve``, so the directory is the identity).
- The body holds ``output_dir`` and ``activities`` only. ``profile_by_stage`` is never sent: without
  ``num_steps`` it crashes the scheduler's batch predicate (``NoneType += int``).
- A refusal (Proton with GPU activities, a profile already running, Proton missing) is one warning
  naming TokenSpeed's reason; training goes on.
- After the stop, a background task polls the directory (:mod:`.profile_files`) and registers each
  complete file with step, role ``rollout``, replica, TP rank and rank tag. The files of one rank are
  registered in a process record for the scheduler process that wrote them (its pid is in the rank's
  VizTracer report), written on its behalf by this server process: the merger then shows each rank as
  its own process with its VizTracer and Proton lanes together (Proton's pid 0 becomes a sub-process of
  its owner), and aligns Proton on the VizTracer flow starts of the same rank.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...capture import get_recorder
from ...capture.recorder import Recorder
from .http import ControlClient, reply_message, reply_ok
from .profile_files import ProfileFile, WindowWait, expected_kinds, writer_pid

log = logging.getLogger("rl_trace_observer")
MKDIR_S = 5.0  # a profile directory not created by then (hung disk): the window is skipped

ROLE = "rollout"
POLL_S = 0.5


def _safe(text: Any) -> str:
    return re.sub(r"[^0-9A-Za-z._=+-]+", "-", str(text)).strip("-") or "none"


@dataclass
class Window:
    step: int | None
    directory: Path
    activities: tuple[str, ...]
    start_wall_ns: int
    stop_wall_ns: int | None = None
    registered: list[str] = field(default_factory=list)


class ProfileControl:
    """Start/stop and file registration for one replica's server (all calls on its event loop)."""

    def __init__(
        self,
        client: ControlClient,
        *,
        replica: int,
        ranks: int,
        activities: tuple[str, ...],
        stall_timeout_s: float,
        server_alive: Callable[[], bool] = lambda: True,
    ) -> None:
        self.client = client
        self.replica = replica
        self.ranks = ranks
        self.activities = activities
        self.stall_timeout_s = stall_timeout_s
        self.server_alive = server_alive
        self.current: Window | None = None
        self.windows: list[Window] = []
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._delegates: dict[int, Recorder] = {}
        self._warned: set[str] = set()
        self._unknown_steps = 0

    # ----------------------------------------------------------------------------- helpers
    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("[rl-trace-observer] TokenSpeed replica %s: %s", self.replica, message)

    def _directory(self, rec: Recorder, step: int | None) -> Path:
        run = _safe(rec.record().get("run_id") or "local")
        if step is None:
            self._unknown_steps += 1
            name = f"step-unknown-{self._unknown_steps}"
        else:
            name = f"step-{step}"
        base = rec.output_dir / "tokenspeed" / run / name / f"replica-{self.replica}"
        path, n = base, 1
        while path.exists() and any(path.iterdir()):  # the same step profiled twice: never mix windows
            n += 1
            path = base.with_name(f"{base.name}-{n}")
        return path

    def _make_directory(self, rec: Recorder, step: int | None) -> Path:
        directory = self._directory(rec, step)
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    # ---------------------------------------------------------------------- start / stop
    async def start(self, step: int | None) -> bool:
        """``/start_profile`` for VERL's profiled step ``step``; False when nothing was started."""
        if not self.activities:
            return False
        rec = get_recorder()
        if rec is None:
            self._warn("no-output", "RL_TRACE_OUTPUT_DIR is not set: TokenSpeed is not profiled")
            return False
        async with self._lock:
            if self.current is not None:
                return False  # VERL asked twice for one window (nested managers): one is enough
            try:  # off the event loop, bounded: the output disk may hang (docs/capture.md)
                directory = await asyncio.wait_for(
                    asyncio.to_thread(self._make_directory, rec, step), MKDIR_S
                )
            except Exception as exc:
                self._warn(
                    "mkdir", f"cannot create the profile directory ({exc!r}); step {step} is not profiled"
                )
                return False
            body = {"output_dir": str(directory), "activities": list(self.activities)}
            try:
                status, reply = await self.client.post("/start_profile", body, timeout_s=120)
            except Exception as exc:
                self._warn("start-error", f"/start_profile failed ({exc}); step {step} is not profiled")
                return False
            if not reply_ok(status, reply):
                self._warn(
                    "refused",
                    f"TokenSpeed refused /start_profile with {','.join(self.activities)} (HTTP {status}: "
                    f"{reply_message(reply)}); this replica is not profiled, training goes on "
                    "(set RL_TRACE_TOKENSPEED_PROFILE_ACTIVITIES to change the activities)",
                )
                if status == 206:  # some ranks started: stop them so the next window can start
                    await self._best_effort_stop()
                return False
            self.current = Window(step, directory, self.activities, time.time_ns())
            self.windows.append(self.current)
            return True

    async def _best_effort_stop(self) -> None:
        try:
            await self.client.post("/stop_profile", None, timeout_s=600)
        except Exception:
            pass

    async def stop(self) -> Window | None:
        """``/stop_profile`` (before the replica releases memory); files are collected in the background."""
        async with self._lock:
            window, self.current = self.current, None
            if window is None:
                return None
            try:
                status, reply = await self.client.post("/stop_profile", None, timeout_s=660)
                if not reply_ok(status, reply):  # e.g. it stopped by itself: the files may be there
                    self._warn("stop", f"/stop_profile answered HTTP {status}: {reply_message(reply)}")
            except Exception as exc:
                self._warn("stop-error", f"/stop_profile failed ({exc}); collecting what was written")
            window.stop_wall_ns = time.time_ns()
            self._tasks.append(asyncio.ensure_future(self._collect(window)))
            return window

    async def wait(self, timeout_s: float | None = None) -> list[Window]:
        """Wait for every window's files (tests, and the trainer when ``fit`` ends)."""
        tasks = [t for t in self._tasks if not t.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        return self.windows

    # ------------------------------------------------------------------------ collection
    async def _collect(self, window: Window) -> None:
        kinds = expected_kinds(window.activities)
        wait = WindowWait(window.directory, kinds, self.ranks, self.stall_timeout_s)
        waiting: dict[str, list[ProfileFile]] = {}  # rank tag → complete files whose owner is not known
        owners: dict[str, Recorder | None] = {}
        try:
            while True:
                for info in wait.poll():
                    waiting.setdefault(info.tag, []).append(info)
                    if info.kind == "viztracer" and info.tag not in owners:
                        owners[info.tag] = self._delegate(writer_pid(info.path), info)
                for tag in list(waiting):
                    if tag in owners or "viztracer" not in kinds:
                        self._register(window, waiting.pop(tag), owners.get(tag))
                if wait.done:
                    break
                if wait.stalled or not self.server_alive():
                    why = "the server exited" if not self.server_alive() else "stalled"
                    self._warn(
                        f"incomplete-{window.directory}",
                        f"profile files in {window.directory} incomplete ({why}; "
                        f"RL_TRACE_TOKENSPEED_PROFILE_STALL_TIMEOUT_S={self.stall_timeout_s:g}): "
                        + "; ".join(wait.missing()),
                    )
                    break
                await asyncio.sleep(POLL_S)
            for files in waiting.values():  # no VizTracer report named their writer: the server owns them
                self._register(window, files, None)
        except Exception as exc:
            self._warn("collect", f"could not register the profile files of {window.directory}: {exc}")

    def _delegate(self, pid: int | None, info: ProfileFile) -> Recorder | None:
        """The record of the scheduler process ``pid`` (same host), written by this process."""
        rec = get_recorder()
        if rec is None or pid is None or pid == rec.pid:
            return None
        found = self._delegates.get(pid)
        if found is None:
            found = Recorder(rec.config, host=rec.host, pid=pid)
            found.update_identity(
                role=ROLE,
                rank=info.tp,
                world_size=self.ranks,
                replica=self.replica,
                tokenspeed={
                    "scheduler": True,
                    "rank_tag": info.tag,
                    "dp_rank": info.dp,
                    "recorded_by_pid": rec.pid,
                },
            )
            self._delegates[pid] = found
        return found

    def _register(self, window: Window, files: list[ProfileFile], owner: Recorder | None) -> None:
        rec = owner or get_recorder()
        if rec is None:
            return
        for info in files:
            extra: dict[str, Any] = {"replica": self.replica, "rank_tag": info.tag, "tokenspeed": True}
            if info.dp is not None:
                extra["dp_rank"] = info.dp
            if info.fmt is not None:
                extra["format"] = info.fmt
            rec.register_artifact(info.path, info.kind, step=window.step, role=ROLE, rank=info.tp, **extra)
            window.registered.append(info.path.name)

    def close(self) -> None:
        for rec in self._delegates.values():
            rec.close(0)  # hand over the final records; the exit hook waits (bounded) for the disk


async def call_quietly(what: str, coro: Awaitable[Any]) -> Any:
    """Await ``coro``; a failure is logged, never raised (profiling must not break training)."""
    try:
        return await coro
    except Exception as exc:
        log.warning("[rl-trace-observer] TokenSpeed %s failed: %s", what, exc)
        return None
