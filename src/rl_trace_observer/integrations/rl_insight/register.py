"""Import target for a plain RL-Insight user (no VERL).

``import rl_trace_observer.integrations.rl_insight.register`` before ``rl_insight.init()``.

RL-Insight has no plugin discovery: a monitor backend exists only once some module registered it.
Inside VERL our ``verl.plugins`` entry point does that in every process; anywhere else, importing
this module before ``rl_insight.init()`` does (``python -m rl_trace_observer.integrations.rl_insight
SCRIPT`` imports it for you). With ``RL_TRACE_OUTPUT_DIR`` unset it changes nothing. It never raises.
"""

from __future__ import annotations

import logging

log = logging.getLogger("rl_trace_observer")


def register() -> bool:
    """Register the backend (idempotent); warn once when ``rl_insight.init()`` already ran without us."""
    try:
        from . import install

        installed = install()
    except Exception as exc:  # pragma: no cover - defensive: the importing program must go on
        log.error("[rl-trace-observer] RL-Insight backend not installed: %s", exc)
        return False
    if installed:
        _warn_if_initialised_before()
    return installed


def _warn_if_initialised_before() -> None:
    """``init()`` before this import chose RL-Insight's own backend (or none), for good: say so."""
    try:
        from rl_insight import api  # the state lives in a private attribute: a diagnostic only

        from ...config import load
        from .backend import TraceObserverClient

        state = getattr(api, "_STATE", None)
        initialised = getattr(state, "conf", None) is not None  # set by init(), even with no client
        ours = isinstance(getattr(state, "client", None), TraceObserverClient)
        if load().capture_enabled and initialised and not ours:
            log.warning(
                "[rl-trace-observer] rl_insight.init() ran before rl_trace_observer was registered, "
                "so this process writes nothing: import rl_trace_observer.integrations.rl_insight.register "
                "first"
            )
    except Exception:
        pass


INSTALLED = register()
