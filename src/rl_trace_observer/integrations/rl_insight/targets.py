"""Prometheus targets registered through ``rl_insight.update_prometheus_config``: kept, not lost.

VERL registers each rollout replica's metrics endpoint (``RLInsightLogger.register_rollout_metrics``)
and TransferQueue's (``register_transfer_queue_metrics``) by calling
``rl_insight.update_prometheus_config(addresses, job_name, labels)``, which POSTs them to
``$RL_INSIGHT_SERVER_URL/api/v1/prometheus/targets``. With the zero-patch setting
``local://rl-trace-observer`` that POST cannot work: every registering process logs "Failed to
register Prometheus targets … No connection adapters were found" and the endpoints are gone.

RL-Insight has no registry for this call (unlike monitor clients), so while capture is on we put
our own function in its place on the module that callers reach (``rl_insight`` — VERL looks the
name up there on every call — and ``rl_insight.utils``/``.prometheus_utils``, for code that
imported it by name before). Ours records every target in the registering process's record
(``metrics_targets``: job, ``host:port``, labels, who registered it) and hands it to the node's
metric sampler. Then, unless ``RL_INSIGHT_SERVER_URL`` is a ``local://`` URL (the zero-patch mode,
where no server exists), it calls RL-Insight's own function, which POSTs as it always did: a real
server keeps getting its targets whatever ``RL_TRACE_FORWARD_TO_RL_INSIGHT`` says (RL-Insight's own
test suite runs unchanged with capture on). With capture off ours calls the original and does
nothing else.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...capture import get_recorder
from ...capture.sampler import node as sampler_node
from ...config import load as load_config
from .backend import LOCAL_URL, warn_once

log = logging.getLogger("rl_trace_observer")

NAME = "update_prometheus_config"
MODULES = ("rl_insight", "rl_insight.utils", "rl_insight.utils.prometheus_utils")
DEFAULT_JOB = "trainer_metrics"  # RL-Insight's PrometheusScrape.TRAINER_METRICS_JOB, when unnamed
_MARK = "__rl_trace_observer__"

_lock = threading.Lock()
_state: dict[str, Any] = {"original": None, "replaced": []}


def _default_job() -> str:
    try:
        constants = importlib.import_module("rl_insight.utils.constants")
        return str(constants.PrometheusScrape.TRAINER_METRICS_JOB)
    except Exception:
        return DEFAULT_JOB


def target_entries(
    server_addresses: Sequence[Any], job_name: str | None, labels: Sequence[Mapping[str, Any] | None] | None
) -> list[dict[str, Any]]:
    """One entry per address, labels as RL-Insight sends them (string keys and values)."""
    job = job_name or _default_job()
    per_target = list(labels) if labels is not None else [None] * len(server_addresses)
    rec = get_recorder()
    who = {
        "host": rec.host if rec else None,
        "pid": os.getpid(),
        "role": rec.record().get("role") if rec else None,
    }
    now = time.time_ns()
    return [
        {
            "job": str(job),
            "address": str(address),
            "labels": {str(k): str(v) for k, v in (lab or {}).items()},
            "registered_by": who,
            "registered_wall_ns": now,
        }
        for address, lab in zip(server_addresses, per_target, strict=True)
    ]


def record_targets(entries: list[dict[str, Any]]) -> None:
    """Into this process's record and to the node's sampler; problems are logged once, never raised."""
    rec = get_recorder()
    if rec is None:
        return
    try:
        with _lock:
            known = list(rec.record().get("metrics_targets") or [])
            keys = {(t.get("job"), t.get("address")) for t in known}
            fresh = [t for t in entries if (t["job"], t["address"]) not in keys]
            if fresh:
                rec.update_identity(metrics_targets=known + fresh)
    except Exception as exc:
        warn_once("targets-record", "cannot record Prometheus targets (%s)", exc)
        return
    if not fresh or not rec.config.metrics:
        return
    try:
        sampler_node.publish_targets(fresh)
    except Exception as exc:
        warn_once("targets-publish", "cannot hand Prometheus targets to the metric sampler (%s)", exc)


def _local_mode() -> bool:
    """``RL_INSIGHT_SERVER_URL`` names no server (``local://...``): the one case RL-Insight's POST is
    skipped (it could only fail). Any other value, empty included, goes to RL-Insight's function."""
    url = os.environ.get("RL_INSIGHT_SERVER_URL", "").strip()
    return url.startswith("local://") or url.rstrip("/") == LOCAL_URL


def make_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def update_prometheus_config(
        server_addresses: list[str],
        job_name: str | None = None,
        labels: list[Mapping[str, Any] | None] | None = None,
        *more: Any,
        **named: Any,
    ) -> None:
        # ``more``/``named``: what a later RL-Insight adds (its main branch has ``project=`` and
        # ``experiment_name=``) goes to its own function unchanged, never a TypeError of ours
        cfg = load_config()
        if not cfg.capture_enabled or not server_addresses:
            return original(
                server_addresses, job_name, labels, *more, **named
            )  # its own warning for no address
        if labels is not None and len(labels) != len(server_addresses):
            return original(
                server_addresses, job_name, labels, *more, **named
            )  # its own ValueError, as before
        try:
            record_targets(target_entries(server_addresses, job_name, labels))
        except Exception as exc:
            warn_once("targets", "cannot record Prometheus targets (%s)", exc)
        if not _local_mode():
            return original(
                server_addresses, job_name, labels, *more, **named
            )  # a real server: POSTed as before
        if cfg.forward_to_rl_insight:
            warn_once(
                "targets-forward",
                "RL_TRACE_FORWARD_TO_RL_INSIGHT=1 but RL_INSIGHT_SERVER_URL is not an RL-Insight "
                "server; Prometheus targets are recorded locally only",
            )
        return None

    setattr(update_prometheus_config, _MARK, True)
    return update_prometheus_config


def install() -> bool:
    """Put the wrapper in place on every module that exposes the function; idempotent."""
    with _lock:
        if _state["original"] is not None:
            return True
        try:
            utils = importlib.import_module("rl_insight.utils.prometheus_utils")
        except Exception as exc:
            log.error("[rl-trace-observer] Prometheus targets are not recorded: %s", exc)
            return False
        original = getattr(utils, NAME, None)
        if original is None or getattr(original, _MARK, False):
            return original is not None
        wrapper = make_wrapper(original)
        replaced = []
        for name in MODULES:
            module = importlib.import_module(name)
            if name == "rl_insight" or getattr(module, NAME, None) is original:
                replaced.append((module, module.__dict__.get(NAME)))
                setattr(module, NAME, wrapper)
        _state.update(original=original, replaced=replaced)
        return True


def uninstall() -> None:
    """Restore RL-Insight's function (tests)."""
    with _lock:
        for module, before in _state["replaced"]:
            if before is None:
                module.__dict__.pop(NAME, None)  # rl_insight's lazy __getattr__ finds it again
            else:
                setattr(module, NAME, before)
        _state.update(original=None, replaced=[])
