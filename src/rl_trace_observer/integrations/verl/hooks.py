"""The VERL hooks :mod:`.register` installs, each behind its own switch.

- RL-Insight spans need no hook here (the backend in ``integrations.rl_insight`` receives them).
- With capture on (``RL_TRACE_OUTPUT_DIR``): step markers (:mod:`.steps`) and torch-trace
  registration (:mod:`.torch_traces`); neither touches ``DistProfiler``.
- With ``RL_TRACE_VIZTRACER=1``: the actor VizTracer window (:mod:`.viztracer_window`), the only
  hook that wraps ``DistProfiler.start/stop``.
- With capture on and ``RL_TRACE_REQUESTS`` on (the default): rollout request spans
  (:mod:`.requests`, :mod:`.rollout_servers`), weight-sync phases (:mod:`.weight_sync`) and sample
  staleness (:mod:`.staleness`).

Every hook is installed lazily, when the VERL module it needs is imported, after checking its
surface (:mod:`.contract`). Importing this module imports no VERL, torch or Ray module.
"""

from __future__ import annotations

import logging
from typing import Any

from . import (
    contract,
    requests,
    rollout_servers,
    staleness,
    steps,
    torch_traces,
    viztracer_window,
    weight_sync,
)
from .import_hooks import when_imported

log = logging.getLogger("rl_trace_observer")


def install_viztracer_window(cfg: Any) -> bool:
    """Wrap ``DistProfiler.start/stop`` with the VizTracer window (``RL_TRACE_VIZTRACER=1``)."""
    return viztracer_window.install(cfg)


def _check_tracking(module: Any) -> None:
    contract.check(contract.RL_INSIGHT_SPANS, module)


def install_capture_hooks(cfg: Any) -> dict[str, bool]:
    """Step markers and torch-trace registration; only when this process captures."""
    if not cfg.capture_enabled:
        return {"step_markers": False, "torch_traces": False, "rollout_requests": False}
    contract.warn_if_untested()
    # Not patched, only checked: RL-Insight spans reach our backend through RLInsightLogger.trace_state.
    when_imported("verl.utils.tracking", _check_tracking)
    installed = {"step_markers": steps.install(), "torch_traces": torch_traces.install()}
    installed["rollout_requests"] = bool(getattr(cfg, "requests", True)) and _install_rollout_hooks()
    return installed


def _install_rollout_hooks() -> bool:
    """Requests (client and server), weight-sync phases and staleness: one switch, four surfaces."""
    done = [m.install() for m in (requests, rollout_servers, weight_sync, staleness)]
    return all(done)
