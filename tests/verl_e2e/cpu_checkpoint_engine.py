"""A ``cpu_store`` checkpoint engine: VERL's trainer → standalone-rollout weight sync without a GPU.

Why it exists: ``separate_async`` (and the fully-async policy) refuse the ``naive`` backend (that
one hands weights over inside a hybrid worker's own process), and every backend VERL ships moves
the weights over a GPU fabric (``nccl`` through cupy, ``nixl``, ``mooncake``, ``hccl``). This is the
smallest stand-in that keeps VERL's protocol whole: loaded through VERL's own extension point
(``actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module``), driven by VERL's
``CheckpointEngineManager`` (prepare → build_topology → init_process_group → send/receive →
finalize, at every sync), with the weights carried by a ``torch.distributed.TCPStore`` served by
actor rank 0: rank 0 puts the serialized state dict under one key per sync, every rollout worker
waits for that key. The other actor ranks take part in the gather (FSDP's full tensors are a
collective) and drop their copy.
"""

from __future__ import annotations

import asyncio
import io
import uuid
from collections.abc import AsyncGenerator, Generator
from datetime import timedelta
from typing import Any

import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

BACKEND = "cpu_store"
TIMEOUT = timedelta(minutes=10)


@CheckpointEngineRegistry.register(BACKEND)
class CpuStoreCheckpointEngine(CheckpointEngine):
    def __init__(self, bucket_size: int, is_master: bool = False, **_: Any) -> None:
        self.bucket_size = bucket_size
        self.is_master = is_master
        self._server: torch.distributed.TCPStore | None = None  # actor rank 0 only, kept across syncs
        self._store: torch.distributed.TCPStore | None = None
        self.rank = -1
        self.key = ""

    def prepare(self) -> dict[str, Any] | None:
        if not self.is_master:
            return None
        if self._server is None:
            self._server = torch.distributed.TCPStore(
                "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT
            )
        return {"host": "127.0.0.1", "port": self._server.port}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        master = metadata[0]
        assert master is not None, "actor rank 0 must serve the store"
        key = f"weights/{uuid.uuid4().hex}"  # one key per sync: a late reader never sees stale weights
        world = actor_wg_world_size + rollout_world_size
        actor = {"rank": list(range(actor_wg_world_size)), "master": [master] * actor_wg_world_size}
        rollout = {"rank": list(range(actor_wg_world_size, world)), "master": [master] * rollout_world_size}
        actor["key"] = [key] * actor_wg_world_size
        rollout["key"] = [key] * rollout_world_size
        return actor, rollout

    def init_process_group(self, rank: int, master: dict[str, Any], key: str) -> None:
        self.rank, self.key = rank, key
        if self.is_master:
            self._store = self._server
        else:
            self._store = torch.distributed.TCPStore(
                master["host"], master["port"], is_master=False, timeout=TIMEOUT
            )

    def finalize(self) -> None:
        if self.is_master and self._server is not None and self.key:
            self._server.delete_key(self.key)
        self._store, self.key = None, ""

    async def send_weights(
        self, weights: Generator[tuple[str, torch.Tensor], None, None], global_steps: int | None = None
    ) -> dict[str, Any]:
        state: dict[str, torch.Tensor] = {}
        async for name, tensor in ensure_async_iterator(weights):
            if self.rank == 0:
                state[name] = tensor.detach().to("cpu", copy=True)
        if self.rank == 0 and self._store is not None:
            buf = io.BytesIO()
            torch.save({"global_steps": global_steps, "state": state}, buf)
            self._store.set(self.key, buf.getvalue())
        return {}

    async def receive_weights(
        self, global_steps: int | None = None
    ) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        store = self._store
        assert store is not None, "init_process_group was not called"
        raw = await asyncio.to_thread(store.get, self.key)  # the actor's event loop keeps serving
        payload = torch.load(io.BytesIO(raw), weights_only=True)
        for item in payload["state"].items():
            yield item
