"""Import target for ``VERL_USE_EXTERNAL_MODULES=rl_trace_observer.integrations.verl.register``.

Also the ``verl.plugins`` entry point, which VERL (>= 0.9) loads automatically in every process that
imports ``verl``. Importing this module registers the RL-Insight backend and nothing else unless
``RL_TRACE_VIZTRACER=1``; in particular ``DistProfiler`` is untouched. It never raises: VERL turns
an exception from a ``VERL_USE_EXTERNAL_MODULES`` module into a failed ``import verl``, and it hides
entry-point failures at debug level, so we log our own problems at WARNING/ERROR instead.
"""

from __future__ import annotations

import logging

log = logging.getLogger("rl_trace_observer")


def install() -> dict[str, bool]:
    """Install every VERL-side hook this environment asks for; returns what was installed."""
    installed = {"rl_insight_backend": False, "viztracer": False}
    try:
        from ..rl_insight import install as install_backend

        installed["rl_insight_backend"] = install_backend()
    except Exception as exc:
        log.error("[rl-trace-observer] RL-Insight backend not installed: %s", exc)
    try:
        from ...config import load

        cfg = load()
        from . import hooks

        installed.update(hooks.install_capture_hooks(cfg))  # step markers, torch traces (not DistProfiler)
        if cfg.viztracer:
            installed["viztracer"] = hooks.install_viztracer_window(cfg)
    except Exception as exc:
        log.error("[rl-trace-observer] VERL hooks not installed: %s", exc)
    try:
        from ...config import load as load_config
        from . import tokenspeed_rollout

        # rollout.name=tokenspeed is always available; its trainer hooks only when capture is on
        installed["tokenspeed_rollout"] = tokenspeed_rollout.install(load_config().capture_enabled)
    except Exception as exc:
        log.error("[rl-trace-observer] tokenspeed rollout not registered: %s", exc)
    return installed


INSTALLED = install()
