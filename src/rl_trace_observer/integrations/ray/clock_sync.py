"""Measure every traced host's wall-clock offset against one reference clock, over Ray.

The process that calls ``on_step_boundary`` (VERL's trainer loop) is the reference. It runs a few
NTP-style rounds with every target (``capture.clock_sync`` turns them into an offset and a bound)
and sends each result to the target, which stores it with ``Recorder.add_clock_offset`` in its own
process record. Why the target keeps it rather than the reference: a process record then describes
its own clock completely, the collector gathers it with that host's other artifacts, and the merger
needs no record from the reference process to correct a host. The reference writes one
``method: "reference"`` entry into its own record so the merger knows which host is offset 0.
Targets are the per-node responder actors and any per-process responders (``clock_responder``).

Cost control: ``on_step_boundary`` reads the clocks on the caller's thread (microseconds) and
hands everything else to a daemon thread, so training waits neither for a record write nor for the
network. There the exchanges run one target at a time (replies do not queue behind each other, so
round trips and bounds are tighter); a synchronous ``measure`` pings all targets at once instead.
Either ends within its time budget whatever happens (a busy or dead target is skipped this time),
and everything is skipped quietly when Ray is absent or not initialised, or when capture is off.

API: ``on_step_boundary(step, phase)``, ``flush()`` before ``ray.shutdown()``, ``clock_sync()`` (the
process's ``ClockSync``: ``add_target``, ``measure``, ``measure_soon``, ``last_result``),
``measure_offsets(targets, ...)``; responders are re-exported from ``clock_responder``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...capture import get_recorder
from ...capture.clock import SYSTEM_CLOCK, Clock, snapshot
from ...capture.clock_sync import Exchange, estimate_offset
from ...capture.identity import hostname
from ...capture.recorder import Recorder
from .clock_responder import (
    NAMESPACE,
    PING,
    RECORD,
    ClockResponderMixin,
    NodeClockResponder,
    ensure_node_responders,
    reply,
    start_responder,
    store,
)

__all__ = [
    "NAMESPACE",
    "ClockResponderMixin",
    "ClockSync",
    "MeasureResult",
    "NodeClockResponder",
    "clock_sync",
    "ensure_node_responders",
    "flush",
    "measure_offsets",
    "on_step_boundary",
    "reply",
    "reset",
    "start_responder",
    "store",
]

METHOD = "ray_ntp"
DEFAULT_ROUNDS = 4
DEFAULT_BUDGET_MS = 3.0  # a synchronous measurement; on_step_boundary runs them in the background
DEFAULT_BACKGROUND_ROUNDS = 8
DEFAULT_BACKGROUND_BUDGET_MS = 250.0  # background rounds run one target at a time (tighter bounds)
SEQUENTIAL_TIMEOUT_MS = 50.0
NODE_RESCAN_S = 60.0  # new nodes (autoscaling) get a responder within a minute


# ---------------------------------------------------------------- measurement
@dataclass
class MeasureResult:
    """What one ``measure_offsets`` call found: one entry per answering target, and the rest."""

    measurements: list[dict[str, Any]] = field(default_factory=list)
    unanswered: int = 0
    took_ns: int = 0


def _one_round(
    ray: Any, targets: Sequence[Any], clock: Clock, deadline: int
) -> dict[int, tuple[Exchange, Any]]:
    """Ping every target at once; ``t3`` is read after the wait that saw the reply (never before)."""
    pending: dict[Any, tuple[int, int]] = {}
    for i, target in enumerate(targets):
        t0 = clock.wall_ns()
        pending[getattr(target, PING).remote()] = (i, t0)
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
    time (tighter round trips: replies do not queue behind each other); a target silent for
    ``SEQUENTIAL_TIMEOUT_MS`` is dropped for the rest of the measurement."""
    samples: dict[int, list[tuple[Exchange, Any]]] = {}
    silent: set[int] = set()
    for _ in range(max(rounds, 1)):
        if concurrent:
            for i, pair in _one_round(ray, targets, clock, deadline).items():
                samples.setdefault(i, []).append(pair)
        else:
            for i, target in enumerate(targets):
                if i in silent or time.perf_counter_ns() >= deadline:
                    continue
                until = min(deadline, time.perf_counter_ns() + int(SEQUENTIAL_TIMEOUT_MS * 1e6))
                got = _one_round(ray, [target], clock, until)
                if got:
                    samples.setdefault(i, []).append(got[0])
                else:
                    silent.add(i)
        if time.perf_counter_ns() >= deadline:
            break
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
        if record:
            getattr(targets[i], RECORD).remote(m)  # fire and forget: the target's disk, not ours
    return result


# ---------------------------------------------------------------------- hook
class ClockSync:
    """The reference side's state: its clock and record, the targets, and a background worker.

    ``measure`` runs one concurrent measurement now, within ``budget_ms``. ``measure_soon`` hands
    it to a daemon thread instead (``background_rounds`` sequential rounds within the larger
    ``background_budget_ms``: tighter bounds) so the training thread only pays for a hand-off.
    """

    def __init__(
        self,
        recorder: Recorder,
        *,
        node_responders: bool = True,
        rounds: int = DEFAULT_ROUNDS,
        budget_ms: float = DEFAULT_BUDGET_MS,
        background_rounds: int = DEFAULT_BACKGROUND_ROUNDS,
        background_budget_ms: float = DEFAULT_BACKGROUND_BUDGET_MS,
    ) -> None:
        self.recorder = recorder
        self.node_responders = node_responders
        self.rounds, self.budget_ms = rounds, budget_ms
        self.background_rounds, self.background_budget_ms = background_rounds, background_budget_ms
        self.targets: list[tuple[Any, str]] = []
        self.last_result: MeasureResult | None = None
        self.skipped = 0
        self._nodes: list[Any] = []
        self._nodes_scanned_ns = 0
        self._marked = False
        self._cv = threading.Condition()
        self._pending: tuple[int | None, str | None] | None = None
        self._snaps: list[dict[str, Any]] = []
        self._closed = False
        self._busy = False
        self._thread: threading.Thread | None = None

    def add_target(self, handle: Any, responder: str = "process") -> None:
        """Also measure this actor (it must offer ``rl_trace_clock_ping``/``_record``)."""
        self.targets.append((handle, responder))

    def _node_targets(self) -> list[Any]:
        now = time.monotonic_ns()
        if self.node_responders and now - self._nodes_scanned_ns > NODE_RESCAN_S * 1e9:
            self._nodes_scanned_ns = now
            cfg = self.recorder.config
            self._nodes = ensure_node_responders(str(cfg.output_dir), self.recorder.record().get("run_id"))
        return self._nodes

    def _mark_reference(self) -> None:
        if not self._marked:
            self._marked = True
            rec = self.recorder
            rec.add_clock_offset(
                {
                    "reference": f"{rec.host}:{rec.pid}",
                    "reference_host": rec.host,
                    "reference_pid": rec.pid,
                    "method": "reference",
                    "offset_ns": 0,
                    "uncertainty_ns": 0,
                    "wall_ns": rec.clock.wall_ns(),
                    "mono_ns": rec.clock.mono_ns(),
                }
            )

    def measure(
        self,
        step: int | None = None,
        phase: str | None = None,
        *,
        rounds: int | None = None,
        budget_ms: float | None = None,
        concurrent: bool = True,
    ) -> MeasureResult:
        """One measurement of every target, within one time budget."""
        nodes = self._node_targets()
        handles = [*nodes, *(h for h, _ in self.targets)]
        kinds = ["node"] * len(nodes) + [k for _, k in self.targets]
        self._mark_reference()
        if not handles:
            return MeasureResult()
        rec = self.recorder
        result = measure_offsets(
            handles,
            clock=rec.clock,
            reference=(rec.host, rec.pid),
            rounds=self.rounds if rounds is None else rounds,
            budget_ms=self.budget_ms if budget_ms is None else budget_ms,
            concurrent=concurrent,
            step=step,
            phase=phase,
            responders=kinds,
        )
        self.last_result = result
        return result

    # ------------------------------------------------------------- background
    def measure_soon(
        self, step: int | None = None, phase: str | None = None, snap: dict[str, Any] | None = None
    ) -> bool:
        """Queue a measurement (and a clock snapshot already read) for the background thread.

        Never waits. Snapshots are all kept, in order; of measurements one waits at most: a newer
        boundary replaces a queued one that has not started (counted in ``skipped``; returns
        False), so a step's ``end`` is still measured right after a slow ``begin`` measurement.
        """
        with self._cv:
            if snap is not None:
                self._snaps.append(snap)
            replaced = self._pending is not None
            self.skipped += replaced
            self._pending = (step, phase)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._worker, name="rl-trace-clock-sync", daemon=True)
                self._thread.start()
            self._cv.notify_all()
        return not replaced

    def _worker(self) -> None:
        while True:
            with self._cv:
                while self._pending is None and not self._snaps and not self._closed:
                    self._cv.wait()
                if self._closed and self._pending is None and not self._snaps:
                    return
                request, snaps = self._pending, self._snaps
                self._pending, self._snaps, self._busy = None, [], True
            try:
                for snap in snaps:  # readings from the training thread, stored (a record write) here
                    self.recorder.clock_snapshot(**snap)
                if request is not None:
                    self.measure(
                        *request,
                        rounds=self.background_rounds,
                        budget_ms=self.background_budget_ms,
                        concurrent=False,
                    )
            except Exception as exc:
                self.recorder.warn_once("clock_sync", f"clock offset measurement skipped: {exc}")
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def close(self, timeout_s: float = 5.0) -> None:
        """Finish queued work, then stop the background thread."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        """Block until nothing is queued or running on the background thread (tests, shutdown)."""
        with self._cv:
            return self._cv.wait_for(
                lambda: not self._busy and self._pending is None and not self._snaps, timeout_s
            )


_SYNC: ClockSync | None = None


def _ray_ready() -> bool:
    ray = sys.modules.get("ray")  # never import Ray here: a process without it has nothing to sync
    try:
        return ray is not None and bool(ray.is_initialized())
    except Exception:
        return False


def clock_sync() -> ClockSync | None:
    """This process's reference-side state, created on first use; ``None`` without Ray or capture."""
    global _SYNC
    rec = get_recorder()
    if rec is None or not _ray_ready():
        return None
    if _SYNC is None or _SYNC.recorder is not rec:
        _SYNC = ClockSync(rec)
    return _SYNC


def on_step_boundary(step: int | None, phase: str, *, wait: bool = False) -> MeasureResult | None:
    """At a profiled step's ``"begin"`` or ``"end"``: snapshot this process's clocks, measure offsets.

    By default the caller only reads the clocks (microseconds) and hands the rest to a background
    thread: storing the snapshot (a record rewrite) and the measurement; ``None`` is returned.
    ``wait=True`` does both now, the measurement within the short synchronous budget, and returns
    its result. Never raises; without capture nothing happens, without an initialised Ray only
    the snapshot is stored.
    """
    rec = get_recorder()
    if rec is None:
        return None
    try:
        sync = clock_sync()
        reason = f"step_{phase}"
        if sync is None or wait:
            rec.clock_snapshot(reason, step=step)
            return sync.measure(step=step, phase=phase) if sync is not None else None
        read = snapshot(rec.clock, reason, step=step)
        sync.measure_soon(step=step, phase=phase, snap=read)
    except Exception as exc:
        rec.warn_once("clock_sync", f"clock offset measurement skipped: {exc}")
    return None


def flush(timeout_s: float = 5.0) -> bool:
    """Wait for a queued or running background measurement (call before ``ray.shutdown()``)."""
    sync = _SYNC
    return True if sync is None else sync.wait_idle(timeout_s)


def reset() -> None:
    """Stop the background thread and forget the reference-side state (tests)."""
    global _SYNC
    if _SYNC is not None:
        _SYNC.close()
    _SYNC = None
