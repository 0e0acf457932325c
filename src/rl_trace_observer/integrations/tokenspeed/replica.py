"""``actor_rollout_ref.rollout.name=tokenspeed``: one TokenSpeed server per VERL rollout replica.

Registered by :mod:`rl_trace_observer.integrations.verl.tokenspeed_rollout` in VERL's
``RolloutReplicaRegistry``; VERL calls ``init_hybrid`` (the replica's training workers are its
GPUs), which calls :meth:`launch_servers`. The server actor (:class:`.server.TokenSpeedServer`) is
pinned to the node of the replica's first worker and starts ``tokenspeed serve`` there on the
workers' visible GPUs; it is named ``tokenspeed_server_<replica>`` so the in-worker adapter finds it.

Profiling: VERL 0.9.1 calls ``start_profile()`` with no arguments, so the step of the window comes
from the trainer's ``_start_rollout_profiling`` (observed by the plugin and handed over here through
:func:`profiled_step`); without it a window is named ``step-unknown-<n>``.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.workers.rollout.replica import RolloutMode, RolloutReplica

from .server import TokenSpeedServer

_step_value: dict[str, int | None] = {"step": None}
LIVE: weakref.WeakSet[TokenSpeedReplica] = weakref.WeakSet()


def set_profiled_step(step: int | None) -> None:
    """Called by the trainer hook right before VERL asks replicas to start profiling."""
    _step_value["step"] = step


def profiled_step() -> int | None:
    return _step_value["step"]


def _where(_worker: Any = None) -> tuple[str, str | None]:
    return ray.get_runtime_context().get_node_id(), os.environ.get("CUDA_VISIBLE_DEVICES")


class TokenSpeedReplica(RolloutReplica):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        LIVE.add(self)

    def _role(self) -> str:
        return "reward" if self.is_reward_model else "teacher" if self.is_teacher_model else "rollout"

    async def launch_servers(self) -> None:
        if self.rollout_mode != RolloutMode.HYBRID:
            raise NotImplementedError(
                f"the tokenspeed rollout runs in hybrid mode only (got {self.rollout_mode}); "
                "colocated and standalone replicas need a checkpoint-engine backend it does not have yet"
            )
        if self.nnodes != 1:
            raise NotImplementedError("the tokenspeed rollout needs each replica on one node")
        where = await asyncio.gather(*[w.__ray_call__.remote(_where) for w in self.workers])
        node_id = where[0][0]
        devices: list[str] = []
        for _, visible in where:
            devices += [d for d in (visible or "").split(",") if d and d not in devices]
        role = self._role()
        name = f"tokenspeed_server_{self.replica_rank}{self.name_suffix}"
        if role != "rollout":
            name = f"tokenspeed_server_{role}_{self.replica_rank}{self.name_suffix}"
        model_path = getattr(self.model_config, "local_path", None) or self.model_config.path
        server = (
            ray.remote(TokenSpeedServer)
            .options(
                name=name,
                num_cpus=0,
                max_concurrency=self.max_concurrency,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
            )
            .remote(
                self.config,
                str(model_path),
                self.replica_rank,
                self.world_size,
                cuda_visible_devices=",".join(devices) or None,
                name=name,
            )
        )
        self._server_address = await server.launch_server.remote()
        self.servers = [server]
        self._server_handle = server

    async def start_profile(self, **kwargs: Any) -> None:
        step = kwargs.pop("global_step", None)
        step = profiled_step() if step is None else step
        await asyncio.gather(*[s.start_profile.remote(global_step=step) for s in self.servers])

    async def wait_for_profiles(self, timeout_s: float | None = None) -> list[Any]:
        return list(await asyncio.gather(*[s.wait_for_profiles.remote(timeout_s) for s in self.servers]))
