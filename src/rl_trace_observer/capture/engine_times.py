"""An engine's own per-request times (vLLM's ``RequestStateStats``, SGLang's ``meta_info``) as wall
ns: what the server span carries as ``engine_ns`` and the merger draws as queue / prefill / decode.

Apart from :mod:`.requests` (which re-exports every public name here) so that the request API stays
one small module; stdlib only, runs once per request on the server side, never raises.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from .clock import wall_minus_mono_ns as wall_minus_mono

_MAX_S = 1e12  # a monotonic or epoch time in seconds beyond this (or NaN) is garbage, not a time


class EnginePhases(NamedTuple):
    """An engine's own per-request times, wall-clock epoch ns (``None``: not reported)."""

    queued_ns: int | None = None
    scheduled_ns: int | None = None
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    # vLLM: the request's arrival in the engine's front end (``RequestStateStats.arrival_time``, where
    # vLLM's e2e latency starts); before ``queued_ns`` by the hand-over to the engine core, which
    # waits while the core is busy in a step. Last, so four-edge phases keep their meaning.
    arrival_ns: int | None = None


def phase_spans(ph: EnginePhases, start: int, end: int) -> list[tuple[str, int, int]]:
    """queue / prefill / decode, clipped into the server span [start, end] and kept in order, so
    they nest in it (the merger draws them from a span's ``engine_ns`` with this same rule)."""
    edges = (
        ("engine_input", ph.arrival_ns, ph.queued_ns),
        ("queue", ph.queued_ns, ph.scheduled_ns),
        ("prefill", ph.scheduled_ns, ph.first_token_ns),
        ("decode", ph.first_token_ns, ph.last_token_ns),
    )
    out = []
    floor = start
    for name, lo, hi in edges:
        if lo is None or hi is None:
            continue
        lo, hi = max(lo, floor, start), min(hi, end)
        if hi < lo:
            continue
        out.append((name, lo, hi))
        floor = hi
    return out


OFFSET_TTL_NS = 100_000_000  # how long one wall − monotonic reading serves (slewing: ≤ 50 µs in it)
_offset: tuple[int, int] = (0, -(1 << 62))  # (wall − mono ns, the monotonic ns it was read at)
_mono_ns = time.monotonic_ns


def engine_offset_ns() -> int:
    """``time.time_ns() - time.monotonic_ns()``, read (tightest of three brackets) at most every
    ``OFFSET_TTL_NS``: nine clock reads per request cost more than the rest of the phases. A step of
    the wall clock shows in the phases within 0.1 s; slewing moves the offset by ≤ 500 ppm."""
    global _offset
    now = _mono_ns()
    value, read_at = _offset
    if now - read_at > OFFSET_TTL_NS:
        value = wall_minus_mono()
        _offset = (value, now)  # one tuple: a thread never sees one part new, the other old
    return value


_new_phases = tuple.__new__  # EnginePhases(...) runs a Python __new__; this is the same tuple


def phases_from_vllm(metrics: Any, *, wall_minus_mono_ns: int | None = None) -> EnginePhases | None:
    """vLLM's ``RequestOutput.metrics`` (``RequestStateStats``): ``queued_ts``, ``scheduled_ts``,
    ``first_token_ts``, ``last_token_ts`` are the engine core's ``time.monotonic()`` seconds (0 when
    unset), converted to wall ns with this host's offset (engine core and server share a host);
    ``arrival_time`` is the front end's ``time.time()`` seconds, where vLLM's e2e latency starts."""
    if metrics is None:
        return None
    offset = engine_offset_ns() if wall_minus_mono_ns is None else wall_minus_mono_ns
    edges = _vllm_edges(metrics, offset)
    return None if edges is None else _new_phases(EnginePhases, edges)


def engine_ns_from_vllm(metrics: Any) -> list[int | None] | None:
    """What :func:`end_server` writes as ``engine_ns`` for ``phases_from_vllm(metrics)``, built
    without the ``EnginePhases`` in between (the server hook's path: once per request)."""
    if metrics is None:
        return None
    value, read_at = _offset  # engine_offset_ns's fast path, inline
    if _mono_ns() - read_at > OFFSET_TTL_NS:
        value = engine_offset_ns()
    edges = _vllm_edges(metrics, value)
    if edges is not None and edges[4] is None:
        del edges[4]  # four edges unless the engine told its arrival too
    return edges


def _vllm_edges(metrics: Any, offset: int) -> list[int | None] | None:
    """[queued, scheduled, first token, last token, arrival] in wall ns, or None if none is set.
    Written out per edge (no helper calls): it runs once per request on the server."""
    try:
        q = metrics.queued_ts
        s = metrics.scheduled_ts
        f = metrics.first_token_ts
        t = metrics.last_token_ts
        a = metrics.arrival_time
    except AttributeError:  # not all of vLLM's fields: each one that is there
        q = getattr(metrics, "queued_ts", None)
        s = getattr(metrics, "scheduled_ts", None)
        f = getattr(metrics, "first_token_ts", None)
        t = getattr(metrics, "last_token_ts", None)
        a = getattr(metrics, "arrival_time", None)
    if (
        type(q) is float
        and type(s) is float
        and type(f) is float
        and type(t) is float
        and type(a) is float
        and 0.0 < q < 1e12  # _MAX_S
        and 0.0 < s < 1e12
        and 0.0 < f < 1e12
        and 0.0 < t < 1e12
        and 1e9 < a < 1e10
    ):  # a finished request's usual stats: every edge set
        q = round(q * 1e9) + offset
        a = round(a * 1e9)
        # the front end stamps arrival before the core queues: a later arrival is the wall/monotonic
        # conversion's error (µs), not time spent; keep the edge, empty
        return [
            q,
            round(s * 1e9) + offset,
            round(f * 1e9) + offset,
            round(t * 1e9) + offset,
            a if a <= q else q,
        ]
    q = round(q * 1e9) + offset if (type(q) is float or type(q) is int) and 0 < q < _MAX_S else None
    s = round(s * 1e9) + offset if (type(s) is float or type(s) is int) and 0 < s < _MAX_S else None
    f = round(f * 1e9) + offset if (type(f) is float or type(f) is int) and 0 < f < _MAX_S else None
    t = round(t * 1e9) + offset if (type(t) is float or type(t) is int) and 0 < t < _MAX_S else None
    a = round(a * 1e9) if (type(a) is float or type(a) is int) and 1e9 < a < 1e10 else None
    if a is not None and q is not None and a > q:
        a = q  # as above
    if q is None and s is None and f is None and t is None and a is None:
        return None
    return [q, s, f, t, a]


def preemptions_from_vllm(metrics: Any) -> int:
    """How often vLLM's scheduler preempted this request (``RequestStateStats.num_preemptions``)."""
    n = getattr(metrics, "num_preemptions", 0)
    return n if type(n) is int and n > 0 else 0


def phases_from_sglang(meta_info: Any, start_ns: int) -> EnginePhases | None:
    """SGLang's ``meta_info["queue_time"]`` (seconds in the waiting queue), anchored at the request's
    arrival: a ``queue`` sub-span only (its meta info has no first-token time)."""
    if not isinstance(meta_info, dict):
        return None
    queue = meta_info.get("queue_time")
    if not isinstance(queue, int | float) or isinstance(queue, bool) or not 0 <= queue < 1e6:
        return None
    return EnginePhases(queued_ns=start_ns, scheduled_ns=start_ns + round(queue * 1e9))
