"""A run written step by step by the real capture layer (``Recorder``, its drain, its process
records), for tests that follow a run while it grows (``rl-trace watch``).

Five processes on one host: a driver that writes one ``global_step`` marker per step (as the VERL
integration and the demo do), two trainer ranks (log-prob, update; rank 1 is the straggler in
update) and two rollout replicas (generation, weight sync). Each step also holds one weight sync
recorded as the VERL integration records it (``capture.requests.weight_sync``: the trainer's
``update_weights`` with its ``pause`` phase on rank 0's ``weight_sync`` lane, each replica's
``load_weights`` on its ``replica_<r> weight_sync`` lane, category ``rl_trace.weight_sync``), its
length set per step (``sync_ms``). Times are synthetic wall-clock ns laid out from ``base_ns``, so
every step's figures are known exactly; each :meth:`LiveRun.step` writes one whole step and
flushes every process's drain, so the files hold exactly that much.
"""

from __future__ import annotations

import time
from pathlib import Path

from rl_trace_observer.capture import Recorder
from rl_trace_observer.capture import requests as rq
from rl_trace_observer.capture.sampler.exposition import Series
from rl_trace_observer.capture.sampler.sink import LineSink, open_sink
from rl_trace_observer.capture.sampler.wire import SAMPLES_NAME, SCHEMA, SampleWriter, named
from rl_trace_observer.config import Config

from .recorded import SetClock

MS = 1_000_000
STEP_NS = 200 * MS  # from one step's start to the next's; a step itself lasts 99 ms (+ ``slow``)
SYNC_AT_MS, SYNC_MS = 85, 10  # a step's weight sync starts 85 ms in and lasts at most 10 ms
PROCESSES = (  # (pid, role, rank or replica, lane)
    (7000, "driver", None, None),
    (7001, "trainer", 0, "rank_0"),
    (7002, "trainer", 1, "rank_1"),
    (7003, "rollout", 0, "replica_0"),
    (7004, "rollout", 1, "replica_1"),
)


class LiveRun:
    def __init__(
        self, folder: Path, host: str = "live-host", base_ns: int | None = None, lane_suffix: str = ""
    ) -> None:
        """``lane_suffix``: appended to rank 1's lane name (a hostile name for the dashboard's tests)."""
        self.folder = folder
        self.lanes = {pid: (lane + lane_suffix if pid == 7002 else lane) for pid, _, _, lane in PROCESSES}
        folder.mkdir(parents=True, exist_ok=True)
        self.base_ns = base_ns if base_ns is not None else time.time_ns() - 3600 * 10**9
        self.recorders: dict[int, Recorder] = {}
        self.steps_written = 0
        self.remote: tuple[str, int] = ("", 0)
        self.host = host
        self.sampler: SampleWriter | None = None
        for pid, role, rank, _ in PROCESSES:
            cfg = Config(output_dir=folder.resolve(), run_id="live-1", role=role)
            rec = Recorder(cfg, SetClock(), host=host, pid=pid)
            if role == "trainer":
                rec.update_identity(role=role, rank=rank, world_size=2)
            elif role == "rollout":
                rec.update_identity(role=role, replica=rank)
            self.recorders[pid] = rec

    def add_remote_replica(self, host: str, offset_ns: int) -> None:
        """A third rollout replica on another host whose clock reads ``offset_ns`` ahead; its offset is
        unknown to the merge until :meth:`measure_remote_clock` records it (better clock data, late)."""
        cfg = Config(output_dir=self.folder.resolve(), run_id="live-1", role="rollout")
        rec = Recorder(cfg, SetClock(), host=host, pid=7005)
        rec.update_identity(role="rollout", replica=2)
        self.recorders[7005], self.lanes[7005] = rec, "replica_2"
        self.remote = (host, offset_ns)
        driver = self.recorders[7000]
        driver.add_clock_offset(
            {"reference": "live-host:7000", "reference_host": "live-host", "reference_pid": 7000,
             "method": "reference", "offset_ns": 0, "uncertainty_ns": 0, "round_trip_ns": 0, "rounds": 1,
             "wall_ns": self.base_ns, "reference_wall_ns": self.base_ns, "mono_ns": None, "phase": "periodic"}
        )  # fmt: skip

    def add_sampler(self) -> None:
        """The node's metric sampler (its real writer, in its wire format): the host's CPU, pinned at
        100 % from 10 s before step 1 and never changing again; replica 0's engine (vLLM's running
        requests, 3 until step 2's generation, then 1; its KV-cache use 0.25, then 0.75) and
        replica 1's (2 running, KV cache 0.5, never changing). The sampler writes only changes,
        so no sample of the host's CPU lies near any step: what a step's figures need of it is the
        value held since long before."""
        sink: LineSink = open_sink(self.folder.resolve() / SAMPLES_NAME.format(host=self.host, pid=7009))
        w = self.sampler = SampleWriter(sink)
        t0 = self.base_ns - 10 * 10**9
        w.header(
            {"k": "meta", "schema": SCHEMA, "host": self.host, "pid": 7009, "wall_ns": t0, "interval_s": 1.0}
        )
        self._host_src = w.source("host", cpus=2)
        self._engine_src = w.source(
            "prometheus", job="vllm", address="127.0.0.1:8000", labels={"replica": "0"}
        )
        w.event("server", self._engine_src, t0, placement=True, pid=7003, host=self.host)
        engine_1 = w.source("prometheus", job="vllm", address="127.0.0.1:8001", labels={"replica": "1"})
        w.event("server", engine_1, t0, placement=True, pid=7004, host=self.host)
        w.sample(self._host_src, t0, 0, [(HOST_CPU, 100.0)])
        w.sample(self._engine_src, t0, 0, [(RUNNING, 3.0), (KV_CACHE, 0.25)])
        w.sample(engine_1, t0, 0, [(RUNNING, 2.0), (KV_CACHE, 0.5)])
        sink.flush(5.0)
        self._sink = sink

    def measure_remote_clock(self, step: int) -> None:
        offset = self.remote[1]
        wall = self.step_window(step)[0]
        self.recorders[7005].add_clock_offset(
            {"reference": "live-host:7000", "reference_host": "live-host", "reference_pid": 7000,
             "method": "ray_ntp", "offset_ns": offset, "uncertainty_ns": 50_000, "round_trip_ns": 100_000,
             "rounds": 4, "wall_ns": wall + offset, "reference_wall_ns": wall, "mono_ns": None,
             "phase": "periodic"}
        )  # fmt: skip
        self.flush()

    def step_window(self, step: int, slow: int = 0) -> tuple[int, int]:
        start = self.base_ns + (step - 1) * STEP_NS
        return start, start + (99 + slow) * MS

    def step(
        self,
        step: int,
        *,
        finish: bool = True,
        slow: int = 0,
        sync_ms: float = SYNC_MS,
        sync_at_ms: float = SYNC_AT_MS,
    ) -> None:
        """Write step ``step`` (``finish=False``: its work but not its marker: a run cut mid-step;
        ``slow``: extra ms of rank 1's update, and of the step; ``sync_ms``: its weight sync's length;
        ``sync_at_ms``: when it starts, from the step's start — past the step's end puts it between
        this step and the next)."""
        inside = sync_at_ms + sync_ms <= SYNC_AT_MS + SYNC_MS  # by 95 ms, before its last stage span
        between = 99 + slow < sync_at_ms and sync_at_ms + sync_ms < STEP_NS / MS
        assert 0 < sync_ms <= SYNC_MS and (inside or between), (sync_at_ms, sync_ms)
        t0, t1 = self.step_window(step, slow)
        roles = {pid: role for pid, role, _, _ in PROCESSES} | {7005: "rollout"}
        for pid in self.recorders:
            role, rec, lane = roles[pid], self.recorders[pid], self.lanes[pid]
            if pid == 7005:  # the remote replica: its own clock, ``offset`` ahead
                shift = self.remote[1]
                rec.span("vllm_generate", t0 + 2 * MS + shift, t0 + 48 * MS + shift, lane=lane)
            elif role == "rollout":
                gen_end = t0 + (40 + 5 * (pid - 7003)) * MS
                rec.span("vllm_generate", t0 + 1 * MS, gen_end, lane=lane)
                rec.span("update_weights", t0 + 85 * MS, t0 + 95 * MS, lane=lane)
            elif role == "trainer":
                extra = (10 + slow if pid == 7002 else 0) * MS
                rec.span("actor_compute_log_prob", t0 + 50 * MS, t0 + 60 * MS, lane=lane)
                rec.span("actor_update", t0 + 61 * MS, t0 + 70 * MS + extra, lane=lane)
                if pid == 7001:  # rank 0 pushes the weights
                    rec.span("update_weights", t0 + 85 * MS, t0 + 95 * MS, lane=lane)
        self._weight_sync(step, t0 + round(sync_at_ms * MS), round(sync_ms * MS))
        if self.sampler is not None:
            self.sampler.sample(self._host_src, t0 + 20 * MS, 0, [(HOST_CPU, 100.0)])  # nothing moved
            changed = step >= 2
            values = [(RUNNING, 1.0 if changed else 3.0), (KV_CACHE, 0.75 if changed else 0.25)]
            self.sampler.sample(self._engine_src, t0 + 20 * MS, 0, values)
            self._sink.flush(5.0)
        if finish:
            driver = self.recorders[7000]
            driver.span("global_step", t0, t1, lane="global_step", cat="verl", args={"step": step})
        self.flush()
        self.steps_written = step

    def _weight_sync(self, step: int, lo: int, dur: int) -> None:
        """One sync as ``rq.weight_sync`` writes it (the same lanes, category and args; the capture
        layer's context manager reads the wall clock, so the spans are written through the same
        ``Recorder.span`` call with the corpus's synthetic times)."""
        hi = lo + dur
        trainer = self.recorders[7001]
        lane = rq._sync_lane(None)
        trainer.span(
            "update_weights", lo, hi, lane=lane, cat=rq.SYNC_CAT, args={"version": step, "backend": "nccl"}
        )
        trainer.span("pause", lo, lo + dur // 10, lane=lane, cat=rq.SYNC_CAT, args={})
        for replica, pid in ((0, 7003), (1, 7004)):  # replica 0 loads longest: the slowest replica
            end = hi - (1 + replica) * dur // 10
            args = {"replica": replica, "version": step, "bytes": 4096}
            self.recorders[pid].span(
                "load_weights", lo + dur // 10, end, lane=rq._sync_lane(replica), cat=rq.SYNC_CAT, args=args
            )

    def flush(self) -> None:
        for rec in self.recorders.values():
            rec.flush()

    def close(self) -> None:
        for rec in self.recorders.values():
            rec.close()
        if self.sampler is not None:
            self._sink.close(5.0)


HOST_CPU = named("host_cpu_percent", "gauge")
RUNNING = Series("vllm:num_requests_running", "gauge", "vllm:num_requests_running", ())
KV_CACHE = Series("vllm:kv_cache_usage_perc", "gauge", "vllm:kv_cache_usage_perc", ())  # a 0-1 ratio
