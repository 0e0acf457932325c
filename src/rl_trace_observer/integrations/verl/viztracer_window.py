"""Optional actor VizTracer: a thin, reversible wrapper around ``DistProfiler.start/stop``.

Only with ``RL_TRACE_VIZTRACER=1``. VERL already decides which ranks and steps are profiled and
calls ``DistProfiler.start(role=..., profile_step=N)`` / ``.stop()`` on every worker at the step
boundaries; we open a VizTracer window there, so call stacks are captured for exactly the
profiled steps and ranks (``RL_TRACE_VIZTRACER_ROLES`` narrows it to some roles).

One window per process, explicit lifecycle ``idle -> started -> stopped`` (and ``started`` again
on the next profiled step). Edge cases, by design:

- a second ``start`` from the instance that opened the window: ignored (the window goes on);
- ``stop`` without ``start``: nothing happens to VizTracer; VERL's stop still runs;
- nested windows / several ``DistProfiler`` instances in one process: the first ``start`` opens
  the window and names the file; later instances join; the last ``stop`` saves;
- an exception in VERL's ``start`` closes the window (saved, ``aborted``) and re-raises; an
  exception in ``stop`` still saves; a window still open at exit is saved then;
- our own failures (VizTracer missing, another tracer active, disk full) are logged once and never
  reach training;
- ``uninstall`` closes an open window and puts back the exact original function objects.

Output: VizTracer's Python API ``save()`` (it writes ``viztracer_metadata.baseTimeNanoseconds``,
the anchor the merger needs), to ``viztracer_{role}_step{N}_rank{R}_pid{PID}.json`` in
``RL_TRACE_OUTPUT_DIR`` (temp file + rename), registered as kind ``viztracer``.
"""

from __future__ import annotations

import atexit
import enum
import functools
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from ...capture import get_recorder
from . import contract
from .import_hooks import when_imported
from .patching import PatchSet

log = logging.getLogger("rl_trace_observer")

TARGET_MODULE = "verl.utils.profiler.profile"
KIND = "viztracer"
FILE_NAME = "viztracer_{role}_step{step}_rank{rank}_pid{pid}{part}.json"


class State(enum.Enum):
    IDLE = "idle"
    STARTED = "started"
    STOPPED = "stopped"


@dataclass
class _Open:
    tracer: Any
    step: int | None
    role: str
    rank: int | None
    start_wall_ns: int
    owners: list[int] = field(default_factory=list)


def _safe_name(text: Any) -> str:
    return re.sub(r"[^0-9A-Za-z.=+-]+", "-", str(text)).strip("-") or "none"


def _default_tracer(min_duration_us: float) -> Any:
    from viztracer import VizTracer

    return VizTracer(verbose=0, register_global=False, min_duration=min_duration_us, file_info=False)


class VizTracerWindow:
    """The process's VizTracer window, driven by ``DistProfiler`` start/stop calls."""

    def __init__(
        self,
        *,
        min_duration_us: float = 100.0,
        roles: tuple[str, ...] = (),
        output_dir: Path | None = None,
        tracer_factory: Callable[[float], Any] = _default_tracer,
    ) -> None:
        self.min_duration_us = min_duration_us
        self.roles = roles
        self.output_dir = output_dir
        self.tracer_factory = tracer_factory
        self.state = State.IDLE
        self.saved: list[Path] = []
        self._open: _Open | None = None
        self._lock = threading.RLock()
        self._warned: set[str] = set()

    # ----------------------------------------------------------------- helpers
    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("[rl-trace-observer] VizTracer window: %s", message)

    def selected(self, profiler: Any, kwargs: dict[str, Any]) -> bool:
        """Does this ``start`` profile this rank, and is its role one we trace?"""
        try:
            if not (profiler.check_enable() and profiler.check_this_rank()):
                return False
        except Exception:
            return False
        if not self.roles:
            return True
        names = {kwargs.get("role"), getattr(profiler, "save_file_prefix", None)}
        return any(n in self.roles for n in names if n)

    def _out_dir(self) -> Path | None:
        if self.output_dir is not None:
            return self.output_dir
        rec = get_recorder()
        return rec.output_dir if rec is not None else None

    # --------------------------------------------------------------- lifecycle
    def open(self, profiler: Any, kwargs: dict[str, Any]) -> bool:
        """Called before VERL's ``start``; True when this call opened or joined the window."""
        try:
            with self._lock:
                if self._open is not None and id(profiler) in self._open.owners:
                    self._warn("second-start", "second start() while started; the open window goes on")
                    return False
                if not self.selected(profiler, kwargs):
                    return False
                if self._open is not None:  # nested: another DistProfiler already opened it
                    self._open.owners.append(id(profiler))
                    return True
                return self._start(profiler, kwargs)
        except Exception as exc:
            self._warn("open", f"not started ({exc})")
            return False

    def _start(self, profiler: Any, kwargs: dict[str, Any]) -> bool:
        if self._out_dir() is None:
            self._warn("no-output", "RL_TRACE_OUTPUT_DIR is not set; nothing to write to")
            return False
        try:
            from viztracer import get_tracer

            active = get_tracer()
            if active is not None and getattr(active, "enable", False):
                self._warn("busy", "another VizTracer is already tracing this process; not starting ours")
                return False
        except ImportError:
            self._warn("missing", "viztracer is not installed (pip install 'rl-trace-observer[viztracer]')")
            return False
        tracer = self.tracer_factory(self.min_duration_us)
        step = kwargs.get("profile_step", kwargs.get("global_step"))
        role = kwargs.get("role") or getattr(profiler, "save_file_prefix", None) or "default"
        rank = getattr(profiler, "rank", None)
        tracer.start()
        self._open = _Open(tracer, step, str(role), rank, time.time_ns(), [id(profiler)])
        self.state = State.STARTED
        return True

    def close(self, profiler: Any, *, aborted: bool = False) -> Path | None:
        """Called after VERL's ``stop``; saves when the last owner of the window leaves."""
        try:
            with self._lock:
                current = self._open
                if current is None or id(profiler) not in current.owners:
                    return None  # stop without start (or a profiler that never joined)
                current.owners.remove(id(profiler))
                if current.owners:
                    return None  # a nested window closed; the outer one is still open
                self._open = None
                self.state = State.STOPPED
                return self._save(current, aborted)
        except Exception as exc:
            self._warn("close", f"could not save the VizTracer window ({exc})")
            return None

    def close_all(self, reason: str) -> Path | None:
        """Save and forget an open window (uninstall, process exit)."""
        with self._lock:
            current, self._open = self._open, None
            if current is None:
                return None
            self.state = State.STOPPED
        try:
            return self._save(current, aborted=True, reason=reason)
        except Exception as exc:
            self._warn("close", f"could not save the VizTracer window at {reason} ({exc})")
            return None

    def _save(self, window: _Open, aborted: bool, reason: str | None = None) -> Path | None:
        tracer = window.tracer
        tracer.stop()
        out_dir = self._out_dir()
        if out_dir is None:
            return None
        path = self._free_path(out_dir, window)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.json")
        try:
            tracer.save(str(tmp), verbose=0)
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
            _terminate(tracer)
        self.saved.append(path)
        rec = get_recorder()
        if rec is not None:
            extra: dict[str, Any] = {
                "min_duration_us": self.min_duration_us,
                "window_start_wall_ns": window.start_wall_ns,
            }
            if aborted:
                extra["aborted"] = reason or "exception"
            rec.register_artifact(path, KIND, step=window.step, role=window.role, rank=window.rank, **extra)
        return path

    @staticmethod
    def _free_path(out_dir: Path, window: _Open) -> Path:
        base = dict(role=_safe_name(window.role), step=_safe_name(window.step), rank=_safe_name(window.rank))
        part = 0
        while True:
            name = FILE_NAME.format(pid=os.getpid(), part=f"_part{part}" if part else "", **base)
            path = out_dir / name
            if not path.exists():
                return path
            part += 1


def _terminate(tracer: Any) -> None:
    terminate = getattr(tracer, "terminate", None)
    if callable(terminate):
        try:
            terminate()
        except Exception:
            pass


# ------------------------------------------------------------------------- the patch
_patches = PatchSet()
_lock = threading.Lock()
_state: dict[str, Any] = {"window": None, "requested": False, "atexit": False}


def _wrap_start(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def start(self: Any, *args: Any, **kwargs: Any) -> Any:
        window: VizTracerWindow | None = _state["window"]
        opened = window.open(self, kwargs) if window is not None else False
        try:
            return original(self, *args, **kwargs)
        except BaseException:
            if opened and window is not None:
                window.close(self, aborted=True)
            raise

    return start


def _wrap_stop(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def stop(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        finally:
            window: VizTracerWindow | None = _state["window"]
            if window is not None:
                window.close(self)

    return stop


def _install_on(module: ModuleType) -> None:
    if not contract.check(contract.DIST_PROFILER, module):
        return
    with _lock:
        if not _state["requested"] or len(_patches):
            return
        cls = module.DistProfiler
        _patches.apply(cls, "start", _wrap_start(vars(cls)["start"]))
        _patches.apply(cls, "stop", _wrap_stop(vars(cls)["stop"]))


def _at_exit() -> None:
    window: VizTracerWindow | None = _state["window"]
    if window is not None:
        window.close_all("exit")


def install(cfg: Any, *, window: VizTracerWindow | None = None) -> bool:
    """Patch ``DistProfiler.start/stop`` now, or when VERL's profiler module loads. Never raises."""
    with _lock:
        if _state["requested"]:
            return True
        _state["window"] = window or VizTracerWindow(
            min_duration_us=float(cfg.viztracer_min_duration_us), roles=tuple(cfg.viztracer_roles)
        )
        _state["requested"] = True
        if not _state["atexit"]:
            atexit.register(_at_exit)
            _state["atexit"] = True
    when_imported(TARGET_MODULE, _install_on)
    return True


def uninstall() -> None:
    """Close an open window and restore the exact original ``start``/``stop`` objects."""
    with _lock:
        window, _state["window"] = _state["window"], None
        _state["requested"] = False
        _patches.revert_all()
    if window is not None:
        window.close_all("uninstall")


def current_window() -> VizTracerWindow | None:
    window: VizTracerWindow | None = _state["window"]
    return window


def patched() -> bool:
    return len(_patches) > 0
