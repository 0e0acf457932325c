"""A ``mock`` rollout backend for VERL, registered through VERL's rollout registries only.

This is a fake for what cannot run here (a GPU inference engine such as vLLM). Everything around it
is VERL's real code: the agent loop, load balancer, replay buffer, reward loop and checkpoint
manager talk to these servers exactly as they would to vLLM's. The servers return short random
completions (with log-probs), and, like vLLM with ``global_profiler.tool=torch``, profile their
own generation with the real ``torch.profiler`` into ``rollout_trace_dir`` and move the files into
``save_path`` with VERL's own ``relocate_rollout_traces`` — so the traces they leave are real
Kineto files in VERL's relocated naming.

Registered by :mod:`.plugin` with ``RolloutReplicaRegistry.register("mock", ...)`` and
``_ROLLOUT_REGISTRY[("mock", "async")]``; selected with ``actor_rollout_ref.rollout.name=mock``.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import AsyncIterator, Iterable
from typing import Any

import ray
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

NAME = "mock"
MAX_NEW_TOKENS = 6


class MockLLMServer:
    """One replica's server actor: token-in/token-out generation plus the control surface."""

    def __init__(self, config: Any, replica_rank: int, world_size: int) -> None:
        self.config = config
        self.replica_rank = replica_rank
        self.world_size = world_size
        self.global_steps = 0  # the weight version; the adapter moves it after every weight sync
        self.rng = random.Random(1000 + replica_rank)
        self._prof: Any = None

    # ---------------------------------------------------------------- generation
    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any
    ) -> TokenOutput:
        """A few random tokens from the low end of the vocabulary (never a special token)."""
        limit = int(
            sampling_params.get("max_tokens") or sampling_params.get("max_new_tokens") or MAX_NEW_TOKENS
        )
        n = max(1, min(MAX_NEW_TOKENS, limit, self.rng.randint(2, MAX_NEW_TOKENS)))
        await asyncio.sleep(0.002)  # a real engine yields while decoding; keep the event loop honest
        tokens = [self.rng.randint(10, 200) for _ in range(n)]
        return TokenOutput(
            token_ids=tokens,
            log_probs=[-1.0] * n,
            stop_reason="completed",
            num_preempted=0,
            extra_fields={"global_steps": self.global_steps},
        )

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    # ------------------------------------------------------------- control plane
    async def wake_up(self, tags: list[str] | None = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def wait_for_requests_to_drain(self) -> None:
        return None

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        return {"aborted_count": 0, "request_ids": []}

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict:
        return {"aborted": False, "request_id": request_id}

    async def resume_generation(self) -> None:
        return None

    # ----------------------------------------------------------------- profiling
    def _profiling_on(self) -> bool:
        prof = getattr(self.config, "profiler", None)
        return bool(prof is not None and prof.enable and prof.tool == "torch" and prof.save_path)

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


class MockReplica(RolloutReplica):
    """Launches one :class:`MockLLMServer` per replica next to the hybrid workers."""

    async def launch_servers(self) -> None:
        server_cls = ray.remote(MockLLMServer)
        server = server_cls.options(
            name=f"mock_server_{self.replica_rank}{self.name_suffix}",
            num_cpus=0,
            max_concurrency=self.max_concurrency,
        ).remote(self.config, self.replica_rank, self.world_size)
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"127.0.0.1:{20000 + self.replica_rank}"

    async def sleep(self) -> None:
        await asyncio.gather(*[s.sleep.remote() for s in self.servers])


class MockServerAdapter(BaseRollout):
    """The in-worker half (``get_rollout_class``): receives weights after each step and drops them."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, model_config, device_mesh)
        self.sleep_level = 2
        self.received_tensors = 0

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    async def update_weights(
        self, weights: Iterable[Any] | AsyncIterator[Any], global_steps: int | None = None, **kwargs: Any
    ) -> None:
        if hasattr(weights, "__aiter__"):
            async for _ in weights:  # type: ignore[union-attr]
                self.received_tensors += 1
        else:
            for _ in weights:  # type: ignore[union-attr]
                self.received_tensors += 1
        if global_steps is not None:  # like vLLM's adapter: tell the server the new weight version
            replica = int(os.environ.get("RANK", "0")) // max(1, self.config.tensor_model_parallel_size)
            server = ray.get_actor(f"mock_server_{replica}")
            await server.set_global_steps.remote(global_steps)
