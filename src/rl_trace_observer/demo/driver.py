"""DEMO WORKLOAD: the PPO-shaped loop on Ray — weight sync, rollout, advantages, log-probs, update.

Each step is one ``global_step`` span (lane ``global_step``, like the VERL integration's step
marker). Order per step, as in VERL's colocated sync trainer: ``update_weights`` (trainer rank 0 →
every rollout replica), ``vllm_generate`` on every replica, ``compute_advantage`` on the driver,
``actor_compute_log_prob`` and ``actor_update`` on every trainer rank. In ``async`` mode the rollout
of step n+1 (with weights one step old) is launched before step n trains, so they overlap.
Profiled steps start torch.profiler on the trainers and VizTracer on the replicas, and measure
clock offsets over Ray at their boundaries (``integrations.ray.clock_sync``) when that is available.
"""

from __future__ import annotations

import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
        return dict(zip(names, pids, strict=True))

    def launch_sync(self, version: int) -> list[Any]:
        """Weight sync: rank 0 publishes, every replica loads; returns refs to wait on."""
        refs = [t.get_weights.remote(version) for t in self.trainers]
        return refs[1:] + [r.update_weights.remote(refs[0], version) for r in self.rollouts]

    def launch_generate(self, step: int) -> list[Any]:
        return [r.generate.remote(step) for r in self.rollouts]

    def train(self, step: int, samples: list[Sample]) -> list[dict[str, float]]:
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


def _step(loop: DemoLoop, step: int, pending_gen: list[Any] | None, result: LoopResult) -> list[Any] | None:
    """One step; returns the generation already launched for the next step (async mode)."""
    cfg, ray = loop.cfg, loop.ray
    profiled = step in cfg.profile_steps
    with observe.stage("global_step", "global_step", step=step, profiled=profiled, mode=cfg.mode):
        if profiled:
            _clock_boundary(step, "begin")
            loop.profile(step, True)
        if pending_gen is None:  # sync mode (and async step 1): fresh weights, then generate
            ray.get(loop.launch_sync(step))
            pending_gen = loop.launch_generate(step)
        samples = [s for batch in ray.get(pending_gen) for s in batch]
        next_gen: list[Any] | None = None
        waits: list[Any] = []
        if cfg.mode == "async" and step < cfg.steps:
            waits = loop.launch_sync(step + 1)  # queued behind nothing: replicas are idle now
            next_gen = loop.launch_generate(step + 1)  # runs while this step trains
        loop.train(step, samples)
        ray.get(waits)
        result.rewards.append(sum(s.reward for s in samples) / len(samples))
        if profiled:
            result.profile_files += loop.profile(step, False)
            _clock_boundary(step, "end")
    return next_gen


def run_loop(ray: Any, cfg: DemoConfig, progress: Progress) -> LoopResult:
    """Create the actors, run ``cfg.steps`` steps, shut the actors down (Ray itself stays up)."""
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
        pending: list[Any] | None = None
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
