"""Step markers: one ``global_step`` span per training step, written by the trainer process.

Surface: ``verl.trainer.ppo.v1.trainer_base.PPOTrainer._start_profiling`` (begin) and
``._stop_profiling`` (end), wrapped once on the V1 base class. Why these two (VERL 0.9.1):

- ``PPOTrainer.fit`` is shared by all three trainer modes (``sync``, ``colocate_async``,
  ``separate_async``) and calls ``on_step_begin(); _start_profiling(); step(); _stop_profiling();
  on_step_end()`` for every step, profiled or not; none of the registered trainers overrides the
  two methods (checked at install time against ``TRAINER_REGISTRY``).
- They bracket ``self.step()`` — rollout sampling, log-probs, advantages and the actor update —
  and they are exactly where VERL starts and stops the torch profiler on every worker, so the
  profiled step's ``global_step`` span contains every trace and RL-Insight span of that step.
- The public alternatives do not carry a begin time: ``on_step_begin``/``on_step_end`` are
  overridden per mode (``on_step_end`` is abstract), so a base-class wrapper would miss them; a
  ``Tracking`` logger only sees the metrics after the step, with durations but no timestamps.

The names are private, so :mod:`.contract` checks them when ``verl.trainer.ppo.v1`` is imported;
on a mismatch one error names the VERL version and the feature stays off. Installed only when
capture is on (``RL_TRACE_OUTPUT_DIR``). At profiled step boundaries the process record gets a
clock snapshot (and, when available, the Ray clock-sync measurement), and the node's metric sampler
is told that a profiled step runs (it samples every ``RL_TRACE_METRICS_PROFILED_INTERVAL_S`` then).

Clock offsets are also measured where no profiler runs, so that measurements bracket every span
(spans are written at every step): ``PPOTrainer.fit`` is wrapped too (the same contract) — its
start queues a measurement in the background (``on_capture_start``; before the validation that
``fit`` runs first) and its end, however it ends, measures once more and waits at most a few
seconds for the result to be stored (``on_training_end``); unprofiled step boundaries measure in
the background when the last measurement is a minute old (``on_step``).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ...capture import get_recorder
from ...capture.sampler import mark_profiling
from . import contract
from .import_hooks import when_imported
from .patching import PatchSet

log = logging.getLogger("rl_trace_observer")

SPAN_NAME = "global_step"
LANE = "global_step"
CATEGORY = "verl"
TARGET_MODULE = "verl.trainer.ppo.v1"  # the package: all trainer modes are registered once it is loaded

_patches = PatchSet()
_lock = threading.Lock()
_open: weakref.WeakKeyDictionary[Any, _OpenStep] = weakref.WeakKeyDictionary()
_state: dict[str, Any] = {"requested": False, "installed": False, "clock_hooks": {}, "role_set": False}


@dataclass
class _OpenStep:
    step: int | None
    start_ns: int
    profiled: bool


def _clock_hook(name: str = "on_step_boundary") -> Callable[..., Any] | None:
    """A function of ``integrations.ray.clock_sync`` when that module exists, else None."""
    hooks: dict[str, Any] = _state["clock_hooks"]
    if name not in hooks:
        try:
            from ..ray import clock_sync

            hooks[name] = getattr(clock_sync, name)
        except Exception:
            hooks[name] = None
    hook: Callable[..., Any] | None = hooks[name]
    return hook


def _boundary(step: int | None, phase: str) -> None:
    """Clock snapshot (+ offset measurement) at a profiled step's begin or end."""
    hook = _clock_hook()
    if hook is not None:
        hook(step, phase)  # it snapshots the clocks itself and never raises
        return
    rec = get_recorder()
    if rec is not None:
        rec.clock_snapshot(f"step_{phase}", step=step)


def _clock(name: str, *args: Any) -> None:
    """``on_capture_start`` / ``on_step`` / ``on_training_end``, when clock sync is there."""
    hook = _clock_hook(name)
    if hook is not None:
        hook(*args)  # never raises; does nothing without capture or Ray


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _begin(trainer: Any) -> None:
    rec = get_recorder()
    if rec is None:
        return
    if not _state["role_set"]:
        _state["role_set"] = True
        if rec.record().get("role") is None:
            rec.update_identity(role="trainer")
    opened = _OpenStep(
        _as_int(getattr(trainer, "global_steps", None)),
        time.time_ns(),
        bool(getattr(trainer, "curr_step_profile", 0)),
    )
    with _lock:
        _open[trainer] = opened
    if opened.profiled:
        mark_profiling(True)  # the node's metric sampler samples faster meanwhile
        _boundary(opened.step, "begin")
    else:
        _clock("on_step", opened.step)


def _end(trainer: Any) -> None:
    with _lock:
        opened = _open.pop(trainer, None)
    rec = get_recorder()
    if opened is None or rec is None:
        return
    args = {
        "step": opened.step,
        "profiled": opened.profiled,
        "trainer_mode": getattr(trainer, "trainer_mode", None),
    }
    rec.span(SPAN_NAME, opened.start_ns, time.time_ns(), lane=LANE, cat=CATEGORY, args=args)
    if opened.profiled:
        mark_profiling(False)
        _boundary(opened.step, "end")


def _warn(what: str, exc: BaseException) -> None:
    rec = get_recorder()
    message = f"step marker {what} failed ({exc}); training continues"
    if rec is not None:
        rec.warn_once(f"steps:{what}", message)
    else:
        log.warning("[rl-trace-observer] %s", message)


def _wrap_start(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(original)
    def _start_profiling(self: Any) -> Any:
        try:
            _begin(self)
        except Exception as exc:
            _warn("begin", exc)
        return original(self)

    return _start_profiling


def _wrap_stop(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(original)
    def _stop_profiling(self: Any) -> Any:
        try:
            return original(self)
        finally:
            try:
                _end(self)
            except Exception as exc:
                _warn("end", exc)

    return _stop_profiling


def _wrap_fit(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            _clock("on_capture_start")
        except Exception as exc:
            _warn("fit begin", exc)
        try:
            return original(self, *args, **kwargs)
        finally:
            try:
                _clock("on_training_end")
            except Exception as exc:
                _warn("fit end", exc)

    return fit


def _install_on(package: ModuleType) -> None:
    """Post-import hook for ``verl.trainer.ppo.v1``: check the contract, then wrap the base class."""
    import importlib

    with _lock:
        if _state["installed"] or not _state["requested"]:
            return
    base = importlib.import_module("verl.trainer.ppo.v1.trainer_base")
    if not contract.check(contract.TRAINER, base):
        return
    trainer_cls = base.PPOTrainer
    overriding = [
        name
        for name, cls in dict(base.TRAINER_REGISTRY).items()
        if {"_start_profiling", "_stop_profiling", "fit"} & set(vars(cls))
    ]
    if overriding:
        log.warning(
            "[rl-trace-observer] trainer modes %s override fit or _start/_stop_profiling; their steps "
            "get no global_step marker (or clock measurement) unless they call super()",
            overriding,
        )
    with _lock:
        _patches.apply(trainer_cls, "_start_profiling", _wrap_start(vars(trainer_cls)["_start_profiling"]))
        _patches.apply(trainer_cls, "_stop_profiling", _wrap_stop(vars(trainer_cls)["_stop_profiling"]))
        _patches.apply(trainer_cls, "fit", _wrap_fit(vars(trainer_cls)["fit"]))
        _state["installed"] = True


def install() -> bool:
    """Ask for step markers (now, or when VERL's V1 trainer is imported). Never raises.

    The caller decides whether this process captures; the recorder itself is created on the first
    marker, so a process that never trains writes nothing.
    """
    with _lock:
        if _state["requested"]:
            return True
        _state["requested"] = True
    when_imported(TARGET_MODULE, _install_on)
    return True


def uninstall() -> None:
    """Restore the original methods (tests)."""
    with _lock:
        _patches.revert_all()
        _state.update(requested=False, installed=False, role_set=False)
        _open.clear()


def installed() -> bool:
    return bool(_state["installed"])
