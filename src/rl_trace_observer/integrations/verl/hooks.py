"""VERL hooks that need ``DistProfiler`` (actor VizTracer window). Imported only when asked for."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("rl_trace_observer")


def install_viztracer_window(cfg: Any) -> bool:
    """Placeholder until the reversible DistProfiler.start/stop wrapper lands (issue 6)."""
    log.warning("[rl-trace-observer] RL_TRACE_VIZTRACER=1 is not supported by this build yet; ignored")
    return False
