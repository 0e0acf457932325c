"""Import this in an AReaL process (its entry script, or ``python -m rl_trace_observer.integrations.areal``)
to install the AReaL anchor when ``RL_TRACE_AREAL=1``; it never raises."""

from __future__ import annotations

import logging

log = logging.getLogger("rl_trace_observer")


def install() -> bool:
    try:
        from ...config import load
        from . import anchor

        cfg = load()
        return anchor.install(cfg.areal and cfg.capture_enabled)
    except Exception as exc:
        log.error("[rl-trace-observer] AReaL anchor not installed: %s", exc)
        return False


INSTALLED = install()
