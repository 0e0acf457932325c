"""DEMO WORKLOAD: a rollout replica — receives weights, "generates" with them, optionally under VizTracer.

Spans use VERL's vocabulary: ``vllm_generate`` and ``update_weights`` on the lane ``replica_<r>``.
Generation serves one request per sample with continuous batching and hands each back (a Ray
streaming generator) as it finishes; every request gets a server span through the same capture API
VERL's rollout servers use (:mod:`..capture.requests`), with the engine's queue / prefill / decode
times, and the weight sync its ``load_weights`` phase and the new ``weight_version``.
Like a vLLM server with stats on, each replica serves ``/metrics`` with vLLM's metric names
(:mod:`..testing.vllm_metrics`, prometheus_client's own HTTP server): running / waiting requests and
KV-cache use per engine iteration, prompt / generation token counters, the per-request latency
histograms; the driver registers the endpoints the way VERL does (``rl_insight.update_prometheus_config``).
In a profiled step VizTracer records the replica's Python call stacks (weight load and every
engine iteration) and the file is saved with VizTracer's Python API, whose metadata carries the
``baseTimeNanoseconds`` anchor the merger needs, then registered in the process record.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from typing import Any

from ..capture import requests as rq
from ..testing.vllm_metrics import VllmMetrics
from . import observe
from .model import PROMPT_LEN, DemoConfig, PolicyEngine, Sample, Weights, prompts_for, reward_of


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
        self.vllm: Any = None
        self.metrics: Any = None
        if config.engine == "vllm":  # a real vLLM: its own scheduler, times and /metrics
            from .vllm_engine import VllmReplicaEngine

            assert config.model_dir, "--engine vllm needs the model the driver built"
            self.vllm = VllmReplicaEngine(config.model_dir, replica, config.max_running)
        else:
            self.metrics = VllmMetrics(model_name="demo-policy", engine="0")

    def ready(self) -> int:
        return os.getpid()

    def metrics_address(self) -> str:
        """Start serving ``/metrics`` and return its ``host:port`` (a vLLM server's address)."""
        if self.vllm is not None:
            return str(self.vllm.metrics_address())
        return str(self.metrics.serve("127.0.0.1", 0))

    def _iteration(self, running: int, waiting: int, prompt_tokens: int, new_tokens: int, kv: int) -> None:
        capacity = self.config.max_running * (PROMPT_LEN + self.config.max_new_tokens)
        self.metrics.iteration(
            running=running,
            waiting=waiting,
            kv_usage=kv / capacity,
            prompt_tokens=prompt_tokens,
            new_tokens=new_tokens,
        )

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

    def update_weights(self, weights: Weights, version: int, policy_version: int | None = None) -> int:
        """Load the weights published for step ``version``; ``policy_version`` = the trainer updates
        they contain (what staleness counts in)."""
        policy = version if policy_version is None else policy_version
        with (
            observe.stage("update_weights", self.lane, step=version),
            rq.weight_sync("load_weights", replica=self.replica, version=policy) as phase,
        ):
            self.engine.load(weights, policy)
            phase.args["bytes"] = 8 * sum(
                len(row) if isinstance(row, list) else 1 for w in weights.values() for row in w
            )
        rq.mark_version(policy, replica=self.replica)
        return version

    def generate(self, step: int, request_ids: list[str]) -> Iterator[Sample]:
        """One request per id (sample i of this replica's prompts for ``step``), each yielded as
        soon as the engine finishes it; a server span per request from arrival to that moment."""
        cfg = self.config
        prompts = prompts_for(step, self.replica, len(request_ids), cfg.seed)
        rng = random.Random(cfg.seed + 7919 * step + self.replica)
        tokens = 0
        with observe.stage("vllm_generate", self.lane, step=step):
            served = [
                rq.begin_server(rid, replica=self.replica, prompt_tokens=len(p), version=self.engine.version)
                for rid, p in zip(request_ids, prompts, strict=True)
            ]
            if self.vllm is not None:
                for i, sample, new in self.vllm.generate(
                    prompts, cfg.max_new_tokens, request_ids, served, self.engine.version
                ):
                    sample.replica = self.replica
                    sample.meta["request_id"] = request_ids[i]
                    sample.reward = reward_of(sample.tokens)
                    tokens += new
                    yield sample
                observe.gauge("rollout/generated_tokens", tokens, replica=str(self.replica), step=str(step))
                return
            stream = self.engine.generate_stream(
                prompts, cfg.max_new_tokens, rng, cfg.max_running, on_iteration=self._iteration
            )
            for i, sample, t in stream:
                sample.replica = self.replica
                sample.meta["request_id"] = request_ids[i]
                new = len(sample.tokens) - len(prompts[i])
                tokens += new
                phases = rq.EnginePhases(t["queued"], t["scheduled"], t["first_token"], t["last_token"])
                rq.end_server(served[i], phases=phases, response_tokens=new, status="completed")
                self._finished(t, len(prompts[i]), new)
                yield sample
            self._iteration(0, 0, 0, 0, 0)  # the batch is done: nothing runs or waits
        observe.gauge("rollout/generated_tokens", tokens, replica=str(self.replica), step=str(step))

    def _finished(self, t: dict[str, int], prompt_tokens: int, new_tokens: int) -> None:
        s = 1e-9
        self.metrics.finished(
            reason="length" if new_tokens >= self.config.max_new_tokens else "stop",
            queue_s=(t["scheduled"] - t["queued"]) * s,
            prefill_s=(t["first_token"] - t["scheduled"]) * s,
            decode_s=(t["last_token"] - t["first_token"]) * s,
            ttft_s=(t["first_token"] - t["queued"]) * s,
            e2e_s=(t["last_token"] - t["queued"]) * s,
            prompt_tokens=prompt_tokens,
            generation_tokens=new_tokens,
        )

    def shutdown(self) -> None:
        self.stop_profile()
        if self.vllm is not None:
            self.vllm.shutdown()
        observe.finish()
