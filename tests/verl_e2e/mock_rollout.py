"""A ``mock`` rollout backend for VERL, registered through VERL's rollout registries only.

This is a fake for what cannot run here (a GPU inference engine such as vLLM). Everything around it
is VERL's real code: the agent loop, load balancer, replay buffer, reward loop and checkpoint
manager talk to these servers exactly as they would to vLLM's. The server mirrors VERL's
``vLLMHttpServer.generate``: it hands each request to ``self.engine`` — :class:`MockEngine`, which
stands in for vLLM's ``AsyncLLM`` and speaks its wire format (an async stream of
``RequestOutput``-shaped objects whose ``metrics`` is a ``RequestStateStats`` with monotonic
``queued_ts``/``scheduled_ts``/``first_token_ts``/``last_token_ts``) — with continuous batching
simulated on asyncio (at most ``MAX_RUNNING`` requests decode at once; the rest queue). Every
``SLOW_EVERY``-th request a server handles is deliberately slow (``SLOW_EXTRA_S`` more decode
time): the long tail the report must find. Each server logs what it served to
``$MOCK_ROLLOUT_LOG_DIR/mock-server-<replica>.jsonl`` (one line per request), the truth the
end-to-end test compares the trace with.

Like vLLM with ``global_profiler.tool=torch``, the servers profile their own generation with the
real ``torch.profiler`` into ``rollout_trace_dir`` and move the files into ``save_path`` with
VERL's own ``relocate_rollout_traces`` — so the traces they leave are real Kineto files in VERL's
relocated naming.

Like vLLM with stats on (``disable_log_stats=False``), each server serves ``/metrics`` with vLLM's
metric names — prometheus_client's own HTTP server, fed by the engine at vLLM's moments (a request
queued, scheduled, each token, finished: :mod:`rl_trace_observer.testing.vllm_metrics`) — and the
replica's ``_server_address`` is that endpoint, so VERL's ``LLMServerManager`` registers it through
``RLInsightLogger.register_rollout_metrics`` exactly as it registers a vLLM server.

Registered by :mod:`.plugin` with ``RolloutReplicaRegistry.register("mock", ...)`` and
``_ROLLOUT_REGISTRY[("mock", "async")]``; selected with ``actor_rollout_ref.rollout.name=mock``.
The server class is handed to ``trace_rollout_server`` at the end of this module, as any rollout
that VERL does not ship must do for its request spans.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

from verl.workers.rollout.replica import TokenOutput

from .rollout_base import RolloutServer, ServerReplica, append_log

NAME = "mock"
MAX_NEW_TOKENS = 6
MAX_RUNNING = 4  # requests decoding at once per replica; more wait in the queue
PREFILL_S = 0.003
PER_TOKEN_S = 0.002
SLOW_EVERY = 4  # the 2nd, 6th, 10th, ... request a server handles is slow
SLOW_EXTRA_S = 1.0


# ----------------------------------------------------------------- vLLM's wire format (v1 engine)
@dataclass
class RequestStateStats:
    """vLLM ``vllm.v1.metrics.stats.RequestStateStats``: arrival wall time, engine-core monotonic times."""

    num_generation_tokens: int = 0
    arrival_time: float = 0.0
    queued_ts: float = 0.0
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Any]] | None
    finish_reason: str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestStateStats | None = None
    num_cached_tokens: int | None = 0


@dataclass
class Logprob:
    logprob: float


def _metrics(replica: int) -> Any:
    """vLLM's /metrics for this engine, or None where the observer (its stand-in registry) is absent."""
    try:
        from rl_trace_observer.testing.vllm_metrics import VllmMetrics
    except ImportError:
        return None
    return VllmMetrics(model_name="mock", engine="0")


@dataclass
class MockEngine:
    """Stands in for vLLM's ``AsyncLLM`` (a GPU engine): continuous batching on asyncio."""

    replica: int
    rng: random.Random
    running: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(MAX_RUNNING))
    served: int = 0
    metrics: Any = None
    n_waiting: int = 0
    n_running: int = 0

    def _stats(self, prompt_tokens: int = 0, new_tokens: int = 0) -> None:
        if self.metrics is not None:
            self.metrics.iteration(
                running=self.n_running,
                waiting=self.n_waiting,
                kv_usage=self.n_running / MAX_RUNNING,
                prompt_tokens=prompt_tokens,
                new_tokens=new_tokens,
            )

    async def generate(self, prompt: dict[str, Any], sampling_params: Any, request_id: str, **_: Any) -> Any:
        stats = RequestStateStats(arrival_time=time.time(), queued_ts=time.monotonic())
        self.served += 1
        slow = self.served % SLOW_EVERY == 2
        n = max(
            1, min(MAX_NEW_TOKENS, int(sampling_params["max_tokens"]), self.rng.randint(2, MAX_NEW_TOKENS))
        )
        tokens = [self.rng.randint(10, 200) for _ in range(n)]
        self.n_waiting += 1
        self._stats()
        async with self.running:
            stats.scheduled_ts = time.monotonic()
            self.n_waiting -= 1
            self.n_running += 1
            self._stats(prompt_tokens=len(prompt["prompt_token_ids"]))
            await asyncio.sleep(PREFILL_S)
            for i in range(n):
                if i:
                    await asyncio.sleep(PER_TOKEN_S + (SLOW_EXTRA_S / (n - 1) if slow else 0.0))
                self._stats(new_tokens=1)
                now = time.monotonic()
                stats.first_token_ts = stats.first_token_ts or now
                stats.last_token_ts = now
                stats.num_generation_tokens = i + 1
                out = CompletionOutput(
                    0, "", tokens[: i + 1], -1.0 * (i + 1), [{t: Logprob(-1.0)} for t in tokens[: i + 1]]
                )
                done = i + 1 == n
                out.finish_reason = "length" if done else None
                if done:
                    self._finished(stats, len(prompt["prompt_token_ids"]), n)
                yield RequestOutput(request_id, list(prompt["prompt_token_ids"]), [out], done, stats)
        append_log(
            f"mock-server-{self.replica}.jsonl",
            {
                "replica": self.replica,
                "request_id": request_id,
                "pid": os.getpid(),
                "slow": slow,
                "tokens": n,
                "prompt_tokens": len(prompt["prompt_token_ids"]),
            },
        )

    def _finished(self, stats: RequestStateStats, prompt_tokens: int, n: int) -> None:
        self.n_running -= 1
        self._stats()
        if self.metrics is not None:
            self.metrics.finished(
                reason="length",
                queue_s=stats.scheduled_ts - stats.queued_ts,
                prefill_s=stats.first_token_ts - stats.scheduled_ts,
                decode_s=stats.last_token_ts - stats.first_token_ts,
                ttft_s=stats.first_token_ts - stats.queued_ts,
                e2e_s=stats.last_token_ts - stats.queued_ts,
                prompt_tokens=prompt_tokens,
                generation_tokens=n,
            )


class MockLLMServer(RolloutServer):
    """One replica's server actor on :class:`MockEngine`: token-in/token-out generation."""

    def __init__(self, config: Any, replica_rank: int, world_size: int) -> None:
        super().__init__(config, replica_rank, world_size)
        self.rng = random.Random(1000 + replica_rank)
        self.engine = MockEngine(replica_rank, self.rng, metrics=_metrics(replica_rank))

    async def launch(self) -> str:
        """The server's ``host:port`` with ``/metrics`` on it (what VERL registers for a vLLM server)."""
        if self.engine.metrics is None:
            return f"127.0.0.1:{20000 + self.replica_rank}"  # nothing serves it: registered, never scraped
        return str(self.engine.metrics.serve("127.0.0.1", 0))

    # ---------------------------------------------------------------- generation
    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        **_: Any,
    ) -> TokenOutput:
        """What ``vLLMHttpServer.generate`` does, on :class:`MockEngine`: token in, token out."""
        sampling_params = dict(sampling_params)
        limit = sampling_params.pop("max_tokens", None) or sampling_params.pop("max_new_tokens", None)
        want_logprobs = bool(sampling_params.pop("logprobs", False))
        params = {"max_tokens": int(limit or MAX_NEW_TOKENS), **sampling_params}
        final: RequestOutput | None = None
        async for output in self.engine.generate(
            prompt={"prompt_token_ids": list(prompt_ids)}, sampling_params=params, request_id=request_id
        ):
            final = output
        assert final is not None
        completion = final.outputs[0]
        log_probs = None
        if want_logprobs and completion.logprobs is not None:
            log_probs = [
                lp[t].logprob for t, lp in zip(completion.token_ids, completion.logprobs, strict=True)
            ]
        return TokenOutput(
            token_ids=list(completion.token_ids),
            log_probs=log_probs if log_probs is not None else [-1.0] * len(completion.token_ids),
            stop_reason="completed"
            if completion.finish_reason in ("stop", "length")
            else completion.finish_reason,
            num_preempted=0,
            extra_fields={"global_steps": self.global_steps, "num_cached_tokens": final.num_cached_tokens},
        )

    # ----------------------------------------------------------------- profiling
    async def start_profile(self, **_: Any) -> None:
        if not self._profiling_on() or self._prof is not None:
            return
        import torch

        self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self._prof.start()

    async def stop_profile(self) -> None:
        """Write the engine trace where vLLM would, then let VERL relocate it into save_path."""
        if self._prof is None:
            return
        from verl.utils.profiler import relocate_rollout_traces
        from verl.utils.profiler.config import rollout_trace_dir

        prof, self._prof = self._prof, None
        prof.stop()
        out_dir = rollout_trace_dir(self.config.profiler, self.replica_rank)
        os.makedirs(out_dir, exist_ok=True)
        prof.export_chrome_trace(os.path.join(out_dir, f"mock-engine-rank-0.{os.getpid()}.pt.trace.json.gz"))
        relocate_rollout_traces(self.config.profiler, self.replica_rank, self.world_size)


class MockReplica(ServerReplica):
    """Launches one :class:`MockLLMServer` per replica."""

    server_class = MockLLMServer


try:  # request spans for a rollout VERL does not ship: its server class, traced where it is defined
    from rl_trace_observer.integrations.verl.rollout_servers import trace_rollout_server
except ImportError:  # the observer is not installed: the mock works without it
    pass
else:
    trace_rollout_server(MockLLMServer)
