"""Sample staleness where VERL's V1 trainer takes a batch: its replay buffer's ``sample``.

Surface: ``verl.trainer.ppo.v1.replay_buffer.ReplayBuffer.sample`` (``sync``) and
``ReplayBufferAsync.sample`` (``colocate_async``, ``separate_async``), both
``sample(global_steps, partition_id, batch_size) -> (KVBatchMeta, metrics)``. Each sample's tags
carry ``min_global_steps``/``max_global_steps``: the oldest and newest policy version that
produced any of its tokens (VERL's agent loop fills them from the servers' ``global_steps``). At
step ``s`` the trainer holds policy version ``s − 1`` (VERL publishes version ``s`` when step ``s``
ends), so a sample's lag in steps is ``s − 1 − min_global_steps``: 0 for on-policy ``sync``, 1 for a
sample generated a step earlier. The ``consume_samples`` span also covers the wait inside
``sample`` — the trainer blocked on rollout. Validation batches (``partition_id="val"``) are not
training data and are skipped.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ...capture.staleness import record_consumption
from . import contract
from .import_hooks import when_imported
from .patching import PatchSet

log = logging.getLogger("rl_trace_observer")

MODULE = "verl.trainer.ppo.v1.replay_buffer"
CLASSES = ("ReplayBuffer", "ReplayBufferAsync")

_patches = PatchSet()
_lock = threading.Lock()
_state: dict[str, bool] = {"requested": False, "installed": False}


def _record(global_steps: Any, partition_id: Any, result: Any, start_ns: int) -> None:
    if partition_id == "val" or not isinstance(result, tuple) or not result:
        return
    batch = result[0]
    keys, tags = getattr(batch, "keys", None), getattr(batch, "tags", None)
    if not isinstance(keys, list) or not isinstance(tags, list):
        return
    samples = [
        (key, tag.get("min_global_steps"), tag.get("max_global_steps"))
        for key, tag in zip(keys, tags, strict=False)
        if isinstance(tag, dict) and not tag.get("is_padding", False)
    ]
    try:
        step: int | None = int(global_steps)
    except (TypeError, ValueError):
        step = None
    record_consumption(
        step,
        None if step is None else step - 1,
        samples,
        start_ns=start_ns,
        end_ns=time.time_ns(),
        partition=partition_id,
    )


def _wrap_sample(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def sample(
        self: Any, global_steps: Any, partition_id: Any, batch_size: Any, *args: Any, **kwargs: Any
    ) -> Any:
        start = time.time_ns()
        result = original(self, global_steps, partition_id, batch_size, *args, **kwargs)
        try:
            _record(global_steps, partition_id, result, start)
        except Exception as exc:
            log.debug("[rl-trace-observer] staleness: %s", exc)
        return result

    return sample


def _install(module: ModuleType) -> None:
    with _lock:
        if _state["installed"] or not _state["requested"]:
            return
        if not contract.check(contract.STALENESS, module):
            return
        for name in CLASSES:
            cls = getattr(module, name)
            _patches.apply(cls, "sample", _wrap_sample(vars(cls)["sample"]))
        _state["installed"] = True


def install() -> bool:
    with _lock:
        if _state["requested"]:
            return True
        _state["requested"] = True
    when_imported(MODULE, _install)
    return True


def uninstall() -> None:
    with _lock:
        _patches.revert_all()
        _state.update(requested=False, installed=False)
