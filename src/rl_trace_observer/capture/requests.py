"""Rollout requests, weight sync and staleness: the one capture API every framework hook calls.

Framework-free (stdlib only) so VERL's hooks, the demo and any other engine adapter (TokenSpeed,
a custom server) write the same events. Everything is a no-op returning ``None`` when capture is
off or ``RL_TRACE_REQUESTS=0``, and nothing here raises into the caller.

**Requests.** A generation request is two spans joined by its request id (never by timestamps):

- client (``rollout_request``, in the process that sends it, e.g. VERL's agent-loop worker):
  ``req = begin_client(rid, session=..., sample=..., turn=..., prompt_tokens=...)`` then
  ``end_client(req, response_tokens=..., replica=..., version=..., status=...)``;
- server (``engine_request``, in the replica's process, from arrival in its generate method to
  return): ``begin_server(rid, replica=r)`` / ``end_server(req, phases=EnginePhases(...))``, where
  the engine's own per-request times go into the span's args (``engine_ns``); the merger draws them
  as ``queue`` / ``prefill`` / ``decode`` sub-spans (no extra event on the server's hot path).

Both carry ``bind_id = "rl-trace:request/<rid>"``: a *run-scoped* flow id that the merger gives the
same number in every process (docs/FORMATS.md §1), so Perfetto draws one arrow per request from the
client to the server span. Requests overlap, so each span sits on a **slot lane**: the lowest slot
free when it began (``requests 3``, ``replica_0 requests 3``); a slot is held until its request
ends, so one lane never holds two overlapping requests and slices nest exactly. Cost: one slot
take/give under a lock, two clock reads, one event dict and one encode per span (~3 µs;
``benchmarks/request_overhead.py``). Memory: the caller holds the in-flight ``Request`` objects; this
module keeps only free-slot heaps (bounded by the peak concurrency) — no per-request table, so
thousands of requests in flight cost nothing here. A request never ended leaks its slot only: past
``MAX_SLOTS`` slots a process's further requests share one overflow lane, where the merger drops
(and counts) slices that would overlap.

**Weight sync.** ``with weight_sync("update_weights", replica=r, version=v) as ph: ...`` nests
phases (``pause``, ``gather``, ``transfer``, ``load``, ``cache_reset``, ``resume``, ...) on the lane
``weight_sync`` (``replica_<r> weight_sync``); ``ph.args["bytes"] = n`` adds what was moved.

**Staleness** (:mod:`.staleness`): ``record_consumption(step, trainer_version, samples)`` writes,
where the trainer takes a batch, one ``consume_samples`` span with the lag distribution and one
``sample_staleness`` instant per sample (lag in steps = the trainer's policy version − the oldest
version that produced any of the sample's tokens).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import Any

from ..common.encoding import dumps_line as _dumps_line
from ..common.encoding import dumps_line_str_keys as _dumps_str_keys
from . import recorder as _recorder_mod
from .engine_times import (
    EnginePhases,
    engine_ns_from_vllm,
    engine_offset_ns,
    phase_spans,
    phases_from_sglang,
    phases_from_vllm,
    preemptions_from_vllm,
)
from .recorder import Recorder, get_recorder

__all__ = [
    "CLIENT_SPAN",
    "FLOW_PREFIX",
    "MAX_SLOTS",
    "PHASE_CAT",
    "REQUEST_CAT",
    "RUN_SCOPE_PREFIX",
    "SERVER_SPAN",
    "STALENESS_CAT",
    "SYNC_CAT",
    "EnginePhases",
    "Request",
    "WeightSyncPhase",
    "begin_client",
    "begin_server",
    "enabled",
    "end_client",
    "end_server",
    "engine_ns_from_vllm",
    "engine_offset_ns",
    "mark_version",
    "phase_spans",
    "phases_from_sglang",
    "phases_from_vllm",
    "preemptions_from_vllm",
    "weight_sync",
]

CLIENT_SPAN = "rollout_request"
SERVER_SPAN = "engine_request"
REQUEST_CAT = "rl_trace.request"
PHASE_CAT = "rl_trace.request_phase"
SYNC_CAT = "rl_trace.weight_sync"
STALENESS_CAT = "rl_trace.staleness"
RUN_SCOPE_PREFIX = "rl-trace:"  # bind ids with this prefix are one flow id across the whole run
FLOW_PREFIX = RUN_SCOPE_PREFIX + "request/"
VERSION_EVENT = "weight_version"
MAX_SLOTS = 16384  # per side and process: lanes beyond are one overflow lane

_time_ns = time.time_ns
_heappop = heapq.heappop
_heappush = heapq.heappush


# ------------------------------------------------------------------------------------ switches
def enabled() -> bool:
    """True when this process captures and ``RL_TRACE_REQUESTS`` is on."""
    return _active() is not None


def _active() -> Recorder | None:
    rec = get_recorder()
    if rec is None or not rec.config.requests:
        return None
    return rec


def _problem(rec: Recorder | None, what: str, exc: BaseException) -> None:
    if rec is not None:
        rec.warn_once(f"requests:{what}", f"request capture: {what} failed ({exc}); training continues")


# --------------------------------------------------------------------------------------- slots
class _Slots:
    """The lanes of one side (client, or one replica's server) of one process: lowest free first.

    Lock-free on purpose (a lock costs as much as the rest of a take): ``heappop``/``heappush`` on
    the free list and ``next`` on the counter are single C calls, atomic under the GIL.
    """

    __slots__ = ("counter", "free", "lock", "prefix", "rec", "tids")

    def __init__(self, rec: Recorder, prefix: str) -> None:
        self.rec = rec
        self.prefix = prefix
        self.free: list[int] = []
        self.counter = itertools.count()
        self.tids: list[int] = []
        self.lock = threading.Lock()  # only for naming new lanes

    def take(self) -> int:
        try:
            return heapq.heappop(self.free)
        except IndexError:
            slot = next(self.counter)
            return slot if slot < MAX_SLOTS else MAX_SLOTS  # the overflow lane: never given back

    def give(self, slot: int) -> None:
        if slot < MAX_SLOTS:
            heapq.heappush(self.free, slot)

    def tid(self, slot: int) -> int:
        tids = self.tids
        if slot < len(tids):
            return tids[slot]
        with self.lock:
            while len(tids) <= slot:
                n = len(tids)
                label = "overflow" if n >= MAX_SLOTS else str(n)
                tids.append(self.rec.lane_tid(f"{self.prefix}{label}", persist=False))
            return tids[slot]


_pools: dict[Any, _Slots] = {}  # one per side: the client, and each replica this process serves
_pools_lock = threading.Lock()


def _pool(rec: Recorder, replica: Any) -> _Slots:
    """Client slots (``replica`` is the marker ``_CLIENT``) or one replica's server slots."""
    pool = _pools.get(replica)
    if pool is not None and pool.rec is rec:
        return pool
    with _pools_lock:
        pool = _pools.get(replica)
        if pool is None or pool.rec is not rec:  # a new recorder (fork, reset): fresh lanes
            if replica is _CLIENT:
                prefix = "requests "
            elif replica is None:
                prefix = "engine requests "
            else:
                prefix = f"replica_{replica} requests "
            pool = _pools[replica] = _Slots(rec, prefix)
    return pool


_CLIENT = object()


# ------------------------------------------------------------------------------------ requests
class Request:
    """One request in flight, held by the caller between begin and end."""

    __slots__ = ("args", "id", "pool", "slot", "start_ns")

    def __init__(self, rid: str, start_ns: int, pool: _Slots, slot: int, args: dict[str, Any]) -> None:
        self.id = rid
        self.start_ns = start_ns
        self.pool = pool
        self.slot = slot
        self.args = args


def _begin(rid: Any, replica: Any, fields: dict[str, Any]) -> Request | None:
    """The request's slot and start; ``fields`` become its args. Hooks that build ``fields`` in
    :func:`begin_server`'s order (``replica`` last) may call this directly: one frame, not three."""
    rec = _recorder_mod._RECORDER  # get_recorder's own fast path, without its call
    if rec is None:
        rec = get_recorder()  # the first use in this process (or capture is off)
        if rec is None:
            return None
    pool = _pools.get(replica)
    if pool is None or pool.rec is not rec:  # else this recorder made it: its requests switch is on
        if not rec.config.requests:
            return None
        pool = None
    try:
        rid = str(rid)
        if pool is None:
            pool = _pool(rec, replica)
        fields["request_id"] = rid
        free = pool.free
        slot = _heappop(free) if free else pool.take()  # inline: the common case is a free slot
        return Request(rid, _time_ns(), pool, slot, fields)
    except Exception as exc:
        _problem(rec, "begin", exc)
        return None


def begin_client(request_id: Any, args: dict[str, Any] | None = None, **fields: Any) -> Request | None:
    """A request leaves for a server now. ``fields`` (or a dict ``args``, taken over as is: hooks
    that build one save a copy) become span args (``session``, ``sample``, ``turn``,
    ``prompt_tokens``, ``server``, ...); ``None`` when request capture is off."""
    if args is not None:
        args.update(fields)
        fields = args
    return _begin(request_id, _CLIENT, fields)


def begin_server(
    request_id: Any, args: dict[str, Any] | None = None, *, replica: Any = None, **fields: Any
) -> Request | None:
    """A request arrived in a server's generate method now (``replica``: its rank, for the lane)."""
    if args is not None:
        if fields:
            args.update(fields)
        fields = args
    if replica is not None:
        fields["replica"] = replica
    return _begin(request_id, replica, fields)


def _write_span(req: Request, name: str, flow: str) -> None:
    """The span, ending now, from ``req.args`` (the end fields already in), written straight to the
    event log; then the slot goes back. Never raises. This runs once per request per side: hooks that
    put their end fields into ``req.args`` themselves (``None`` values left out, as
    :func:`end_server`/:func:`end_client` do) call it directly (``SERVER_SPAN``, ``"flow_in"``)."""
    end_ns = _time_ns()
    pool = req.pool
    rec = pool.rec
    try:
        slot = req.slot
        tids = pool.tids
        tid = tids[slot] if slot < len(tids) else pool.tid(slot)
        start = req.start_ns
        dur = end_ns - start
        event = {
            "ph": "X",
            "cat": REQUEST_CAT,
            "name": name,
            "pid": rec.pid,
            "tid": tid,
            "ts": start / 1000,
            "dur": (dur if dur > 0 else 0) / 1000,
            "ts_ns": start,
            "dur_ns": dur,
            "bind_id": FLOW_PREFIX + req.id,
            flow: True,
            "args": req.args,
        }
        try:
            line = _dumps_str_keys(event)
        except TypeError:  # a non-str key in the caller's args: the general encoder
            try:
                line = _dumps_line(event)
            except Exception:
                rec.write_event(event)
                return
        except Exception:  # an argument the encoder refuses: the recorder's own fallback keeps the span
            rec.write_event(event)
            return
        rec.events.write_line(line)
    except Exception as exc:
        _problem(rec, "end", exc)
    finally:
        slot = req.slot
        if slot < MAX_SLOTS:  # _Slots.give, inline
            _heappush(pool.free, slot)


def _end_fields(
    req: Request, args: dict[str, Any] | None, fields: dict[str, Any], phases: EnginePhases | None = None
) -> bool:
    """The end fields (a dict ``args`` and/or keywords) without their ``None`` values into the
    span's args, then ``engine_ns``; False (reported, slot given back, no span) if that failed."""
    try:
        if args is not None:
            if fields:
                args.update(fields)
            fields = args
        span = req.args
        for key, value in fields.items():
            if value is not None:
                span[key] = value
        if phases is not None:  # four edges unless the engine told its arrival too
            span["engine_ns"] = list(phases) if phases.arrival_ns is not None else list(phases[:4])
        return True
    except Exception as exc:
        _problem(req.pool.rec, "end", exc)
        slot = req.slot
        if slot < MAX_SLOTS:
            _heappush(req.pool.free, slot)
        return False


def end_client(req: Request | None, args: dict[str, Any] | None = None, **fields: Any) -> None:
    """The answer arrived (``response_tokens``, ``replica``, ``version``, ``status``, ...; or a dict
    ``args``); ``None`` values are left out."""
    if req is not None and _end_fields(req, args, fields):
        _write_span(req, CLIENT_SPAN, "flow_out")


def end_server(
    req: Request | None,
    args: dict[str, Any] | None = None,
    *,
    phases: EnginePhases | None = None,
    **fields: Any,
) -> None:
    """The server returns now. ``phases`` (if the engine reported them) go into the span's args as
    ``engine_ns`` = [queued, scheduled, first token, last token]: the merger draws them as nested
    ``queue``/``prefill``/``decode`` sub-spans and the report reads them, both clipping with
    :func:`phase_spans` (no event and no arithmetic here)."""
    if req is not None and _end_fields(req, args, fields, phases):
        _write_span(req, SERVER_SPAN, "flow_in")


# --------------------------------------------------------------------------------- weight sync
def _sync_lane(replica: Any) -> str:
    return "weight_sync" if replica is None else f"replica_{replica} weight_sync"


class WeightSyncPhase:
    """One weight-sync phase; a context manager. Add what you learn inside to ``args``."""

    __slots__ = ("args", "lane", "name", "rec", "start_ns")

    def __init__(self, rec: Recorder | None, name: str, lane: str, args: dict[str, Any]) -> None:
        self.rec, self.name, self.lane, self.args = rec, name, lane, args
        self.start_ns = 0

    def __enter__(self) -> WeightSyncPhase:
        self.start_ns = _time_ns()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        rec = self.rec
        if rec is None:
            return
        if exc_type is not None:
            self.args["error"] = exc_type.__name__
        try:
            rec.span(
                self.name,
                self.start_ns,
                _time_ns(),
                lane=self.lane,
                cat=SYNC_CAT,
                args={k: v for k, v in self.args.items() if v is not None},
            )
        except Exception as exc2:
            _problem(rec, "weight sync", exc2)


def weight_sync(name: str, *, replica: Any = None, **fields: Any) -> WeightSyncPhase:
    """A phase of a weight sync on the trainer (``replica=None``) or on replica ``replica``."""
    if replica is not None:
        fields["replica"] = replica
    return WeightSyncPhase(_active(), name, _sync_lane(replica), fields)


def mark_version(version: Any, *, replica: Any = None, **fields: Any) -> None:
    """The policy version a replica serves from now on (an instant on its weight-sync lane)."""
    rec = _active()
    if rec is None:
        return
    try:
        now = _time_ns()
        args = {"version": version, **({"replica": replica} if replica is not None else {}), **fields}
        rec.write_event(_instant(rec, VERSION_EVENT, SYNC_CAT, rec.lane_tid(_sync_lane(replica)), now, args))
    except Exception as exc:
        _problem(rec, "version", exc)


def _instant(
    rec: Recorder, name: str, cat: str, tid: int, ts_ns: int, args: dict[str, Any]
) -> dict[str, Any]:
    return {
        "ph": "i",
        "s": "t",
        "cat": cat,
        "name": name,
        "pid": rec.pid,
        "tid": tid,
        "ts": ts_ns / 1000,
        "ts_ns": ts_ns,
        "args": args,
    }
