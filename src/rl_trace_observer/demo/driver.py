"""DEMO WORKLOAD: the PPO-shaped loop on Ray — weight sync, rollout, advantages, log-probs, update.

Each step is one ``global_step`` span (lane ``global_step``, like the VERL integration's step
marker). Order per step, as in VERL's colocated sync trainer: ``update_weights`` (trainer rank 0 →
every rollout replica), ``vllm_generate`` on every replica, ``compute_advantage`` on the driver,
``actor_compute_log_prob`` and ``actor_update`` on every trainer rank. In ``async`` mode the rollout
of step n+1 (with weights one step old) is launched before step n trains, so they overlap.
Profiled steps start torch.profiler on the trainers and VizTracer on the replicas, and measure
clock offsets over Ray at their boundaries (``integrations.ray.clock_sync``) when that is available.

The driver is also the demo's agent loop: every sample is one request with a client span
(:mod:`..capture.requests`), sent to a replica, whose answers stream back as each finishes (one
consumer thread per replica ends the client spans as they arrive); the weight sync is one
trainer-side ``update_weights`` phase, and training records each batch's staleness.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..capture import requests as rq
from ..capture.staleness import record_consumption
from . import observe
from .model import DemoConfig, Sample
from .rollout import RolloutWorker

Progress = Callable[[str], None]


@dataclass
class LoopResult:
    steps: int
    seconds: float
    profiled_steps: list[int]
    rewards: list[float] = field(default_factory=list)
    profile_files: list[str] = field(default_factory=list)
    actor_pids: dict[str, int] = field(default_factory=dict)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _clock_sync() -> Any:
    """The clock-sync integration, or None when this build lacks it."""
    try:
        from ..integrations.ray import clock_sync
    except ImportError:
        return None
    return clock_sync


def _clock_boundary(step: int, phase: str) -> None:
    """Clock offsets at profiled step boundaries (measured in the background, never blocking)."""
    sync = _clock_sync()
    if sync is not None:
        sync.on_step_boundary(step, phase)


def _clock_prepare() -> None:
    """Start the per-node clock responders before the first profiled step: an actor takes seconds
    to start, and a responder still starting at a boundary is simply not measured there. Then the
    capture-start measurement (in the background), so measurements bracket the whole run."""
    sync = _clock_sync()
    if sync is not None:
        sync.prepare(timeout_s=60.0)
        sync.on_capture_start()


def _clock_flush() -> None:
    """The end-of-training measurement, then wait for the background measurements and for the
    responders to store them, so they are in the process records before collection and before Ray
    shuts down."""
    sync = _clock_sync()
    if sync is not None:
        sync.on_training_end()
        sync.flush(timeout_s=30.0)
        sync.reset()  # stops the background thread; the responders' records are complete


def _advantages(samples: list[Sample]) -> float:
    """Group-normalised advantages (GRPO-style, over the whole batch); returns the mean reward."""
    rewards = [s.reward for s in samples]
    mean = statistics.fmean(rewards)
    std = statistics.pstdev(rewards) or 1.0
    for s in samples:
        s.advantage = (s.reward - mean) / std
    return mean


class _Requests:
    """One replica's share of a step's requests in flight: client spans, ended as answers stream in."""

    def __init__(self, ray: Any, replica: Any, index: int, step: int, count: int) -> None:
        self.ids = [f"s{step}-r{index}-{i}" for i in range(count)]
        self.clients = {
            rid: rq.begin_client(rid, step=step, sample_index=i, turn=1, server=f"replica_{index}")
            for i, rid in enumerate(self.ids)
        }
        self.samples: list[Sample] = []
        self.error: BaseException | None = None
        stream = replica.generate.remote(step, self.ids)  # a Ray streaming generator
        self.thread = threading.Thread(target=self._consume, args=(ray, stream), daemon=True)
        self.thread.start()

    def _consume(self, ray: Any, stream: Any) -> None:
        try:
            for ref in stream:
                sample: Sample = ray.get(ref)
                self.samples.append(sample)
                rq.end_client(
                    self.clients.pop(sample.meta["request_id"], None),
                    response_tokens=len(sample.rollout_log_probs),
                    replica=sample.replica,
                    version=sample.weight_version,
                    status="completed",
                )
        except BaseException as exc:  # re-raised by wait(), in the driver's thread
            self.error = exc
        finally:
            for req in self.clients.values():
                rq.end_client(req, status="error")

    def wait(self) -> list[Sample]:
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.samples


class _Sync:
    """A weight sync in flight: its trainer-side ``update_weights`` phase ends when every load did."""

    def __init__(self, ray: Any, refs: list[Any], policy_version: int) -> None:
        self.phase = rq.weight_sync("update_weights", version=policy_version, backend="demo")
        self.phase.__enter__()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._wait, args=(ray, refs), daemon=True)
        self.thread.start()

    def _wait(self, ray: Any, refs: list[Any]) -> None:
        try:
            ray.get(refs)
        except BaseException as exc:
            self.error = exc
        finally:
            self.phase.__exit__(None, None, None)

    def wait(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


class DemoLoop:
    """The driver's side of the demo: actors, and one method per phase of a step."""

    def __init__(self, ray: Any, cfg: DemoConfig) -> None:
        from .trainer import TrainerWorker

        self.ray, self.cfg = ray, cfg
        trainer_cls = ray.remote(num_cpus=1, max_restarts=0)(TrainerWorker)
        rollout_cls = ray.remote(num_cpus=1, max_restarts=0)(RolloutWorker)
        port = _free_port()
        self.trainers = [
            trainer_cls.options(name=f"demo_trainer_rank{r}").remote(r, cfg, port)
            for r in range(cfg.trainers)
        ]
        self.rollouts = [
            rollout_cls.options(name=f"demo_rollout_replica{r}").remote(r, cfg) for r in range(cfg.rollouts)
        ]

    def start(self) -> dict[str, int]:
        pids = self.ray.get(
            [t.setup.remote() for t in self.trainers] + [r.ready.remote() for r in self.rollouts]
        )
        names = [f"trainer rank {r}" for r in range(self.cfg.trainers)]
        names += [f"rollout replica {r}" for r in range(self.cfg.rollouts)]
        self.register_metrics()
        return dict(zip(names, pids, strict=True))

    def register_metrics(self) -> None:
        """Each replica's ``/metrics``, registered as VERL's ``LLMServerManager`` does it
        (``RLInsightLogger.register_rollout_metrics`` → ``rl_insight.update_prometheus_config``:
        one address per replica, job = the rollout's name, labels ``{"replica": r}``)."""
        import rl_insight

        addresses = self.ray.get([r.metrics_address.remote() for r in self.rollouts])
        rl_insight.update_prometheus_config(
            addresses, "vllm", labels=[{"replica": r} for r in range(len(addresses))]
        )

    def launch_sync(self, version: int, policy_version: int) -> _Sync:
        """Weight sync: rank 0 publishes, every replica loads; ``policy_version`` = the updates the
        weights contain (step ``s`` trains version ``s - 1``)."""
        refs = [t.get_weights.remote(version) for t in self.trainers]
        loads = [r.update_weights.remote(refs[0], version, policy_version) for r in self.rollouts]
        return _Sync(self.ray, refs[1:] + loads, policy_version)

    def launch_generate(self, step: int) -> list[_Requests]:
        n = self.cfg.samples_per_replica
        return [_Requests(self.ray, r, i, step, n) for i, r in enumerate(self.rollouts)]

    def train(self, step: int, samples: list[Sample], waited_ns: int) -> list[dict[str, float]]:
        record_consumption(  # the batch as the trainer takes it: how stale each sample is
            step,
            step - 1,
            [(s.meta.get("request_id"), s.weight_version, s.weight_version) for s in samples],
            start_ns=waited_ns,
        )
        with observe.stage("compute_advantage", "driver", step=step):
            reward = _advantages(samples)
            shards = [samples[r :: self.cfg.trainers] for r in range(self.cfg.trainers)]
        observe.gauge("critic/rewards/mean", reward, step=str(step))
        self.ray.get(
            [t.compute_log_prob.remote(step, shard) for t, shard in zip(self.trainers, shards, strict=True)]
        )
        metrics: list[dict[str, float]] = self.ray.get([t.update.remote(step) for t in self.trainers])
        return metrics

    def profile(self, step: int, on: bool) -> list[str]:
        everyone = self.trainers + self.rollouts
        if on:
            self.ray.get([a.start_profile.remote(step) for a in everyone])
            return []
        return [p for p in self.ray.get([a.stop_profile.remote() for a in everyone]) if p]

    def shutdown(self) -> None:
        everyone = self.trainers + self.rollouts
        self.ray.get([a.shutdown.remote() for a in everyone], timeout=60)


def _step(
    loop: DemoLoop, step: int, pending_gen: list[_Requests] | None, result: LoopResult
) -> list[_Requests] | None:
    """One step; returns the generation already launched for the next step (async mode)."""
    cfg = loop.cfg
    profiled = step in cfg.profile_steps
    with observe.stage("global_step", "global_step", step=step, profiled=profiled, mode=cfg.mode):
        if profiled:
            _clock_boundary(step, "begin")
            observe.profiling(True)  # the node's metric sampler samples faster in profiled steps
            loop.profile(step, True)
        step_t0 = time.perf_counter()
        gen_t0: float | None = None
        if pending_gen is None:  # sync mode (and async step 1): fresh weights, then generate
            loop.launch_sync(step, policy_version=step - 1).wait()
            gen_t0 = time.perf_counter()
            pending_gen = loop.launch_generate(step)
        waited = time.time_ns()
        samples = [s for batch in pending_gen for s in batch.wait()]
        if gen_t0 is not None:  # VERL's own timer for the phase (`timing_s/gen`), as its trainer logs it
            observe.gauge("timing_s/gen", time.perf_counter() - gen_t0, step=str(step))
        next_gen: list[_Requests] | None = None
        sync: _Sync | None = None
        if cfg.mode == "async" and step < cfg.steps:
            # queued behind nothing: replicas are idle now; the weights do not have this step's update
            sync = loop.launch_sync(step + 1, policy_version=step - 1)
            next_gen = loop.launch_generate(step + 1)  # runs while this step trains
        loop.train(step, samples, waited)
        if sync is not None:
            sync.wait()
        result.rewards.append(sum(s.reward for s in samples) / len(samples))
        if profiled:
            result.profile_files += loop.profile(step, False)
            observe.profiling(False)
            _clock_boundary(step, "end")
        observe.gauge("timing_s/step", time.perf_counter() - step_t0, step=str(step))
    return next_gen


SETUP_SPAN = "set-up (not a step): Ray, actors, model"


def _mark_setup(started_ns: int | None) -> None:
    """The set-up as one slice on the driver's ``set-up`` track, so the ~95 % of the whole trace
    before step 1 reads as what it is (a ``demo`` category: not a stage, not in any step)."""
    from ..capture import get_recorder

    rec = get_recorder()
    if rec is not None and started_ns is not None:
        rec.span(SETUP_SPAN, started_ns, time.time_ns(), lane="set-up", cat="demo")


def run_loop(
    ray: Any, cfg: DemoConfig, progress: Progress, *, setup_started_ns: int | None = None
) -> LoopResult:
    """Create the actors, run ``cfg.steps`` steps, shut the actors down (Ray itself stays up);
    ``setup_started_ns``: when the set-up began (before Ray started), for its slice."""
    t0 = time.monotonic()
    progress(f"starting {cfg.trainers} trainer and {cfg.rollouts} rollout actors")
    loop = DemoLoop(ray, cfg)  # actors start in the background while the driver sets up capture
    observe.start("driver")
    result = LoopResult(
        steps=cfg.steps, seconds=0.0, profiled_steps=[s for s in cfg.profile_steps if s <= cfg.steps]
    )
    try:
        result.actor_pids = loop.start()
        if result.profiled_steps:
            _clock_prepare()
        _mark_setup(setup_started_ns)
        pending: list[_Requests] | None = None
        for step in range(1, cfg.steps + 1):
            progress(f"step {step}/{cfg.steps}" + (" (profiled)" if step in cfg.profile_steps else ""))
            pending = _step(loop, step, pending, result)
        progress("stopping actors")
        loop.shutdown()
    finally:
        _clock_flush()
        observe.finish()
    result.seconds = time.monotonic() - t0
    return result
