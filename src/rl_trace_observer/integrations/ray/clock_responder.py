"""The remote half of clock sync: responders that answer exchanges with their Recorder's clock.

- a **per-node actor** (``NodeClockResponder``, one per Ray node, pinned there by node affinity,
  zero CPUs). Named per job and owned by the process that starts it (not detached): a later job
  never finds a responder writing into an old output directory, and none outlives its job. Every
  process on a host shares the host's wall clock, so one measurement per host corrects them all,
  without any change to VERL;
- a **per-process responder**: any actor class that mixes in ``ClockResponderMixin`` answers with
  its own process's clock (``get_recorder()``'s, or the one ``rl_trace_clock_recorder`` returns).

Both read the wall clock through their Recorder's clock, so a test can inject a ``ShiftedClock``,
and keep each result they are sent (``store``) in their own process record.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...capture import get_recorder
from ...capture.clock import SYSTEM_CLOCK, Clock
from ...capture.identity import hostname
from ...capture.recorder import Recorder
from ...config import Config

NAMESPACE = "rl-trace-observer"
PING = "rl_trace_clock_ping"
RECORD = "rl_trace_clock_record"
FLUSH = "rl_trace_clock_flush"


def reply(recorder: Recorder | None) -> tuple[int, int, int, str, int]:
    """``(t1, t2, mono_ns, host, pid)``: the remote half of one exchange, read as late/early as possible."""
    clock = recorder.clock if recorder is not None else SYSTEM_CLOCK
    t1 = clock.wall_ns()
    mono = clock.mono_ns()
    host = recorder.host if recorder is not None else hostname()
    pid = recorder.pid if recorder is not None else os.getpid()
    return t1, clock.wall_ns(), mono, host, pid


def store(recorder: Recorder | None, measurement: dict[str, Any]) -> None:
    """Keep one result in the target's record, with a snapshot (jump detection, profiled windows)."""
    if recorder is None:
        return
    phase = measurement.get("phase")
    reason = f"step_{phase}" if phase in ("begin", "end") else "clock_sync"
    recorder.add_clock_offset(measurement, snapshot_reason=reason)  # one record rewrite, by the writer


class ClockResponderMixin:
    """Mix into a Ray actor class: the actor's process then answers clock exchanges itself."""

    def rl_trace_clock_recorder(self) -> Recorder | None:
        """The recorder whose clock and record are used; override to supply another one."""
        return get_recorder()

    def rl_trace_clock_ping(self) -> tuple[int, int, int, str, int]:
        return reply(self.rl_trace_clock_recorder())

    def rl_trace_clock_record(self, measurement: dict[str, Any]) -> None:
        store(self.rl_trace_clock_recorder(), measurement)

    def rl_trace_clock_flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until the stored results are on disk (tests, tools: ``store`` itself never waits)."""
        recorder = self.rl_trace_clock_recorder()
        return recorder.flush(timeout_s) if recorder is not None else True


class NodeClockResponder(ClockResponderMixin):
    """The per-node responder actor's class (made a Ray actor by ``start_responder``).

    ``clock`` and ``host`` exist for tests, where several "hosts" share one machine; in production
    both are left out and the node's own clock and host name are used.
    """

    def __init__(
        self, output_dir: str, run_id: str | None = None, clock: Clock | None = None, host: str | None = None
    ) -> None:
        cfg = Config(output_dir=Path(output_dir), run_id=run_id, role="clock_sync")
        self._recorder = Recorder(cfg, clock if clock is not None else SYSTEM_CLOCK, host=host)

    def rl_trace_clock_recorder(self) -> Recorder | None:
        return self._recorder

    def identity(self) -> dict[str, Any]:
        return {
            "host": self._recorder.host,
            "pid": self._recorder.pid,
            "record": str(self._recorder.record_path),
        }


_ACTOR_CLS: Any = None  # ray.remote(NodeClockResponder), made once on first use


def start_responder(
    output_dir: str | os.PathLike[str],
    *,
    run_id: str | None = None,
    node_id: str | None = None,
    name: str | None = None,
    clock: Clock | None = None,
    host: str | None = None,
) -> Any:
    """Start (or find, by ``name``) one responder actor, pinned to ``node_id`` when given."""
    import ray

    opts: dict[str, Any] = {"num_cpus": 0, "max_restarts": 0}
    if node_id is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    if name is not None:
        opts.update(name=name, namespace=NAMESPACE, get_if_exists=True)
    global _ACTOR_CLS
    if _ACTOR_CLS is None:
        _ACTOR_CLS = ray.remote(NodeClockResponder)
    return _ACTOR_CLS.options(**opts).remote(str(output_dir), run_id, clock, host)


def ensure_node_responders(output_dir: str | os.PathLike[str], run_id: str | None = None) -> list[Any]:
    """One responder per alive node, named ``rl_trace_clock_<job>_<node>`` (owned by this process)."""
    import ray

    job = ray.get_runtime_context().get_job_id()
    handles = []
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        if node.get("Alive"):
            node_id = node["NodeID"]
            name = f"rl_trace_clock_{job}_{node_id[:16]}"
            handles.append(start_responder(output_dir, run_id=run_id, node_id=node_id, name=name))
    return handles
