"""Tell a real RL-Insight server about the watch's ``/metrics``, so its own Prometheus scrapes it
and its Grafana shows the watch's series beside its panels.

Through RL-Insight's own client, ``rl_insight.update_prometheus_config`` (it POSTs to
``$RL_INSIGHT_SERVER_URL/api/v1/prometheus/targets``; the server writes its ``file_sd`` file and
reloads Prometheus). Only for a real server URL (``http://``/``https://``): the zero-patch setting
``local://rl-trace-observer`` names no server. The target is ``127.0.0.1:PORT`` — the watch answers
loopback only, so that Prometheus must run on this machine (RL-Insight's local stack does).
"""

from __future__ import annotations

import os

JOB = "rl_trace_watch"


def rl_insight_server_url() -> str | None:
    url = os.environ.get("RL_INSIGHT_SERVER_URL", "").strip().rstrip("/")
    return url if url.startswith(("http://", "https://")) else None


def register_watch_endpoint(port: int, run: str) -> str | None:
    """Register ``127.0.0.1:port`` with the configured RL-Insight server; returns what happened in
    one line, or None when no real server is configured."""
    url = rl_insight_server_url()
    if url is None:
        return None
    try:
        import rl_insight
    except ImportError:
        return f"RL_INSIGHT_SERVER_URL={url} but rl_insight is not installed: the watch was not registered"
    try:
        rl_insight.update_prometheus_config([f"127.0.0.1:{port}"], JOB, [{"run": run}])
    except Exception as exc:  # its own errors are logged by it; ours must not stop the watch
        return f"registering the watch with {url} failed ({type(exc).__name__}: {exc})"
    return f"registered 127.0.0.1:{port} (job {JOB}) with the RL-Insight server at {url}"
