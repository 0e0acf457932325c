"""The ``rl_trace_observer`` RL-Insight monitor backend: RL-Insight events → our per-process JSONL.

Why we also take over the ``"ray"`` backend key: VERL's Ray workers call ``rl_insight.init()`` with
no arguments, so they always get RL-Insight's default backend (``"ray"``). Re-registering that key
through the public ``register_monitor_client`` with a factory that writes locally (and, when
``RL_TRACE_FORWARD_TO_RL_INSIGHT=1``, tees into the original Ray client) makes every VERL process
write through us without patching VERL or touching RL-Insight's private defaults. We only do that
while capture is on (``RL_TRACE_OUTPUT_DIR`` set), so merely installing this package never changes
RL-Insight's behaviour.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ...capture import get_recorder
from ...config import load as load_config

log = logging.getLogger("rl_trace_observer")

BACKEND_NAME = "rl_trace_observer"
LOCAL_URL = "local://rl-trace-observer"
DEFAULT_BACKEND = "ray"

Factory = Callable[[Any], Any]


class _WarnOnce:
    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, key: str, message: str, *args: Any) -> None:
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
        log.warning("[rl-trace-observer] " + message, *args)


warn_once = _WarnOnce()


def record_event(event: dict[str, Any]) -> None:
    """Write one RL-Insight event to this process's log; unknown kinds are ignored, never raised."""
    recorder = get_recorder()
    if recorder is None:
        return
    kind = event.get("kind")
    if kind == "trace":
        # RL-Insight builds a fresh attributes dict per event, so it is ours to keep as ``args``.
        recorder.rl_insight_span(
            str(event["name"]), int(event["start_time_ns"]), int(event["end_time_ns"]), event["attributes"]
        )
    elif kind in ("gauge", "counter", "histogram"):
        recorder.counter(
            str(event.get("name", "")),
            float(event.get("value", 0.0)),
            kind=kind,
            labels=dict(event.get("labels") or {}),
        )
    else:
        warn_once(f"kind:{kind}", "ignoring RL-Insight event of unknown kind %r", kind)


class TraceObserverClient:
    """RL-Insight ``MonitorClient``: writes locally, then optionally forwards to a delegate client.

    ``apply_event`` is called on training threads; it must never raise or block on the network.
    """

    def __init__(self, delegate: Any | None = None) -> None:
        self.delegate = delegate

    def apply_event(self, event: dict[str, Any]) -> None:
        try:
            recorder = get_recorder()
            if recorder is not None and event.get("kind") == "trace":  # the hot path, inlined
                recorder.rl_insight_span(
                    event["name"], event["start_time_ns"], event["end_time_ns"], event["attributes"]
                )
            else:
                record_event(event)
        except Exception as exc:
            warn_once("record", "could not record an RL-Insight event (%s); training continues", exc)
        if self.delegate is not None:
            try:
                self.delegate.apply_event(event)
            except Exception as exc:
                warn_once("forward", "forwarding to RL-Insight's Ray client failed (%s); not retried", exc)


def _make_delegate(original_factory: Factory | None, conf: Any) -> Any | None:
    if original_factory is None:
        warn_once("no-ray", "RL_TRACE_FORWARD_TO_RL_INSIGHT=1 but RL-Insight's Ray client is unavailable")
        return None
    try:
        return original_factory(conf)
    except Exception as exc:
        warn_once("delegate", "cannot create RL-Insight's Ray client for forwarding (%s)", exc)
        return None


def make_factory(original_ray_factory: Factory | None, *, as_default: bool) -> Factory:
    """A monitor-client factory bound to RL-Insight's original Ray factory (the forwarding target).

    ``as_default``: this factory answers for the ``"ray"`` key; with capture off it must behave
    exactly like the original so installing us changes nothing.
    """

    def factory(conf: Any) -> Any:
        cfg = load_config()
        if as_default and not cfg.capture_enabled:
            return original_ray_factory(conf) if original_ray_factory is not None else None
        if not cfg.capture_enabled:
            warn_once(
                "no-output",
                "RL-Insight backend %r selected but RL_TRACE_OUTPUT_DIR is not set; nothing is written",
                BACKEND_NAME,
            )
        delegate = _make_delegate(original_ray_factory, conf) if cfg.forward_to_rl_insight else None
        if not cfg.capture_enabled and delegate is None:
            return None
        return TraceObserverClient(delegate)

    factory.rl_trace_observer = True  # type: ignore[attr-defined]
    return factory
