"""Register every torch-profiler trace VERL writes in the process record of the process that wrote it.

Training workers (``global_profiler.tool=torch``): VERL's torch tool builds each profiler with the
module function ``verl.utils.profiler.torch_profile.get_torch_profiler(...)`` — in continuous mode
from ``Profiler.start``, in discrete mode once per annotated stage — and writes the file from the
profiler's ``on_trace_ready`` handler through ``prof.export_chrome_trace(path)``. We wrap that
module function: it receives the exact step, scope role, worker role (``save_file_prefix``) and
rank, and we give the returned profiler an instance-level ``export_chrome_trace`` that registers
the exact path once torch has finished writing it. ``DistProfiler`` itself is not touched.

Rollout engines (vLLM/SGLang/TRT-LLM) write into ``{save_path}/agent_loop_rollout_replica_{r}/``;
their server actor moves them into ``save_path`` with ``relocate_rollout_traces``. We wrap that
function (module ``verl.utils.profiler.config`` and its re-export in ``verl.utils.profiler``) and
register what it returns — or, with relocation off, what is in the replica directory — in the
server's record with role ``rollout`` and the replica / global rank read from VERL's names. The
server does not know the trainer's step, so rollout traces carry ``step: null``; the merger
places them by time inside the trainer's profiled ``global_step`` window.

Installed only when capture is on; every surface is checked by :mod:`.contract` first.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from ...capture import get_recorder
from . import contract
from .import_hooks import when_imported
from .patching import PatchSet

log = logging.getLogger("rl_trace_observer")

TORCH_MODULE = "verl.utils.profiler.torch_profile"
CONFIG_MODULE = "verl.utils.profiler.config"
PACKAGE = "verl.utils.profiler"
KIND = "torch"

# VERL 0.9.1 trace names (REFERENCE §2): {prefix}_{role}_step{N}_rank{R}[-of-{W}][_tp..]_pid{PID}_{ts}[...]
# Anchored at the end: the free-text role parts before ``_step`` may themselves read "rank3".
_TRAIN_RE = re.compile(
    r"(?:^|_)(?:step(?P<step>\d+)_)?rank(?P<rank>\d+)(?:-of-(?P<world>\d+))?"
    r"(?:_(?:tp|pp|dp|cp)\d+(?:-(?:tp|pp|dp|cp)\d+)*)?_pid(?P<pid>\d+)_\d+"
    r"(?:_part\d+|_mb\d+(?:-\d+)?)?\.json(?:\.gz)?$"
)
_REPLICA_RE = re.compile(r"^rollout-replica(\d+)(?:-globalrank(\d+))?_")
_TRACE_SUFFIXES = (".json", ".json.gz")

_patches = PatchSet()
_lock = threading.Lock()
_state: dict[str, Any] = {"requested": False, "torch": False, "rollout": False}


# ----------------------------------------------------------------------------- name parsing
def parse_trace_name(name: str) -> dict[str, int]:
    """Step, rank, world size and pid from a VERL training-trace file name (what is present)."""
    m = _TRAIN_RE.search(name)
    if not m:
        return {}
    return {
        k: int(v)
        for k, v in (("step", m["step"]), ("rank", m["rank"]), ("world_size", m["world"]), ("pid", m["pid"]))
        if v
    }


def parse_rollout_name(name: str) -> dict[str, int]:
    """Replica and (when encoded) global rank from a relocated rollout trace name."""
    m = _REPLICA_RE.match(name)
    if not m:
        return {}
    out = {"replica": int(m.group(1))}
    if m.group(2):
        out["global_rank"] = int(m.group(2))
    return out


# ----------------------------------------------------------------------- training traces
def _register_training_trace(path: str, meta: dict[str, Any]) -> None:
    rec = get_recorder()
    if rec is None or not os.path.exists(path):
        return
    parsed = parse_trace_name(os.path.basename(path))
    if parsed.get("pid", os.getpid()) != os.getpid():
        rec.warn_once("torch:pid", f"torch trace {path} names another pid; registered anyway")
    worker_role = meta.get("save_file_prefix") or meta.get("role")
    if worker_role and rec.record().get("role") is None:
        rec.update_identity(role=str(worker_role))
    extra = {
        "scope": meta.get("role"),
        "world_size": parsed.get("world_size"),
        "source": "verl.torch_profile",
    }
    rec.register_artifact(
        path,
        KIND,
        step=_int_or_none(meta.get("profile_step"), parsed.get("step")),
        role=str(worker_role) if worker_role else None,
        rank=parsed.get("rank", _int_or_none(meta.get("rank"))),
        **{k: v for k, v in extra.items() if v is not None},
    )


def _int_or_none(*values: Any) -> int | None:
    for value in values:
        try:
            if value is not None:
                return int(value)
        except (TypeError, ValueError):
            continue
    return None


def _hook_export(prof: Any, meta: dict[str, Any]) -> None:
    """Shadow ``prof.export_chrome_trace`` on this instance so the written path gets registered."""
    original = prof.export_chrome_trace

    def export_chrome_trace(path: str, *args: Any, **kwargs: Any) -> Any:
        result = original(path, *args, **kwargs)
        try:
            _register_training_trace(str(path), meta)
        except Exception as exc:
            log.warning("[rl-trace-observer] could not register torch trace %s: %s", path, exc)
        return result

    prof.export_chrome_trace = export_chrome_trace


def _wrap_get_torch_profiler(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def get_torch_profiler(*args: Any, **kwargs: Any) -> Any:
        prof = original(*args, **kwargs)
        try:
            meta = dict(signature.bind_partial(*args, **kwargs).arguments)
            meta.pop("contents", None)
            _hook_export(prof, meta)
        except Exception as exc:
            log.warning("[rl-trace-observer] torch trace registration skipped: %s", exc)
        return prof

    return get_torch_profiler


def _install_torch(module: ModuleType) -> None:
    if not contract.check(contract.TORCH_TOOL, module):
        return
    with _lock:
        if _state["torch"]:
            return
        _patches.apply(
            module, "get_torch_profiler", _wrap_get_torch_profiler(vars(module)["get_torch_profiler"])
        )
        _state["torch"] = True


# ------------------------------------------------------------------------ rollout traces
def _register_rollout_traces(paths: list[str], replica_rank: int, relocated: bool) -> None:
    rec = get_recorder()
    if rec is None:
        return
    if paths and rec.record().get("role") is None:
        rec.update_identity(role="rollout")
    for path in paths:
        parsed = parse_rollout_name(os.path.basename(path)) if relocated else {}
        rec.register_artifact(
            path,
            KIND,
            step=None,
            role="rollout",
            rank=parsed.get("global_rank", parsed.get("replica", replica_rank)),
            replica=parsed.get("replica", replica_rank),
            relocated=relocated,
            source="verl.rollout",
            # the engine writes it from its own worker processes: they are this replica's engine, so the
            # merge draws them as this server's process, beside its request spans
            engine_of_owner=True,
        )


def _unrelocated(module: ModuleType, profiler_config: Any, rank: int) -> list[str]:
    directory = Path(module.rollout_trace_dir(profiler_config, rank))
    if not directory.is_dir():
        return []
    return sorted(str(p) for p in directory.iterdir() if p.is_file() and p.name.endswith(_TRACE_SUFFIXES))


def _wrap_relocate(original: Callable[..., Any], module: ModuleType) -> Callable[..., Any]:
    @functools.wraps(original)
    def relocate_rollout_traces(profiler_config: Any, rank: int, *args: Any, **kwargs: Any) -> Any:
        moved = original(profiler_config, rank, *args, **kwargs)
        try:
            if getattr(profiler_config, "relocate_results", False):
                _register_rollout_traces([str(p) for p in moved or []], int(rank), relocated=True)
            else:
                _register_rollout_traces(
                    _unrelocated(module, profiler_config, int(rank)), int(rank), relocated=False
                )
        except Exception as exc:
            log.warning("[rl-trace-observer] could not register rollout traces: %s", exc)
        return moved

    relocate_rollout_traces.__rl_trace_observer__ = True  # type: ignore[attr-defined]
    return relocate_rollout_traces


def _install_rollout(module: ModuleType) -> None:
    if not contract.check(contract.ROLLOUT_TRACES, module):
        return
    with _lock:
        if _state["rollout"]:
            return
        wrapper = _wrap_relocate(vars(module)["relocate_rollout_traces"], module)
        _patches.apply(module, "relocate_rollout_traces", wrapper)
        _state["rollout"] = wrapper
    # The package re-exports the name; patch it when it is (or becomes) the original.
    when_imported(PACKAGE, _patch_reexport)


def _patch_reexport(package: ModuleType) -> None:
    wrapper = _state["rollout"]
    current = vars(package).get("relocate_rollout_traces")
    if wrapper and current is not None and current is not wrapper:
        with _lock:
            _patches.apply(package, "relocate_rollout_traces", wrapper)


def install() -> bool:
    """Ask for torch-trace registration (now, or when VERL's profiler modules load). Never raises.

    The caller decides whether this process captures (see :func:`.hooks.install_capture_hooks`).
    """
    with _lock:
        if _state["requested"]:
            return True
        _state["requested"] = True
    when_imported(TORCH_MODULE, _install_torch)
    when_imported(CONFIG_MODULE, _install_rollout)
    return True


def uninstall() -> None:
    """Restore VERL's functions (tests). Profilers already created keep their export hook."""
    with _lock:
        _patches.revert_all()
        _state.update(requested=False, torch=False, rollout=False)
