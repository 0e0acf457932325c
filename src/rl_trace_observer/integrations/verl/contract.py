"""The VERL names and signatures this integration relies on, checked when each is loaded.

VERL has no stable plugin API for what we hook, so every hook names its surface here. Before a
hook patches anything it calls :func:`check`; on a mismatch the feature stays off and ONE error
line names the installed VERL version and the missing surface. Nothing here raises into
``import verl``.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

log = logging.getLogger("rl_trace_observer")

TESTED_VERL = ("0.9.1",)


@dataclass(frozen=True)
class Surface:
    """One attribute path in one module, the parameters we pass to it and what needs it."""

    module: str
    path: str
    params: tuple[str, ...] = ()
    var_keyword: bool = False
    feature: str = ""

    @property
    def name(self) -> str:
        return f"{self.module}.{self.path}"


DIST_PROFILER = (
    Surface(
        "verl.utils.profiler.profile",
        "DistProfiler.__init__",
        ("rank", "save_file_prefix"),
        feature="the VizTracer window",
    ),
    Surface(
        "verl.utils.profiler.profile", "DistProfiler.start", var_keyword=True, feature="the VizTracer window"
    ),
    Surface(
        "verl.utils.profiler.profile", "DistProfiler.stop", ("run_command",), feature="the VizTracer window"
    ),
    Surface("verl.utils.profiler.profile", "DistProfiler.check_enable", feature="the VizTracer window"),
    Surface("verl.utils.profiler.profile", "DistProfiler.check_this_rank", feature="the VizTracer window"),
)
TRAINER = (
    Surface("verl.trainer.ppo.v1.trainer_base", "PPOTrainer._start_profiling", feature="step markers"),
    Surface("verl.trainer.ppo.v1.trainer_base", "PPOTrainer._stop_profiling", feature="step markers"),
    Surface(
        "verl.trainer.ppo.v1.trainer_base", "PPOTrainer.fit", ("agent_loop_manager",), feature="step markers"
    ),
    Surface("verl.trainer.ppo.v1.trainer_base", "TRAINER_REGISTRY", feature="step markers"),
)
TORCH_TOOL = (
    Surface(
        "verl.utils.profiler.torch_profile",
        "get_torch_profiler",
        ("contents", "save_path", "role", "save_file_prefix", "rank", "profile_step"),
        feature="torch trace registration",
    ),
)
ROLLOUT_TRACES = (
    Surface(
        "verl.utils.profiler.config",
        "relocate_rollout_traces",
        ("profiler_config", "rank", "world_size"),
        feature="rollout trace registration",
    ),
    Surface(
        "verl.utils.profiler.config",
        "rollout_trace_dir",
        ("profiler_config", "rank"),
        feature="rollout trace registration",
    ),
)
RL_INSIGHT_SPANS = (
    Surface(
        "verl.utils.tracking",
        "RLInsightLogger.trace_state",
        ("state_name", "state_lane_id"),
        feature="RL-Insight stage spans",
    ),
    Surface("verl.utils.tracking", "RLInsightLogger.enabled", feature="RL-Insight stage spans"),
)
REQUEST_CLIENT = (
    Surface(
        "verl.workers.rollout.llm_server",
        "LLMServerClient.generate",
        ("request_id",),
        var_keyword=True,
        feature="rollout request spans (client)",
    ),
    Surface(
        "verl.workers.rollout.llm_server",
        "LLMServerClient._release_server",
        ("server_id", "request_id"),
        feature="rollout request spans (client)",
    ),
    Surface(
        "verl.workers.rollout.llm_server",
        "LLMServerClient._vllm_request_id",
        ("request_id",),
        feature="rollout request spans (client)",
    ),
)
AGENT_LOOP = (
    Surface(
        "verl.experimental.agent_loop.agent_loop",
        "AgentLoopWorker._run_agent_loop",
        ("sampling_params", "trajectory"),
        var_keyword=True,
        feature="agent-loop sample identity",
    ),
)
WEIGHT_SYNC = (
    Surface("verl.utils.ray_utils", "auto_await", feature="weight-sync phases (trainer)"),
    *(
        Surface(
            "verl.checkpoint_engine.base",
            f"CheckpointEngineManager.{name}",
            feature="weight-sync phases (trainer)",
        )
        for name in (
            "update_weights",
            "abort_replicas",
            "release_kv_cache_replicas",
            "resume_kv_cache_replicas",
            "resume_generation_replicas",
            "sleep_replicas",
            "wake_up_replicas",
            "build_process_group",
        )
    ),
)
ADAPTERS = (
    Surface(
        "verl.workers.rollout.base",
        "BaseRollout.update_weights",
        ("weights",),
        var_keyword=True,
        feature="weight-sync phases (replica)",
    ),
    Surface(
        "verl.workers.rollout.base", "BaseRollout.resume", ("tags",), feature="weight-sync phases (replica)"
    ),
    Surface("verl.workers.rollout.base", "BaseRollout.release", feature="weight-sync phases (replica)"),
)
STALENESS = (
    Surface(
        "verl.trainer.ppo.v1.replay_buffer",
        "ReplayBuffer.sample",
        ("global_steps", "partition_id", "batch_size"),
        feature="sample staleness",
    ),
    Surface(
        "verl.trainer.ppo.v1.replay_buffer",
        "ReplayBufferAsync.sample",
        ("global_steps", "partition_id", "batch_size"),
        feature="sample staleness",
    ),
)
ALL = (
    DIST_PROFILER
    + TRAINER
    + TORCH_TOOL
    + ROLLOUT_TRACES
    + RL_INSIGHT_SPANS
    + REQUEST_CLIENT
    + AGENT_LOOP
    + WEIGHT_SYNC
    + ADAPTERS
    + STALENESS
)

_reported: set[str] = set()
_lock = threading.Lock()


def verl_version() -> str:
    try:
        from importlib.metadata import version

        return version("verl")
    except Exception:
        return "unknown"


def _resolve(module: ModuleType, path: str) -> Any:
    obj: Any = module
    for part in path.split("."):
        obj = inspect.getattr_static(obj, part) if isinstance(obj, type) else getattr(obj, part)
    return obj.__func__ if isinstance(obj, classmethod | staticmethod) else obj


def problem(surface: Surface, module: ModuleType | None = None) -> str | None:
    """None when ``surface`` is usable; else what is wrong with it, in a few words."""
    try:
        mod = module if module is not None else importlib.import_module(surface.module)
    except Exception as exc:
        return f"cannot import {surface.module} ({exc.__class__.__name__}: {exc})"
    try:
        obj = _resolve(mod, surface.path)
    except AttributeError:
        return "missing"
    if not surface.params and not surface.var_keyword:
        return None if obj is not None else "missing"
    if not callable(obj):
        return "not callable"
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return None  # builtins without a signature: trust the name
    missing = [p for p in surface.params if p not in params]
    if missing:
        return f"has no parameter {', '.join(missing)}"
    if surface.var_keyword and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return "does not accept **kwargs"
    return None


def check(surfaces: tuple[Surface, ...], module: ModuleType | None = None) -> bool:
    """True when every surface is usable; otherwise log one error (once per feature) and say False."""
    bad = [(s, p) for s in surfaces if (p := problem(s, module)) is not None]
    if not bad:
        return True
    feature = surfaces[0].feature
    with _lock:
        if feature in _reported:
            return False
        _reported.add(feature)
    details = "; ".join(f"{s.name}: {p}" for s, p in bad)
    log.error(
        "[rl-trace-observer] verl %s does not have the surface %s relies on (%s); %s is off. "
        "Tested with verl %s.",
        verl_version(),
        feature,
        details,
        feature,
        ", ".join(TESTED_VERL),
    )
    return False


def check_all() -> list[str]:
    """Every surface, importing what is needed (for ``rl-trace doctor`` and tests): problems as lines."""
    return [f"verl {verl_version()}: {s.name} {p}" for s in ALL if (p := problem(s)) is not None]


def warn_if_untested() -> None:
    version = verl_version()
    if version not in TESTED_VERL and version != "unknown":
        log.warning(
            "[rl-trace-observer] verl %s is not a tested version (%s); hooks check their surfaces first",
            version,
            ", ".join(TESTED_VERL),
        )


def reset_reports() -> None:
    """Forget which features already reported a mismatch (tests)."""
    with _lock:
        _reported.clear()
