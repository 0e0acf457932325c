"""DEMO WORKLOAD: a rollout replica — receives weights, "generates" with them, optionally under VizTracer.

Spans use VERL's vocabulary: ``vllm_generate`` and ``update_weights`` on the lane ``replica_<r>``.
In a profiled step VizTracer records the replica's Python call stacks (weight load and every
engine iteration) and the file is saved with VizTracer's Python API, whose metadata carries the
``baseTimeNanoseconds`` anchor the merger needs, then registered in the process record.
"""

from __future__ import annotations

import os
import random
from typing import Any

from . import observe
from .model import DemoConfig, PolicyEngine, Sample, Weights, prompts_for


class RolloutWorker:
    """Body of a rollout actor (wrapped with ``ray.remote`` by the driver)."""

    def __init__(self, replica: int, config: DemoConfig) -> None:
        self.replica = replica
        self.config = config
        self.lane = f"replica_{replica}"
        self.engine = PolicyEngine()
        self._tracer: Any = None
        self._profiled_step: int | None = None
        observe.start("rollout", replica=replica, world_size=config.rollouts)

    def ready(self) -> int:
        return os.getpid()

    def start_profile(self, step: int) -> None:
        from viztracer import VizTracer

        self._tracer = VizTracer(
            verbose=0,
            register_global=False,
            min_duration=self.config.viztracer_min_duration_us,
            process_name=f"rollout replica {self.replica}",
        )
        self._profiled_step = step
        self._tracer.start()

    def stop_profile(self) -> str | None:
        tracer, step = self._tracer, self._profiled_step
        self._tracer = self._profiled_step = None
        if tracer is None:
            return None
        tracer.stop()
        path = (
            observe.artifact_dir("viztracer")
            / f"rollout_replica{self.replica}_step{step}_pid{os.getpid()}.json"
        )
        tracer.save(str(path))
        observe.register(path, "viztracer", step=step, role="rollout", rank=self.replica)
        return str(path)

    def update_weights(self, weights: Weights, version: int) -> int:
        with observe.stage("update_weights", self.lane, step=version):
            self.engine.load(weights, version)
        return version

    def generate(self, step: int) -> list[Sample]:
        cfg = self.config
        prompts = prompts_for(step, self.replica, cfg.samples_per_replica, cfg.seed)
        rng = random.Random(cfg.seed + 7919 * step + self.replica)
        with observe.stage("vllm_generate", self.lane, step=step):
            samples = self.engine.generate(prompts, cfg.max_new_tokens, rng)
        for s in samples:
            s.replica = self.replica
        tokens = sum(len(s.tokens) for s in samples) - sum(len(p) for p in prompts)
        observe.gauge("rollout/generated_tokens", tokens, replica=str(self.replica), step=str(step))
        return samples

    def shutdown(self) -> None:
        self.stop_profile()
        observe.finish()
