"""Registers the ``tokenspeed`` rollout in VERL 0.9.1 and tells its replicas which step they profile.

- When ``verl.workers.rollout.replica`` loads: ``RolloutReplicaRegistry.register("tokenspeed", …)``
  (a lazy loader of :class:`..tokenspeed.replica.TokenSpeedReplica`) and
  ``_ROLLOUT_REGISTRY[("tokenspeed", "async")]`` = the in-worker adapter. A name the user registered
  already is left alone. Selected by ``actor_rollout_ref.rollout.name=tokenspeed``.
- When the V1 trainer loads: ``PPOTrainer._start_rollout_profiling`` is wrapped to hand its
  ``global_steps`` to the tokenspeed replicas (VERL calls ``manager.start_profile()`` without it), and
  ``fit`` waits, at its end, for the profile files of every tokenspeed replica (bounded by the stall
  timeout) so the last profiled step is registered before the job exits. Neither changes what VERL
  does for other rollouts.

Each surface is checked first (:mod:`.contract`): on a mismatch one error names the VERL version and
the missing surface, the feature stays off, and ``import verl`` never breaks.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import contract
from .import_hooks import when_imported
from .patching import PatchSet

log = logging.getLogger("rl_trace_observer")

NAME = "tokenspeed"
REPLICA_MODULE = "verl.workers.rollout.replica"
BASE_MODULE = "verl.workers.rollout.base"
TRAINER_MODULE = "verl.trainer.ppo.v1"
REPLICA_CLASS = "rl_trace_observer.integrations.tokenspeed.replica"
ADAPTER = "rl_trace_observer.integrations.tokenspeed.adapter.TokenSpeedServerAdapter"

Surface = contract.Surface
_F = "the tokenspeed rollout"
REGISTRIES = (
    Surface(REPLICA_MODULE, "RolloutReplicaRegistry.register", ("name", "loader"), feature=_F),
    Surface(REPLICA_MODULE, "RolloutReplica.start_profile", var_keyword=True, feature=_F),
    Surface(REPLICA_MODULE, "RolloutReplica.init_hybrid", ("worker_group",), feature=_F),
    Surface(REPLICA_MODULE, "TokenOutput", feature=_F),
    Surface(BASE_MODULE, "_ROLLOUT_REGISTRY", feature=_F),
    Surface(BASE_MODULE, "BaseRollout", feature=_F),
)
_STEPS = "tokenspeed profile steps"
PROFILE_STEP = (
    Surface(TRAINER_MODULE + ".trainer_base", "PPOTrainer._start_rollout_profiling", feature=_STEPS),
    Surface(TRAINER_MODULE + ".trainer_base", "PPOTrainer.fit", feature=_STEPS),
)

_patches = PatchSet()
_lock = threading.Lock()
_state: dict[str, Any] = {"requested": False, "registered": False, "trainer": False}
END_WAIT_S = 600.0  # at most this long at the end of fit (each replica also gives up on a stall)


def _register(module: ModuleType) -> None:
    base = importlib.import_module(BASE_MODULE)
    if not (contract.check(REGISTRIES[:4], module) and contract.check(REGISTRIES[4:], base)):
        return
    registry = module.RolloutReplicaRegistry
    known = getattr(registry, "_registry", {})
    if NAME not in known:
        registry.register(NAME, lambda: importlib.import_module(REPLICA_CLASS).TokenSpeedReplica)
    base._ROLLOUT_REGISTRY.setdefault((NAME, "async"), ADAPTER)
    _state["registered"] = True


def _uses_tokenspeed(trainer: Any) -> bool:
    try:
        return str(trainer.config.actor_rollout_ref.rollout.name) == NAME
    except Exception:
        return False


def _wrap_start(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(original)
    def _start_rollout_profiling(self: Any) -> Any:
        if _uses_tokenspeed(self):
            try:
                importlib.import_module(REPLICA_CLASS).set_profiled_step(int(self.global_steps))
            except Exception as exc:
                log.warning("[rl-trace-observer] tokenspeed profile step unknown: %s", exc)
        return original(self)

    return _start_rollout_profiling


def wait_for_profiles(timeout_s: float = END_WAIT_S) -> list[Any]:
    """Block until every live tokenspeed replica of this process registered its profile files."""
    module = importlib.import_module(REPLICA_CLASS)
    import ray

    refs = [s.wait_for_profiles.remote(timeout_s) for r in list(module.LIVE) for s in r.servers]
    return ray.get(refs, timeout=timeout_s + 30) if refs else []


def _wrap_fit(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        finally:
            if _uses_tokenspeed(self):
                try:
                    wait_for_profiles()
                except Exception as exc:
                    log.warning("[rl-trace-observer] waiting for tokenspeed profile files failed: %s", exc)

    return fit


def _install_trainer(package: ModuleType) -> None:
    base = importlib.import_module(TRAINER_MODULE + ".trainer_base")
    if not contract.check(PROFILE_STEP, base):
        return
    with _lock:
        if _state["trainer"] or not _state["requested"]:
            return
        cls = base.PPOTrainer
        _patches.apply(cls, "_start_rollout_profiling", _wrap_start(vars(cls)["_start_rollout_profiling"]))
        _patches.apply(cls, "fit", _wrap_fit(vars(cls)["fit"]))
        _state["trainer"] = True


def install(trainer_hooks: bool = True) -> bool:
    """Ask for the registration (now, or when VERL's rollout module loads). Never raises.

    ``trainer_hooks``: also hand the profiled step over and wait for profile files at the end of
    ``fit`` (only useful when this process captures: profile files need ``RL_TRACE_OUTPUT_DIR``).
    """
    with _lock:
        if _state["requested"]:
            return True
        _state["requested"] = True
    when_imported(REPLICA_MODULE, _register)
    if trainer_hooks:
        when_imported(TRAINER_MODULE, _install_trainer)
    return True


def uninstall() -> None:
    """Restore the trainer's methods (tests); the registry entries stay (VERL has no unregister)."""
    with _lock:
        _patches.revert_all()
        _state.update(requested=False, trainer=False)


def registered() -> bool:
    return bool(_state["registered"])
