"""Server side of rollout requests, and the replica's part of weight sync, in VERL's server actors.

A VERL rollout server is a plain class that a ``RolloutReplica`` turns into a Ray actor
(``vLLMHttpServer``, ``SGLangHttpServer``, ``TRTLLMHttpServer``; a registered rollout brings its
own, e.g. TokenSpeed's). What they share, and what we wrap:

- ``generate(..., request_id, ...)`` → one ``engine_request`` span per call, on the replica's slot
  lanes, with ``replica`` (``self.replica_rank``), ``version`` (``self.global_steps``: the policy
  version it served), token counts and status. The engine's own per-request times become
  ``queue``/``prefill``/``decode`` sub-spans: the server's engine handle is tapped once per
  instance — ``self.engine.generate`` (vLLM's ``AsyncLLM``: its ``RequestOutput.metrics``)
  or ``self.tokenizer_manager.generate_request`` (SGLang: ``meta_info["queue_time"]``) — by a
  pass-through async iterator that keeps the stream's first item (see :class:`_Tap`).
- control methods, as phases on the replica's ``weight_sync`` lane: ``abort_all_requests``
  (``pause``), ``resume_generation``, ``sleep``, ``wake_up``, ``clear_kv_cache`` (``cache_reset``),
  ``release_kv_cache``, ``resume_kv_cache``; ``set_global_steps`` marks the new ``weight_version``.

Ray takes an actor's methods from its class when the server process loads it, so the class is
wrapped as its module finishes importing: VERL's own servers by a post-import hook; any other server
class by calling :func:`trace_rollout_server` on it in the module that defines it (as a decorator
or after the class statement) — that module is the first thing a server process imports, before
``import verl`` runs the plugins. With capture off the call only marks the class.
"""

from __future__ import annotations

import functools
import inspect
import logging
import operator
import threading
from collections.abc import Callable
from contextvars import ContextVar
from types import ModuleType
from typing import Any, TypeVar

from ...capture import requests as rq
from ...config import load as load_config
from .import_hooks import when_imported
from .patching import PatchSet

log = logging.getLogger("rl_trace_observer")

KNOWN_SERVERS = (
    ("verl.workers.rollout.vllm_rollout.vllm_async_server", "vLLMHttpServer"),
    ("verl.workers.rollout.sglang_rollout.async_sglang_server", "SGLangHttpServer"),
    ("verl.workers.rollout.trtllm_rollout.trtllm_async_server", "TRTLLMHttpServer"),
)
CONTROL_PHASES = {
    "abort_all_requests": "pause",
    "resume_generation": "resume_generation",
    "sleep": "sleep",
    "wake_up": "wake_up",
    "clear_kv_cache": "cache_reset",
    "release_kv_cache": "release_kv_cache",
    "resume_kv_cache": "resume_kv_cache",
}
ROLE = "rollout"
_MARK = "__rl_trace_rollout_server__"
_TAPPED = "_rl_trace_tapped"
_WRAPPED = "_rl_trace_wrapped"  # on our wrappers: a subclass of a traced server is not wrapped twice

_patches = PatchSet()
_lock = threading.Lock()
_state: dict[str, bool] = {"requested": False}

C = TypeVar("C", bound=type)


class _Call:
    """What the engine tap learned about the request whose ``generate`` is running.

    Class-level defaults and no ``__init__``: made once per request, and a Python ``__init__``
    costs more than the rest of its creation (an instance sets only what it learns)."""

    first: Any = None
    kind = ""
    phases: rq.EnginePhases | None = None  # told by the server itself (note_engine_phases)


_current: ContextVar[_Call | None] = ContextVar("rl_trace_server_call", default=None)


# ------------------------------------------------------------------------------- engine taps
class _Tap:
    """Async-iterator proxy that keeps the engine stream's FIRST item, then steps aside.

    The first is enough: vLLM hands every ``RequestOutput`` of a request the same
    ``RequestStateStats`` object (``metrics=self.stats`` in its output processor), updated in place
    up to the last token, and SGLang's server reads one item. After the first item the proxy turns
    into a :class:`_Passing` (same slots, ``__class__`` swapped): its ``__anext__`` is a property
    made of C callables that hands out the engine stream's own awaitable, so a long stream runs no
    Python frame of ours per token.
    """

    __slots__ = ("_call", "_it", "_next")

    def __init__(self, it: Any, call: _Call) -> None:
        self._it = it
        self._call = call

    def __aiter__(self) -> _Tap:
        return self

    async def __anext__(self) -> Any:  # the first item (one frame: the coroutine itself)
        it = self._it
        try:
            item = await it.__anext__()
        finally:
            self._next = it.__anext__  # bound once: _Passing hands it out per item
            self.__class__ = _Passing  # whatever came: later items go straight through
        self._call.first = item
        return item

    def __getattr__(self, name: str) -> Any:  # aclose, athrow, ... of the real generator
        return getattr(self._it, name)


class _Passing(_Tap):
    """A :class:`_Tap` past its first item: ``async for`` gets the stream's ``__anext__()`` as is.

    Special methods are looked up on the type; a property there is called through C
    (``attrgetter``), then its result (the stream's bound ``__anext__``, kept in ``_next``) is
    called with no args.
    """

    __slots__ = ()
    __anext__ = property(operator.attrgetter("_next"))


_new = object.__new__  # a _Tap without the Python __init__ frame (the tap's hot path)


def _tap(fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def tapped(*args: Any, **kwargs: Any) -> Any:
        stream = fn(*args, **kwargs)
        call = _current.get()
        if call is None or not hasattr(stream, "__anext__"):
            return stream
        call.kind = kind
        tap = _new(_Tap)
        tap._it = stream
        tap._call = call
        return tap

    return tapped


def _tap_engine(server: Any) -> None:
    """Once per server instance: tap the engine handle this server generates with, if it has one."""
    try:
        setattr(server, _TAPPED, True)
        engine = getattr(server, "engine", None)
        if engine is not None and callable(getattr(engine, "generate", None)):
            engine.generate = _tap(engine.generate, "vllm")
            return
        manager = getattr(server, "tokenizer_manager", None)
        if manager is not None and callable(getattr(manager, "generate_request", None)):
            manager.generate_request = _tap(manager.generate_request, "sglang")
    except Exception as exc:  # a read-only engine object: spans without phases
        log.debug("[rl-trace-observer] engine tap: %s", exc)


def note_engine_phases(phases: rq.EnginePhases | None) -> None:
    """From inside a traced server's ``generate``: this request's engine times, for servers whose
    engine is not an in-process handle (an HTTP engine such as TokenSpeed's: parse its answer's
    ``meta_info``, e.g. with ``capture.requests.phases_from_sglang``). No-op anywhere else."""
    call = _current.get()
    if call is not None:
        call.phases = phases


def _engine_args(call: _Call, start_ns: int, args: dict[str, Any]) -> None:
    """What the engine tap learned, into the span's ``args``: ``preemptions`` then ``engine_ns``,
    as ``end_server(phases=...)`` writes them (vLLM's metrics are read once for both)."""
    first = call.first
    phases = call.phases
    if first is not None:
        if call.kind == "vllm":
            metrics = getattr(first, "metrics", None)
            preempted = getattr(metrics, "num_preemptions", 0)  # rq.preemptions_from_vllm, inline
            if type(preempted) is int and preempted > 0:  # the scheduler took its KV cache back
                args["preemptions"] = preempted
            if phases is None:
                engine_ns = rq.engine_ns_from_vllm(metrics)
                if engine_ns is not None:
                    args["engine_ns"] = engine_ns
                return
        elif phases is None and call.kind == "sglang" and isinstance(first, dict):
            phases = rq.phases_from_sglang(first.get("meta_info"), start_ns)
    if phases is not None:  # four edges unless the engine told its arrival too
        args["engine_ns"] = list(phases) if phases.arrival_ns is not None else list(phases[:4])


# ----------------------------------------------------------------------------------- wrappers
def _name_role(req: rq.Request, replica: Any) -> None:
    """A server process unprofiled has no role of its own (only its profiler's trace names it): its
    first request does, so the merge labels it ``rollout`` whatever else it records."""
    rec = req.pool.rec
    if rec.record().get("role") is None:
        rec.update_identity(role=ROLE, **({"replica": replica} if replica is not None else {}))


def _wrap_generate(
    original: Callable[..., Any], rid_index: int, prompt_index: int | None
) -> Callable[..., Any]:
    """One ``engine_request`` span per call. Written flat (the capture API's begin and end inlined
    to one call each, the span's args built in place in ``begin_server``/``end_server``'s order):
    it runs once per request in the replica."""
    begin = rq._begin  # begin_server with the args dict built here
    end = rq._write_span  # end_server with the end fields put into req.args here
    current = _current
    if prompt_index is None:
        prompt_index = 1 << 30  # never a position: one comparison below

    @functools.wraps(original)
    async def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        req = token = call = version = None
        try:
            rid = kwargs["request_id"] if "request_id" in kwargs else args[rid_index]
            prompt = kwargs.get("prompt_ids")
            if prompt is None and prompt_index < len(args):
                prompt = args[prompt_index]
            try:
                prompt_tokens = len(prompt) if prompt is not None else None
            except TypeError:
                prompt_tokens = None
            version = getattr(self, "global_steps", None)
            replica = getattr(self, "replica_rank", None)
            fields = {"prompt_tokens": prompt_tokens, "version": version}
            if replica is not None:
                fields["replica"] = replica
            req = begin(rid, replica, fields)
            if req is not None:
                if not getattr(self, _TAPPED, False):
                    _tap_engine(self)
                    _name_role(req, replica)
                call = _Call()
                token = current.set(call)
        except Exception as exc:
            log.debug("[rl-trace-observer] server request begin: %s", exc)
        output: Any = None
        status: str | None = None
        try:
            output = await original(self, *args, **kwargs)
            return output
        except BaseException as exc:
            status = f"error: {type(exc).__name__}"
            raise
        finally:
            if token is not None:
                current.reset(token)
            if req is not None:
                try:  # what end_server(req, response_tokens=..., ...) adds, None left out
                    span = req.args
                    tokens = getattr(output, "token_ids", None)
                    if tokens is not None:
                        try:
                            span["response_tokens"] = len(tokens)
                        except TypeError:
                            pass
                    if status is None:
                        status = getattr(output, "stop_reason", None)
                    if status is not None:
                        span["status"] = status
                    now = getattr(self, "global_steps", None)
                    if now is not None and now != version:
                        span["version_end"] = now
                    if call is not None:
                        _engine_args(call, req.start_ns, span)
                except Exception as exc:
                    log.debug("[rl-trace-observer] server request end: %s", exc)
                end(req, rq.SERVER_SPAN, "flow_in")  # never raises; gives the slot back

    return generate


def _wrap_control(original: Callable[..., Any], phase: str) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def control(self: Any, *args: Any, **kwargs: Any) -> Any:
            with rq.weight_sync(phase, replica=getattr(self, "replica_rank", None)):
                return await original(self, *args, **kwargs)

        return control

    @functools.wraps(original)
    def control_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        with rq.weight_sync(phase, replica=getattr(self, "replica_rank", None)):
            return original(self, *args, **kwargs)

    return control_sync


def _wrap_set_version(original: Callable[..., Any]) -> Callable[..., Any]:
    def mark(self: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            version = kwargs.get("global_steps", args[0] if args else None)
            rq.mark_version(version, replica=getattr(self, "replica_rank", None))
        except Exception as exc:
            log.debug("[rl-trace-observer] weight version: %s", exc)

    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def set_global_steps(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = await original(self, *args, **kwargs)
            mark(self, args, kwargs)
            return result

        return set_global_steps

    @functools.wraps(original)
    def set_global_steps_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        mark(self, args, kwargs)
        return result

    return set_global_steps_sync


# ------------------------------------------------------------------------------------ install
def _problem(cls: type) -> str | None:
    """None when ``cls`` looks like a VERL rollout server: an async ``generate`` taking request_id."""
    gen = getattr(cls, "generate", None)
    if gen is None or not inspect.iscoroutinefunction(gen):
        return "has no async generate method"
    try:
        params = list(inspect.signature(gen).parameters)
    except (TypeError, ValueError):
        return "generate has no readable signature"
    if "request_id" not in params:
        return "generate has no request_id parameter"
    return None


def _instrument(cls: type) -> bool:
    with _lock:
        if vars(cls).get(_MARK) == "wrapped":
            return True
        problem = _problem(cls)
        if problem is not None:
            log.error(
                "[rl-trace-observer] rollout server %s.%s %s; its request spans are off",
                cls.__module__,
                cls.__qualname__,
                problem,
            )
            return False
        gen = inspect.getattr_static(cls, "generate")
        params = list(inspect.signature(gen).parameters)
        rid_index = params.index("request_id") - 1  # positions after self
        prompt_index = params.index("prompt_ids") - 1 if "prompt_ids" in params else None
        wrappers: dict[str, Callable[[Any], Any]] = {
            "generate": lambda fn: _wrap_generate(fn, rid_index, prompt_index),
            "set_global_steps": _wrap_set_version,
        }
        for name, phase in CONTROL_PHASES.items():
            wrappers[name] = functools.partial(_wrap_control, phase=phase)
        for name, wrap in wrappers.items():
            fn = inspect.getattr_static(cls, name, None)
            if callable(fn) and not getattr(fn, _WRAPPED, False):
                wrapper = wrap(fn)
                setattr(wrapper, _WRAPPED, True)
                _patches.apply(cls, name, wrapper)
        _patches.apply(cls, _MARK, "wrapped")
        return True


def trace_rollout_server(cls: C) -> C:
    """Record request spans (and control phases) of a rollout server class; returns the class.

    For rollouts VERL does not ship (TokenSpeed's, a custom engine's): call it in the module that
    defines the server class, right after the class (or as a decorator). Does nothing unless this
    process captures with ``RL_TRACE_REQUESTS`` on; never raises.
    """
    try:
        cfg = load_config()  # not the recorder: a process that only imports the class writes no file
        if cfg.capture_enabled and cfg.requests:
            _instrument(cls)
    except Exception as exc:
        log.error("[rl-trace-observer] cannot trace rollout server %r: %s", cls, exc)
    return cls


def _on_module(name: str) -> Callable[[ModuleType], None]:
    def hook(module: ModuleType) -> None:
        cls = getattr(module, name, None)
        if isinstance(cls, type):
            _instrument(cls)

    return hook


def install() -> bool:
    """Wrap VERL's own server classes when their modules load (the caller checked capture)."""
    with _lock:
        if _state["requested"]:
            return True
        _state["requested"] = True
    for module, name in KNOWN_SERVERS:
        when_imported(module, _on_module(name))
    return True


def uninstall() -> None:
    with _lock:
        _patches.revert_all()
        _state["requested"] = False
