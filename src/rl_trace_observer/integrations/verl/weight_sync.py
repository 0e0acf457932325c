"""Weight sync, decomposed: the trainer's side and every replica's side as nested phases.

Trainer (the process running the loop): ``verl.checkpoint_engine.base.CheckpointEngineManager`` —
``update_weights`` (args ``version``, ``backend``) and the steps it is made of, each its own
method: ``abort_replicas`` (``pause``), ``release_kv_cache_replicas``, ``build_process_group``
(``build_group``), ``resume_kv_cache_replicas``, ``resume_generation_replicas``; also
``sleep_replicas`` / ``wake_up_replicas`` (colocated replicas give their memory back around
training). These are ``auto_await`` functions (callable with or without ``await``, decided from
the caller's frame), so the async function inside is wrapped and re-decorated with VERL's own
``auto_await``: the caller-frame test still sees the real caller.

Replica (the process holding the rollout adapter: each training rank of a colocated replica, or
the checkpoint-engine worker of a standalone one): every ``BaseRollout`` subclass's
``update_weights`` (``load_weights``: transfer and load as the engine receives them, with
``bytes``/``tensors`` counted off the weight stream and ``gather_ns``, the time spent waiting for
the trainer side to produce them), ``resume(tags)`` (``resume_weights``, ``resume_kv_cache``) and
``release``. Subclasses are caught as they are defined (``BaseRollout.__init_subclass__``), so
TokenSpeed's or any registered adapter is covered without naming it. The server's own part (abort,
sleep, wake-up, cache reset, the new version) is in :mod:`.rollout_servers`.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import ContextVar
from types import ModuleType
from typing import Any

from ...capture import requests as rq
from . import contract
from .import_hooks import when_imported
from .patching import PatchSet

log = logging.getLogger("rl_trace_observer")

MANAGER_MODULE = "verl.checkpoint_engine.base"
ADAPTER_MODULE = "verl.workers.rollout.base"
MANAGER_PHASES = {
    "update_weights": "update_weights",
    "abort_replicas": "pause",
    "release_kv_cache_replicas": "release_kv_cache",
    "build_process_group": "build_group",
    "resume_kv_cache_replicas": "resume_kv_cache",
    "resume_generation_replicas": "resume_generation",
    "sleep_replicas": "sleep",
    "wake_up_replicas": "wake_up",
}
ADAPTER_METHODS = ("update_weights", "resume", "release")

_patches = PatchSet()
_lock = threading.Lock()
_state: dict[str, Any] = {"requested": False, "manager": False, "adapters": False, "base": None}
_inside: ContextVar[str | None] = ContextVar("rl_trace_adapter_phase", default=None)


# ------------------------------------------------------------------------------------ trainer
def _manager_fields(phase: str, self: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    if phase != "update_weights":
        return {}
    version = kwargs.get("global_steps", args[0] if args else None)
    return {"version": version, "backend": getattr(self, "backend", None)}


def _wrap_manager(
    original: Callable[..., Any], phase: str, auto_await: Callable[..., Any]
) -> Callable[..., Any]:
    inner = getattr(original, "__wrapped__", None)
    if inner is not None and inspect.iscoroutinefunction(inner):  # an auto_await function

        @functools.wraps(inner)
        async def phase_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            with rq.weight_sync(phase, **_manager_fields(phase, self, args, kwargs)):
                return await inner(self, *args, **kwargs)

        return auto_await(phase_async)  # type: ignore[no-any-return]
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def phase_coro(self: Any, *args: Any, **kwargs: Any) -> Any:
            with rq.weight_sync(phase, **_manager_fields(phase, self, args, kwargs)):
                return await original(self, *args, **kwargs)

        return phase_coro

    @functools.wraps(original)
    def phase_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        with rq.weight_sync(phase, **_manager_fields(phase, self, args, kwargs)):
            return original(self, *args, **kwargs)

    return phase_sync


def _install_manager(module: ModuleType) -> None:
    import importlib

    with _lock:
        if _state["manager"] or not _state["requested"]:
            return
        if not contract.check(contract.WEIGHT_SYNC):  # each surface from its own module
            return
        ray_utils = importlib.import_module("verl.utils.ray_utils")
        cls = module.CheckpointEngineManager
        for name, phase in MANAGER_PHASES.items():
            _patches.apply(cls, name, _wrap_manager(vars(cls)[name], phase, ray_utils.auto_await))
        _state["manager"] = True


# ------------------------------------------------------------------------------------ replica
class _Moved:
    """What flowed through one weight stream: bytes, tensors, and the wait for the producer."""

    __slots__ = ("bytes", "gather_ns", "tensors")

    def __init__(self) -> None:
        self.bytes = self.tensors = self.gather_ns = 0

    def add(self, item: Any) -> None:
        if isinstance(item, tuple) and len(item) == 2:
            nbytes = getattr(item[1], "nbytes", None)
            if type(nbytes) is int:
                self.bytes += nbytes
                self.tensors += 1


def _count_sync(stream: Iterator[Any], moved: _Moved) -> Iterator[Any]:
    clock = time.perf_counter_ns
    while True:
        t0 = clock()
        try:
            item = next(stream)
        except StopIteration:
            return
        moved.gather_ns += clock() - t0
        moved.add(item)
        yield item


async def _count_async(stream: AsyncIterator[Any], moved: _Moved) -> AsyncIterator[Any]:
    clock = time.perf_counter_ns
    while True:
        t0 = clock()
        try:
            item = await stream.__anext__()
        except StopAsyncIteration:
            return
        moved.gather_ns += clock() - t0
        moved.add(item)
        yield item


def _counted(weights: Any, moved: _Moved) -> Any:
    """The same kind of stream, counted; anything that is not a generator passes untouched."""
    if inspect.isgenerator(weights):
        return _count_sync(weights, moved)
    if inspect.isasyncgen(weights):
        return _count_async(weights, moved)
    return weights


def _adapter_phase(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    if name != "resume":
        return "load_weights" if name == "update_weights" else name
    tags = kwargs.get("tags", args[0] if args else None)
    if isinstance(tags, list | tuple) and tags:
        return "resume_" + "+".join(str(t) for t in tags)
    return "resume"


def _wrap_adapter(original: Callable[..., Any], name: str) -> Callable[..., Any]:
    @functools.wraps(original)
    async def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        phase = _adapter_phase(name, args, kwargs)
        if _inside.get() == phase:  # a subclass calling super(): one span, not two
            return await original(self, *args, **kwargs)
        moved = None
        if name == "update_weights":
            moved = _Moved()
            if args:
                args = (_counted(args[0], moved), *args[1:])
            elif "weights" in kwargs:
                kwargs["weights"] = _counted(kwargs["weights"], moved)
        fields: dict[str, Any] = {"version": kwargs.get("global_steps")}
        if "wire_format" in kwargs:
            fields["wire_format"] = kwargs["wire_format"]
        token = _inside.set(phase)
        try:
            with rq.weight_sync(phase, replica=getattr(self, "replica_rank", None), **fields) as ph:
                try:
                    return await original(self, *args, **kwargs)
                finally:
                    if moved is not None and moved.tensors:
                        ph.args.update(bytes=moved.bytes, tensors=moved.tensors, gather_ns=moved.gather_ns)
        finally:
            _inside.reset(token)

    method._rl_trace_wrapped = True  # type: ignore[attr-defined]
    return method


def _patch_adapter(cls: type) -> None:
    for name in ADAPTER_METHODS:
        fn = vars(cls).get(name)
        if (
            fn is None
            or getattr(fn, "_rl_trace_wrapped", False)
            or getattr(fn, "__isabstractmethod__", False)
        ):
            continue
        if not inspect.iscoroutinefunction(fn):
            continue  # VERL's adapters are async; leave anything else alone
        _patches.apply(cls, name, _wrap_adapter(fn, name))


def _subclasses(cls: type) -> list[type]:
    out, todo = [], list(cls.__subclasses__())
    while todo:
        sub = todo.pop()
        out.append(sub)
        todo.extend(sub.__subclasses__())
    return out


def _install_adapters(module: ModuleType) -> None:
    with _lock:
        if _state["adapters"] or not _state["requested"]:
            return
        if not contract.check(contract.ADAPTERS, module):
            return
        base = module.BaseRollout
        previous = inspect.getattr_static(base, "__init_subclass__")

        def __init_subclass__(cls: type, **kwargs: Any) -> None:
            super(base, cls).__init_subclass__(**kwargs)
            try:
                with _lock:
                    _patch_adapter(cls)
            except Exception as exc:
                log.error("[rl-trace-observer] weight-sync phases of %s are off: %s", cls.__qualname__, exc)

        if "__init_subclass__" in vars(base) and previous is not None:
            log.error(
                "[rl-trace-observer] BaseRollout defines __init_subclass__; replica weight-sync phases off"
            )
            return
        _patches.apply(base, "__init_subclass__", classmethod(__init_subclass__))
        for sub in _subclasses(base):  # adapters defined before we were installed
            _patch_adapter(sub)
        _state.update(adapters=True, base=base)


def install() -> bool:
    """Ask for both sides' phases (now, or when VERL's modules load). Never raises."""
    with _lock:
        if _state["requested"]:
            return True
        _state["requested"] = True
    when_imported(MANAGER_MODULE, _install_manager)
    when_imported(ADAPTER_MODULE, _install_adapters)
    return True


def uninstall() -> None:
    with _lock:
        _patches.revert_all()
        _state.update(requested=False, manager=False, adapters=False, base=None)
