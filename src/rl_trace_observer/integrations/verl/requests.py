"""Client side of rollout requests in VERL 0.9.1: one ``rollout_request`` span per server call.

Surfaces (checked by :mod:`.contract` when their module loads; a mismatch turns only this off):

- ``LLMServerClient.generate`` (``verl.workers.rollout.llm_server``): what every agent loop calls
  (``server_manager.generate``) in the agent-loop worker; the span runs from that call until the
  answer is back. ``FullyAsyncLLMServerClient`` resumes aborted requests by calling it again, so a
  partial rollout shows as several requests of one turn (``attempt`` 0, 1, ...).
- ``LLMServerClient._vllm_request_id``: VERL sends the server a fresh ``uuid4().hex`` per call (not
  the caller's sticky-session id), so the id the server sees is read here, inside the call; the
  caller's id is kept as ``session``.
- ``LLMServerClient._release_server``: the load balancer's choice (``server``, the replica address),
  which ``generate`` hands back in its ``finally`` (a plain call: cheaper to wrap than the acquire
  coroutine).
- ``AgentLoopWorker._run_agent_loop`` (``verl.experimental.agent_loop.agent_loop``): the sample a
  call belongs to (``step``, ``sample_index``, ``rollout_n``, ``validate``; V1's ``uid`` and
  ``session_id``), kept in a context variable for the calls the agent loop makes, which also
  counts its turns.

Every wrapper catches its own failures: a request never fails or waits because of us.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from contextvars import ContextVar
from types import ModuleType
from typing import Any

from ...capture import requests as rq
from . import contract
from .import_hooks import when_imported
from .patching import PatchSet

log = logging.getLogger("rl_trace_observer")

CLIENT_MODULE = "verl.workers.rollout.llm_server"
AGENT_LOOP_MODULE = "verl.experimental.agent_loop.agent_loop"
_ABORTED = ("aborted", "abort")
ROLE = "agent_loop"
_roles: dict[int, Any] = {}

_patches = PatchSet()
_lock = threading.Lock()
_state: dict[str, bool] = {"requested": False, "client": False, "agent_loop": False}


class _Sample:
    """The agent-loop sample whose task is running: identity, and its turns so far."""

    __slots__ = ("attempt", "fields", "last_aborted", "last_session", "turns")

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields
        self.turns = 0
        self.attempt = 0
        self.last_session: Any = None
        self.last_aborted = False

    def next_call(self, session: Any) -> tuple[int, int]:
        """(turn, attempt) of the next server call: a resumed abort is the same turn again."""
        if self.last_aborted and session == self.last_session and self.turns:
            self.attempt += 1
        else:
            self.turns += 1
            self.attempt = 0
        self.last_session = session
        return self.turns, self.attempt


_sample: ContextVar[_Sample | None] = ContextVar("rl_trace_agent_sample", default=None)
_call: ContextVar[rq.Request | None] = ContextVar("rl_trace_client_request", default=None)


def _plain(value: Any) -> Any:
    """numpy scalars (VERL's sample index) as Python values: the event encoder knows those."""
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, str | bytes):
        try:
            return item()
        except Exception:
            return str(value)
    return value


def _sample_fields(trajectory: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if isinstance(trajectory, dict):
        for key in ("step", "sample_index", "rollout_n", "validate"):
            if trajectory.get(key) is not None:
                fields[key] = _plain(trajectory[key])
    for key in ("uid", "session_id", "agent_name"):
        if kwargs.get(key) is not None:
            fields[key] = _plain(kwargs[key])
    return fields


# -------------------------------------------------------------------------------- the wrappers
def _wrap_run_agent_loop(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def _run_agent_loop(
        self: Any, sampling_params: Any, trajectory: Any, *args: Any, **kwargs: Any
    ) -> Any:
        token = None
        try:
            token = _sample.set(_Sample(_sample_fields(trajectory, kwargs)))
        except Exception as exc:
            log.debug("[rl-trace-observer] agent-loop identity: %s", exc)
        try:
            return await original(self, sampling_params, trajectory, *args, **kwargs)
        finally:
            if token is not None:
                _sample.reset(token)

    return _run_agent_loop


def _begin(request_id: Any, kwargs: dict[str, Any]) -> rq.Request | None:
    fields: dict[str, Any] = {"session": str(request_id)}
    sample = _sample.get()
    if sample is not None:
        fields.update(sample.fields)
        fields["turn"], fields["attempt"] = sample.next_call(request_id)
    prompt = kwargs.get("prompt_ids")
    if prompt is not None:
        try:
            fields["prompt_tokens"] = len(prompt)
        except TypeError:
            pass
    # the id the server will see is not known yet (see _vllm_request_id): the session until then
    req = rq.begin_client(request_id, fields)
    if req is not None and _role_unset(req):
        req.pool.rec.update_identity(role=ROLE)
    return req


def _role_unset(req: rq.Request) -> bool:
    """Once per recorder: an agent-loop worker has no role of its own until its first request."""
    rec = req.pool.rec
    if _roles.get(id(rec)) is rec:
        return False
    _roles[id(rec)] = rec
    return rec.record().get("role") is None


def _end(req: rq.Request, output: Any, error: BaseException | None) -> None:
    fields: dict[str, Any] = {}
    sample = _sample.get()
    if error is not None:
        fields["status"] = f"error: {type(error).__name__}"
    else:
        tokens = getattr(output, "token_ids", None)
        if tokens is not None:
            fields["response_tokens"] = len(tokens)
        status = getattr(output, "stop_reason", None)
        fields["status"] = status
        extra = getattr(output, "extra_fields", None)
        if isinstance(extra, dict):
            version = extra.get("global_steps")
            fields["version"] = version if version is None or type(version) is int else _plain(version)
        preempted = getattr(output, "num_preempted", None)
        if preempted:
            fields["preempted"] = preempted
    if sample is not None:
        sample.last_aborted = fields.get("status") in _ABORTED
    rq.end_client(req, fields)


def _wrap_generate(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def generate(self: Any, request_id: Any, *args: Any, **kwargs: Any) -> Any:
        req = token = None
        try:
            req = _begin(request_id, kwargs)
            if req is not None:
                token = _call.set(req)
        except Exception as exc:
            log.debug("[rl-trace-observer] request begin: %s", exc)
        output: Any = None
        error: BaseException | None = None
        try:
            output = await original(self, request_id, *args, **kwargs)
            return output
        except BaseException as exc:
            error = exc
            raise
        finally:
            if token is not None:
                _call.reset(token)
            if req is not None:
                try:
                    _end(req, output, error)
                except Exception as exc:
                    log.debug("[rl-trace-observer] request end: %s", exc)

    return generate


def _wrap_request_id(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _vllm_request_id(self: Any, request_id: Any, *args: Any, **kwargs: Any) -> Any:
        sent = original(self, request_id, *args, **kwargs)
        req = _call.get()
        if req is not None:
            req.id = str(sent)  # the server's key: both spans name the flow after it
            req.args["request_id"] = req.id
        return sent

    return _vllm_request_id


def _wrap_release(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _release_server(self: Any, server_id: Any, *args: Any, **kwargs: Any) -> Any:
        req = _call.get()
        if req is not None:
            req.args["server"] = str(server_id)  # the balancer's choice, handed back in ``finally``
        return original(self, server_id, *args, **kwargs)

    return _release_server


# ----------------------------------------------------------------------------------- install
def _install_client(module: ModuleType) -> None:
    with _lock:
        if _state["client"] or not _state["requested"]:
            return
        if not contract.check(contract.REQUEST_CLIENT, module):
            return
        cls = module.LLMServerClient
        _patches.apply(cls, "generate", _wrap_generate(vars(cls)["generate"]))
        _patches.apply(cls, "_vllm_request_id", _wrap_request_id(vars(cls)["_vllm_request_id"]))
        _patches.apply(cls, "_release_server", _wrap_release(vars(cls)["_release_server"]))
        _state["client"] = True


def _install_agent_loop(module: ModuleType) -> None:
    with _lock:
        if _state["agent_loop"] or not _state["requested"]:
            return
        if not contract.check(contract.AGENT_LOOP, module):
            return
        cls = module.AgentLoopWorker
        _patches.apply(cls, "_run_agent_loop", _wrap_run_agent_loop(vars(cls)["_run_agent_loop"]))
        _state["agent_loop"] = True


def install() -> bool:
    """Ask for the client hooks (now, or when VERL's modules load). Never raises."""
    with _lock:
        if _state["requested"]:
            return True
        _state["requested"] = True
    when_imported(CLIENT_MODULE, _install_client)
    when_imported(AGENT_LOOP_MODULE, _install_agent_loop)
    return True


def uninstall() -> None:
    with _lock:
        _patches.revert_all()
        _state.update(requested=False, client=False, agent_loop=False)
