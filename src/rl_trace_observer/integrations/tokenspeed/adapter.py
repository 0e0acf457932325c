"""The in-worker half of the ``tokenspeed`` rollout (VERL's ``get_rollout_class("tokenspeed")``).

Hybrid mode: VERL builds one adapter in every training worker and calls ``resume(["weights"])``,
``update_weights(per_tensor_param, global_steps=...)`` and ``resume(["kv_cache"])`` on all of them.
Every rank must iterate the weight generator (FSDP gathers each tensor collectively); only the
leader of each replica (``rank % replica_size == 0``) sends. It sends over a TokenSpeed weight
group (:mod:`.weights`) in buckets of ``checkpoint_engine.update_weights_bucket_megabytes``:

- gloo (no GPU): to its own replica;
- NCCL: to the next replica, because NCCL refuses two ranks of one group on one GPU, and a replica's
  leader shares its GPU with that replica's TP rank 0. One replica on GPUs is therefore an error.

Memory: ``resume``/``release`` go to the replica's server actor, which tracks what is released
(TokenSpeed fails a double release or a resume of what is resident).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Iterable
from typing import Any

from verl.workers.rollout.base import BaseRollout

from .launcher import free_port
from .weights import GROUP_NAME, broadcast_all, bucket_body, buckets, join_group, nbytes

log = logging.getLogger("rl_trace_observer")

SERVER_NAME = "tokenspeed_server_{replica}"


def _size(config: Any) -> int:
    return int(
        config.tensor_model_parallel_size
        * getattr(config, "data_parallel_size", 1)
        * getattr(config, "pipeline_model_parallel_size", 1)
    )


async def _items(weights: Iterable[Any] | AsyncIterator[Any]) -> AsyncIterator[tuple[str, Any]]:
    if hasattr(weights, "__aiter__"):
        async for item in weights:  # type: ignore[union-attr]
            yield item
    else:
        for item in weights:  # type: ignore[union-attr]
            yield item


class TokenSpeedServerAdapter(BaseRollout):
    def __init__(self, config: Any, model_config: Any, device_mesh: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, model_config, device_mesh)
        self.sleep_level = 2  # weights and KV cache are both released when the replica sleeps
        self.rank = int(os.environ.get("RANK", "0"))
        self.replica_size = _size(self.config)
        self.replica_rank = int(kwargs.get("replica_rank", self.rank // self.replica_size))
        self.is_leader_rank = self.rank % self.replica_size == 0
        self.replicas = max(1, int(os.environ.get("WORLD_SIZE", "1")) // self.replica_size)
        self._group: Any = None
        self._target: int | None = None
        self.synced = {"tensors": 0, "bytes": 0, "buckets": 0}

    # ---------------------------------------------------------------------------- servers
    @staticmethod
    def server(replica: int) -> Any:
        import ray

        return ray.get_actor(SERVER_NAME.format(replica=replica))

    def _backend(self) -> str:
        import torch

        return "nccl" if torch.cuda.is_available() else "gloo"

    def _target_replica(self, backend: str) -> int:
        if backend == "gloo":
            return self.replica_rank
        if self.replicas < 2:
            raise RuntimeError(
                "the tokenspeed rollout's hybrid weight sync over NCCL needs at least 2 replicas: "
                "NCCL refuses two ranks of one group on one GPU, and a replica's leader shares its GPU "
                "with that replica's TP rank 0 (use more GPUs than tensor_model_parallel_size)"
            )
        return (self.replica_rank + 1) % self.replicas

    # ----------------------------------------------------------------------------- memory
    async def resume(self, tags: list[str]) -> None:
        if not self.is_leader_rank:
            return
        server = self.server(self.replica_rank)
        if "weights" in tags:
            await server.resume_memory.remote(["weights"])
        if "kv_cache" in tags:
            await server.resume_kv_cache.remote()

    async def release(self) -> None:
        if self.is_leader_rank:
            await self.server(self.replica_rank).release_memory.remote(None)

    # ---------------------------------------------------------------------------- weights
    async def _ensure_group(self, backend: str) -> tuple[Any, Any]:
        target = self._target_replica(backend)
        server = self.server(target)
        if self._group is not None and self._target == target:
            return self._group, server
        import ray

        ranks = int(await server.get_world_size.remote())
        here = ray.util.get_node_ip_address()
        # the store is ours (rank 0); a server on this node reaches it on the loopback
        address = "127.0.0.1" if await server.get_node_ip.remote() == here else here
        port = free_port()
        body = {
            "master_address": address,
            "master_port": port,
            "rank_offset": 1,
            "world_size": 1 + ranks,
            "group_name": GROUP_NAME,
            "backend": backend,
        }
        group, _ = await asyncio.gather(
            asyncio.to_thread(join_group, address, port, 1 + ranks, backend, GROUP_NAME),
            server.init_weights_update_group.remote(body),
        )
        self._group, self._target = group, target
        return group, server

    async def _send_bucket(self, bucket: list[tuple[str, Any]], server: Any, version: Any) -> None:
        """One ``/update_weights_from_distributed`` request and its broadcasts, concurrently."""
        body = bucket_body(bucket, GROUP_NAME, version)
        await asyncio.gather(
            asyncio.to_thread(broadcast_all, bucket, self._group),
            server.update_weights_from_distributed.remote(body),
        )
        self.synced["buckets"] += 1
        self.synced["tensors"] += len(bucket)
        self.synced["bytes"] += sum(nbytes(t) for _, t in bucket)

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the tokenspeed rollout takes named tensors, not {wire_format!r}")
        if kwargs.get("peft_config") is not None and not kwargs.get("base_sync_done", True):
            raise NotImplementedError("the tokenspeed rollout does not take LoRA adapters yet")
        version = kwargs.get("global_steps")
        if not self.is_leader_rank:
            async for _ in _items(weights):  # every rank gathers every tensor; only leaders send
                pass
            return
        backend = self._backend()
        device = "cuda" if backend == "nccl" else "cpu"
        group, server = await self._ensure_group(backend)
        del group
        await server.resume_memory.remote(["weights"])  # the target may not have woken itself yet
        limit = int(getattr(self.config.checkpoint_engine, "update_weights_bucket_megabytes", 2048)) << 20

        async def ready() -> AsyncIterator[tuple[str, Any]]:
            async for name, tensor in _items(weights):
                yield name, tensor.detach().to(device).contiguous()

        async for bucket in buckets(ready(), limit):
            await self._send_bucket(bucket, server, version)
        await server.set_global_steps.remote(version)
