"""One clock-offset measurement over Ray: NTP-style exchanges with many targets, within a time budget.

The reference side of :mod:`.clock_sync`, kept apart from its scheduling (background thread, step
hooks). ``measure_offsets`` pings the targets, turns the exchanges into offsets with the pure
estimator (``common.clock_offsets``), and sends each target its result to keep in its own record.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...capture.clock import SYSTEM_CLOCK, Clock
from ...capture.identity import hostname
from ...common.clock_offsets import Exchange, estimate_offset
from .clock_responder import PING, RECORD

METHOD = "ray_ntp"
DEFAULT_ROUNDS = 4
DEFAULT_BUDGET_MS = 3.0  # a synchronous measurement; on_step_boundary runs them in the background
SEQUENTIAL_TIMEOUT_MS = 50.0


# ---------------------------------------------------------------- measurement
@dataclass
class MeasureResult:
    """What one ``measure_offsets`` call found: one entry per answering target, and the rest."""

    measurements: list[dict[str, Any]] = field(default_factory=list)
    unanswered: int = 0
    took_ns: int = 0
    stored: list[Any] = field(default_factory=list, repr=False)  # refs of the targets' record calls


def _send(ray: Any, targets: Sequence[tuple[int, Any]], clock: Clock) -> dict[Any, tuple[int, int]]:
    """Ping each ``(index, target)``; the pending calls, each with its index and ``t0``."""
    pending: dict[Any, tuple[int, int]] = {}
    for i, target in targets:
        t0 = clock.wall_ns()
        pending[getattr(target, PING).remote()] = (i, t0)
    return pending


def _gather(
    ray: Any, pending: dict[Any, tuple[int, int]], clock: Clock, deadline: int
) -> dict[int, tuple[Exchange, Any]]:
    """The replies that arrive before ``deadline`` (taken out of ``pending``); ``t3`` is read after
    the wait that saw the reply (never before), so a late look only widens the interval."""
    got: dict[int, tuple[Exchange, Any]] = {}
    while pending:
        remaining = (deadline - time.perf_counter_ns()) / 1e9
        if remaining <= 0:
            break
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=remaining)
        t3 = clock.wall_ns()
        if not ready:
            break
        rest = [r for r in pending if r not in ready]
        more = ray.wait(rest, num_returns=len(rest), timeout=0)[0] if rest else []
        t3_more = clock.wall_ns()
        for refs, t_recv in ((ready, t3), (more, t3_more)):
            for ref in refs:
                i, t0 = pending.pop(ref)
                try:
                    rep = ray.get(ref, timeout=0)
                except Exception:  # the target failed to answer: no sample this round
                    continue
                got[i] = (Exchange(t0, int(rep[0]), int(rep[1]), t_recv), rep)
    return got


def _rounds(
    ray: Any, targets: Sequence[Any], clock: Clock, rounds: int, deadline: int, concurrent: bool
) -> dict[int, list[tuple[Exchange, Any]]]:
    """Concurrent: each round pings all targets at once (fastest). Sequential: one exchange at a
    time (tighter round trips: replies do not queue behind each other). There a target silent for
    ``SEQUENTIAL_TIMEOUT_MS`` is asked no more, so a dead one costs that once; but its reply still
    counts when it arrives before the deadline: on a loaded host a round trip takes tens of ms, and
    a wide bound is worth more than no measurement."""
    samples: dict[int, list[tuple[Exchange, Any]]] = {}
    silent: set[int] = set()
    late: dict[Any, tuple[int, int]] = {}  # the pings of silent targets, still awaited
    for _ in range(max(rounds, 1)):
        if concurrent:
            got = _gather(ray, _send(ray, list(enumerate(targets)), clock), clock, deadline)
            for i, pair in got.items():
                samples.setdefault(i, []).append(pair)
        else:
            for i, target in enumerate(targets):
                now = time.perf_counter_ns()
                if i in silent or now >= deadline:
                    continue
                until = min(deadline, now + int(SEQUENTIAL_TIMEOUT_MS * 1e6))
                pending = _send(ray, [(i, target)], clock)
                got = _gather(ray, pending, clock, until)
                if i in got:
                    samples.setdefault(i, []).append(got[i])
                else:
                    silent.add(i)
                    late.update(pending)
        if time.perf_counter_ns() >= deadline:
            break
    for i, pair in _gather(ray, late, clock, deadline).items():
        samples.setdefault(i, []).append(pair)
    return samples


def measure_offsets(
    targets: Sequence[Any],
    *,
    clock: Clock = SYSTEM_CLOCK,
    reference: tuple[str, int] | None = None,
    rounds: int = DEFAULT_ROUNDS,
    budget_ms: float = DEFAULT_BUDGET_MS,
    concurrent: bool = True,
    step: int | None = None,
    phase: str | None = None,
    responders: Sequence[str] | None = None,
    record: bool = True,
) -> MeasureResult:
    """Measure each target's offset against ``clock`` and (``record``) send it to the target to keep.

    Returns within about ``budget_ms`` plus one Ray call; targets that did not answer in time are
    counted in ``unanswered``. ``concurrent=False`` trades time for accuracy (see ``_rounds``).
    Needs an initialised Ray (``RuntimeError`` otherwise: the quiet skipping is
    ``on_step_boundary``'s job).
    """
    import ray

    if not ray.is_initialized():
        raise RuntimeError("measure_offsets needs ray.init() first")
    start = time.perf_counter_ns()
    samples = _rounds(ray, targets, clock, rounds, start + int(budget_ms * 1e6), concurrent)
    took = time.perf_counter_ns() - start
    ref_host, ref_pid = reference if reference is not None else (hostname(), os.getpid())
    result = MeasureResult(unanswered=len(targets) - len(samples), took_ns=took)
    for i, pairs in sorted(samples.items()):
        est = estimate_offset(ex for ex, _ in pairs)
        if est is None:
            result.unanswered += 1
            continue
        best = min(pairs, key=lambda p: p[0].round_trip_ns if p[0].usable() else 1 << 62)
        m = {
            "reference": f"{ref_host}:{ref_pid}",
            "reference_host": ref_host,
            "reference_pid": ref_pid,
            "method": METHOD,
            "responder": responders[i] if responders is not None else "node",
            **est.as_record(),
            "mono_ns": int(best[1][2]),
            "host": best[1][3],
            "pid": best[1][4],
            "took_ns": took,
            "step": step,
            "phase": phase,
        }
        result.measurements.append(m)
        if record:  # fire and forget (the target's disk, not ours); ``flush`` waits for them
            result.stored.append(getattr(targets[i], RECORD).remote(m))
    return result
