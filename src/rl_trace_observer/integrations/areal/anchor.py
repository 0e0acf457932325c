"""The anchor: AReaL's perf_counter origin as wall-clock ns, recorded when ``configure()`` runs.

The wrapper calls AReaL's own ``configure``, then reads the three clocks together (a capture clock
snapshot: ``perf_ns``, ``wall_ns``, ``mono_ns``) and computes the wall-clock ns at which the tracer's
``ts`` is 0: ``wall_ns - (perf_ns - origin)``, where ``origin`` is the tracer's ``_origin_ns`` (exact)
or, if a later AReaL renames it, the ``perf_counter_ns()`` read just before ``configure`` (then the
anchor may be early by as long as ``configure`` took, which is said as ``anchor_error_ns``). The
perf trace (when the tracer is enabled: AReaL configures disabled ones too) and session file are
registered as artifacts of this process with that anchor (optional: they exist only once AReaL
saves). Everything goes through the never-stall recorder; a failure is logged once and AReaL goes
on as if we were not there.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from types import ModuleType
from typing import Any

from ...capture import get_recorder, snapshot
from ..verl.import_hooks import forget, when_imported
from ..verl.patching import PatchSet

log = logging.getLogger("rl_trace_observer")

MODULE = "areal.utils.perf_tracer"
SNAPSHOT_REASON = "areal_configure"
PERF_KIND = "areal_perf"  # the merge's format kinds for the two files
SESSIONS_KIND = "areal_sessions"

_patches = PatchSet()
_lock = threading.Lock()
_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning("[rl-trace-observer] AReaL anchor: %s", message)


def anchor_of(tracer: Any, before_ns: int, snap: dict[str, Any]) -> tuple[int, int, int]:
    """(origin perf ns, wall ns at ts 0, how early it may be): from the tracer's origin if it has one."""
    origin = getattr(tracer, "_origin_ns", None)
    error = 0
    if not isinstance(origin, int) or isinstance(origin, bool):
        origin, error = before_ns, max(0, int(snap["perf_ns"]) - before_ns)
    return origin, int(snap["wall_ns"]) - (int(snap["perf_ns"]) - origin), error


def record_anchor(tracer: Any, before_ns: int, rank: int, role: str | None) -> dict[str, Any] | None:
    """Write the anchor of a freshly configured tracer (None: capture is off)."""
    rec = get_recorder()
    if rec is None:
        return None
    read = snapshot(rec.clock, SNAPSHOT_REASON)
    origin, anchor, error = anchor_of(tracer, before_ns, read)
    extra = {"rank": rank, "role": role, "areal_pid": os.getpid()}
    extra.update(perf_origin_ns=origin, anchor_ns=anchor, anchor_error_ns=error)
    readings = {k: v for k, v in read.items() if k != "reason"}
    snap = rec.clock_snapshot(SNAPSHOT_REASON, **readings, **extra)
    identity = rec.record()
    if identity.get("rank") is None:
        rec.update_identity(rank=rank)
    if role and not identity.get("role"):
        rec.update_identity(role=role)
    perf_path = getattr(tracer, "_output_path", None)
    if isinstance(perf_path, str) and getattr(tracer, "enabled", True):  # AReaL configures disabled ones too
        rec.register_artifact(
            perf_path, PERF_KIND, rank=rank, role=role, anchor_ns=anchor, anchor_error_ns=error, optional=True
        )
    sessions = getattr(getattr(tracer, "session_tracer", None), "_output_path", None)
    if isinstance(sessions, str):
        rec.register_artifact(sessions, SESSIONS_KIND, rank=rank, role=role, optional=True)
    rec.write_record()
    return snap


def _wrap(original: Any) -> Any:
    @functools.wraps(original)
    def configure(*args: Any, **kwargs: Any) -> Any:
        before = time.perf_counter_ns()
        tracer = original(*args, **kwargs)
        try:
            rank = kwargs.get("rank", args[1] if len(args) > 1 else 0)
            record_anchor(tracer, before, int(rank), kwargs.get("role", args[2] if len(args) > 2 else None))
        except Exception as exc:  # never AReaL's problem
            _warn_once("record", f"not recorded: {exc!r}")
        return tracer

    configure.__rl_trace_wrapped__ = original  # type: ignore[attr-defined]
    return configure


def _patch(module: ModuleType) -> None:
    with _lock:
        if _patches.patched(module, "configure"):
            return
        original = vars(module).get("configure")
        if original is None:
            _warn_once("shape", f"{MODULE} has no configure(): nothing patched")
            return
        _patches.apply(module, "configure", _wrap(original))


def install(enabled: bool) -> bool:
    """Patch ``perf_tracer.configure`` now or when AReaL imports it; False (nothing done) unless enabled."""
    if not enabled:
        return False
    when_imported(MODULE, _patch)
    return True


def uninstall() -> None:
    """Put AReaL's own ``configure`` back and forget a hook still waiting for the import."""
    forget(MODULE)
    _patches.revert_all()
