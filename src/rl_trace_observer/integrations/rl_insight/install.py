"""Register our backend with the installed RL-Insight, after checking the surface we rely on.

Tested with rl-insight 0.2.x and 0.3.0 (``SUPPORTED``). A missing or incompatible RL-Insight is one
clear error in the log and a ``False`` return: the caller (often ``import verl``) must go on.
"""

from __future__ import annotations

import importlib
import logging
import threading
from typing import Any

from ...config import load as load_config
from ...config import warn_problems
from . import targets
from .backend import BACKEND_NAME, DEFAULT_BACKEND, make_factory

log = logging.getLogger("rl_trace_observer")

SUPPORTED = ">=0.2,<0.4"
_REQUIRED = {
    "rl_insight": ("init", "trace_state", "metric_gauge", "finish"),
    "rl_insight.client.base": ("register_monitor_client", "MONITOR_CLIENT_REGISTRY", "MonitorClient"),
}

_lock = threading.Lock()
_state: dict[str, Any] = {"installed": False, "original_ray": None, "error": None}


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("rl-insight")
    except Exception:
        return "unknown"


def _in_supported_range(version: str) -> bool:
    try:
        parts = tuple(int(p) for p in version.split(".")[:2])
    except ValueError:
        return False
    return (0, 2) <= parts < (0, 4)


def check_compatibility() -> str | None:
    """None when usable; else one line naming the installed version and the missing surface."""
    version = _version()
    for module_name, names in _REQUIRED.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            return f"rl-insight {version} cannot be imported ({exc}); install rl-insight{SUPPORTED}"
        missing = [n for n in names if not hasattr(module, n)]
        if missing:
            return (
                f"rl-insight {version} lacks {module_name}.{', '.join(missing)}; "
                f"rl-trace-observer supports rl-insight{SUPPORTED}"
            )
    if not _in_supported_range(version):
        log.warning(
            "[rl-trace-observer] rl-insight %s is outside the tested range %s; continuing",
            version,
            SUPPORTED,
        )
    return None


def install() -> bool:
    """Register ``rl_trace_observer`` and wrap the default ``ray`` key. Idempotent, never raises."""
    with _lock:
        if _state["installed"]:
            return True
        try:  # a setting that turns capture off (a relative RL_TRACE_OUTPUT_DIR) is said here, once
            warn_problems(load_config())
        except Exception:  # pragma: no cover - defensive
            pass
        try:
            problem = check_compatibility()
            if problem is not None:
                _state["error"] = problem
                log.error("[rl-trace-observer] %s", problem)
                return False
            # Importing rl_insight.client registers RL-Insight's own "ray" factory; do it first so
            # ours is the last registration and nothing re-registers the original afterwards.
            importlib.import_module("rl_insight.client")
            base = importlib.import_module("rl_insight.client.base")
            registry = base.MONITOR_CLIENT_REGISTRY
            original = registry.get(DEFAULT_BACKEND)
            if getattr(original, "rl_trace_observer", False):  # already wrapped (module reloaded)
                original = _state["original_ray"]
            _state["original_ray"] = original
            base.register_monitor_client(BACKEND_NAME, make_factory(original, as_default=False))
            base.register_monitor_client(DEFAULT_BACKEND, make_factory(original, as_default=True))
            _state["installed"] = True
        except Exception as exc:  # pragma: no cover - defensive: never break the importing process
            _state["error"] = str(exc)
            log.error("[rl-trace-observer] could not register the RL-Insight backend: %s", exc)
            return False
        try:
            targets.install()  # Prometheus targets: recorded, never POSTed to local://
        except Exception as exc:  # pragma: no cover - defensive
            log.error("[rl-trace-observer] Prometheus targets are not recorded: %s", exc)
        return True


def uninstall() -> None:
    """Restore RL-Insight's registry as it was (tests)."""
    with _lock:
        if not _state["installed"]:
            return
        targets.uninstall()
        base = importlib.import_module("rl_insight.client.base")
        base.MONITOR_CLIENT_REGISTRY.pop(BACKEND_NAME, None)
        if _state["original_ray"] is not None:
            base.MONITOR_CLIENT_REGISTRY[DEFAULT_BACKEND] = _state["original_ray"]
        _state["installed"] = False
