"""Measure every traced host's wall-clock offset against one reference clock, over Ray.

The process that calls ``on_step_boundary`` (VERL's trainer loop) is the reference. It runs a few
NTP-style rounds with every target (``common.clock_offsets`` turns them into an offset and a bound)
and sends each result to the target, which stores it with ``Recorder.add_clock_offset`` in its own
process record. Why the target keeps it rather than the reference: a process record then describes
its own clock completely, the collector gathers it with that host's other artifacts, and the merger
needs no record from the reference process to correct a host. The reference writes one
``method: "reference"`` entry into its own record so the merger knows which host is offset 0.
Targets are the per-node responder actors and any per-process responders (``clock_responder``).

When: at profiled step boundaries (``on_step_boundary``), and — so that a run's measurements
bracket all its spans, which are written at every step — once at capture start
(``on_capture_start``: in the background, after waiting for the responders to start), at unprofiled
step boundaries when the last measurement is ``PERIODIC_S`` old (``on_step``), and once at the end
of training (``on_training_end``: the one call that waits, at most ``END_TIMEOUT_S``, so the result
is stored before the process goes away; also tried at exit). Outside the measured range the merger
can only extrapolate, with a bound that grows with the distance (``merge.clock.hosts``).

Cost control: ``on_step_boundary`` reads the clocks on the caller's thread (microseconds) and
hands everything else to a daemon thread, so training waits neither for a record write nor for the
network. There the exchanges run one target at a time (replies do not queue behind each other, so
round trips and bounds are tighter); a synchronous ``measure`` pings all targets at once instead.
Either ends within its time budget whatever happens (a busy or dead target is skipped this time),
and everything is skipped quietly when Ray is absent or not initialised, or when capture is off.

API: ``prepare()`` once before the first profiled step (starts the node responders, which take
seconds), ``on_capture_start()``, ``on_step_boundary(step, phase)``, ``on_step(step)``,
``on_training_end()``, ``flush()`` before collecting or ``ray.shutdown()``, ``clock_sync()`` (the
process's ``ClockSync``: ``add_target``, ``measure``, ``measure_soon``, ``capture_start``,
``step_tick``, ``training_end``, ``last_result``),
``measure_offsets(targets, ...)``; responders are re-exported from ``clock_responder``.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
from typing import Any

from ...capture import get_recorder
from ...capture.clock import snapshot
from ...capture.recorder import Recorder
from .clock_measure import DEFAULT_BUDGET_MS, DEFAULT_ROUNDS, MeasureResult, measure_offsets
from .clock_responder import (
    FLUSH,
    NAMESPACE,
    PING,
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
    "on_capture_start",
    "on_step",
    "on_step_boundary",
    "on_training_end",
    "prepare",
    "reply",
    "reset",
    "start_responder",
    "store",
]

DEFAULT_BACKGROUND_ROUNDS = 8
DEFAULT_BACKGROUND_BUDGET_MS = 250.0  # background rounds run one target at a time (tighter bounds)
NODE_RESCAN_S = 60.0  # new nodes (autoscaling) get a responder within a minute
START_WAIT_S = 30.0  # the capture-start measurement waits (in the background) for responders to start
PERIODIC_S = 60.0  # unprofiled step boundaries measure when the last measurement is this old
END_TIMEOUT_S = 5.0  # the end-of-training measurement holds its caller at most this long
EXIT_TIMEOUT_S = 2.0  # the same, tried at interpreter exit when nobody called it
START, PERIODIC, TRAINING_END = "capture_start", "periodic", "training_end"  # measurement phases


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
        self._stored: list[Any] = []  # record calls sent to targets and not yet seen done
        self._requested_ns = -(1 << 62)  # monotonic time of the last measurement queued
        self.started = self.finished = False

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

    def prepare(self, timeout_s: float = 30.0) -> int:
        """Start the node responders now and wait (at most ``timeout_s``) until every target answers.

        Optional: without it the first boundary starts the responders and, since an actor takes
        seconds to start, measures only from the next one. Call it once before the first profiled
        step (the demo does). Returns how many targets answered.
        """
        import ray

        handles = [*self._node_targets(), *(h for h, _ in self.targets)]
        if not handles:
            return 0
        ready, _ = ray.wait(
            [getattr(h, PING).remote() for h in handles], num_returns=len(handles), timeout=timeout_s
        )
        return len(ready)

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
        with self._cv:
            self._stored += result.stored
            stored = self._stored
        if len(stored) > 256:  # a long run that never flushes: forget the calls already done
            import ray

            done = set(ray.wait(stored, num_returns=len(stored), timeout=0)[0])
            with self._cv:
                self._stored = [r for r in self._stored if r not in done]
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
            self._requested_ns = time.monotonic_ns()
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

    @property
    def used(self) -> bool:
        """Whether this process measured, or asked to, at all (else it has no run to bracket)."""
        return self.started or self._marked or self._pending is not None

    def capture_start(self) -> bool:
        """Once: queue a measurement that first waits (on the background thread, at most
        ``START_WAIT_S``) for the targets to answer — node responders take seconds to start.
        Never waits itself; False when already done."""
        if self.started:
            return False
        self.started = True
        return self.measure_soon(phase=START)

    def step_tick(self, step: int | None = None, interval_s: float = PERIODIC_S) -> bool:
        """At an unprofiled step boundary: queue a measurement when none was queued for
        ``interval_s`` (a monotonic clock read otherwise). Never waits."""
        if time.monotonic_ns() - self._requested_ns < interval_s * 1e9:
            return False
        return self.measure_soon(step=step, phase=PERIODIC)

    def training_end(self, timeout_s: float = END_TIMEOUT_S) -> bool:
        """Once: measure again and wait, at most ``timeout_s``, until every target stored it (the
        spans written since the last measurement are then inside the measured range). True when
        all was stored in time; nothing (False) in a process that never measured."""
        if self.finished or not self.used:
            return self.finished
        self.finished = True
        deadline = time.monotonic() + timeout_s
        self.measure_soon(phase=TRAINING_END)
        idle = self.wait_idle(timeout_s)
        return self.wait_stored(max(0.0, deadline - time.monotonic())) and idle

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
                    if request[1] == START:
                        self.prepare(START_WAIT_S)
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

    def wait_stored(self, timeout_s: float = 10.0) -> bool:
        """Block until every target has stored the results it was sent and its record is on disk
        (before collecting or shutting Ray down: a record call still queued when Ray stops is
        lost). Records are written by each process's drain; this asks the targets to wait for it."""
        with self._cv:
            refs, self._stored = self._stored, []
        if not refs:
            return True
        import ray

        deadline = time.monotonic() + timeout_s
        try:
            _, rest = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
            if rest:
                return False
            flushes = [
                getattr(h, FLUSH).remote(max(0.0, deadline - time.monotonic()))
                for h in {id(h): h for h in (*self._nodes, *(t for t, _ in self.targets))}.values()
                if hasattr(h, FLUSH)
            ]
            done, rest = ray.wait(
                flushes, num_returns=len(flushes), timeout=max(0.0, deadline - time.monotonic())
            )
            on_disk = all(ray.get(done)) and not rest
        except Exception:  # Ray already down: nothing more can be stored
            return False
        return self.recorder.flush(max(0.0, deadline - time.monotonic())) and on_disk


_SYNC: ClockSync | None = None
_AT_EXIT = False


def _ray_ready() -> bool:
    ray = sys.modules.get("ray")  # never import Ray here: a process without it has nothing to sync
    try:
        return ray is not None and bool(ray.is_initialized())
    except Exception:
        return False


def clock_sync() -> ClockSync | None:
    """This process's reference-side state, created on first use; ``None`` without Ray or capture."""
    global _SYNC, _AT_EXIT
    rec = get_recorder()
    if rec is None or not _ray_ready():
        return None
    if _SYNC is None or _SYNC.recorder is not rec:
        _SYNC = ClockSync(rec)
        if not _AT_EXIT:
            _AT_EXIT = True
            atexit.register(_at_exit)  # registered after ray.init's handler, so it runs first
    return _SYNC


def _at_exit() -> None:
    """The end-of-training measurement, when nobody asked for it (a loop without our VERL hooks)."""
    sync = _SYNC
    if sync is None or sync.finished or not sync.used or not _ray_ready():
        return
    try:
        sync.training_end(EXIT_TIMEOUT_S)
    except Exception:  # at exit nothing can be done about it, and nothing must be raised
        pass


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


def on_capture_start() -> None:
    """When capture starts in the process that measures (VERL: the trainer's ``fit``): queue the
    first measurement (``ClockSync.capture_start``). Never blocks or raises; once per process."""
    rec = get_recorder()
    if rec is None:
        return
    try:
        sync = clock_sync()
        if sync is not None:
            sync.capture_start()
    except Exception as exc:
        rec.warn_once("clock_sync", f"clock offset measurement skipped: {exc}")


def on_step(step: int | None) -> None:
    """At a step boundary that is not profiled: measure when the last measurement is ``PERIODIC_S``
    old (``ClockSync.step_tick``), in the background. Never blocks or raises."""
    rec = get_recorder()
    if rec is None:
        return
    try:
        sync = clock_sync()
        if sync is not None:
            sync.step_tick(step)
    except Exception as exc:
        rec.warn_once("clock_sync", f"clock offset measurement skipped: {exc}")


def on_training_end(timeout_s: float = END_TIMEOUT_S) -> bool:
    """At the end of training (VERL: when ``fit`` returns or raises): measure once more and wait at
    most ``timeout_s`` for the targets to store it (``ClockSync.training_end``). Never raises;
    False when nothing could be measured or stored in time."""
    rec = get_recorder()
    if rec is None:
        return False
    try:
        sync = clock_sync()
        return sync.training_end(timeout_s) if sync is not None else False
    except Exception as exc:
        rec.warn_once("clock_sync", f"clock offset measurement skipped: {exc}")
        return False


def flush(timeout_s: float = 5.0) -> bool:
    """Wait for a queued or running background measurement and for the targets to have stored
    every result (call before collecting artifacts or ``ray.shutdown()``); False on a timeout."""
    sync = _SYNC
    if sync is None:
        return True
    deadline = time.monotonic() + timeout_s
    idle = sync.wait_idle(timeout_s)
    return sync.wait_stored(max(0.0, deadline - time.monotonic())) and idle


def prepare(timeout_s: float = 30.0) -> int:
    """Start this node's responders before the first profiled step (see ``ClockSync.prepare``);
    0 without Ray or capture. Never raises."""
    sync = clock_sync()
    if sync is None:
        return 0
    try:
        return sync.prepare(timeout_s)
    except Exception as exc:
        sync.recorder.warn_once("clock_sync", f"clock responders not started: {exc}")
        return 0


def reset() -> None:
    """Stop the background thread and forget the reference-side state (tests)."""
    global _SYNC
    if _SYNC is not None:
        _SYNC.close()
    _SYNC = None
