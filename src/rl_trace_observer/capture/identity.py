"""Who this process is: host, pid, rank, Ray ids, library versions — without importing any framework.

Ray and torch are only consulted when the training code has already imported them (``sys.modules``),
so the capture core never pulls a framework in and never slows a process that does not use one.
"""

from __future__ import annotations

import os
import socket
import sys
from importlib import metadata
from typing import Any

TRACKED_DISTRIBUTIONS = ("rl-insight", "verl", "torch", "ray", "viztracer", "rl-trace-observer")


def hostname() -> str:
    """Short, filename-safe host name (Ray node names and file names must agree)."""
    name = socket.gethostname() or "localhost"
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for dist in TRACKED_DISTRIBUTIONS:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
        except Exception:  # a broken install must not break capture
            out[dist] = None
    return out


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw.lstrip("-").isdigit() else None


def distributed() -> dict[str, int | None]:
    """Rank and world size: torch.distributed when initialised, else the launcher's env vars."""
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    return {"rank": rank, "world_size": world, "local_rank": _env_int("LOCAL_RANK")}


def ray_ids() -> dict[str, Any]:
    """Ray job/node/actor ids and actor name, when this process runs inside an initialised Ray."""
    ray = sys.modules.get("ray")
    if ray is None:
        return {}
    try:
        if not ray.is_initialized():
            return {}
        ctx = ray.get_runtime_context()
        out: dict[str, Any] = {
            "job_id": ctx.get_job_id(),
            "node_id": ctx.get_node_id(),
            "worker_id": ctx.get_worker_id(),
        }
        actor_id = ctx.get_actor_id()
        if actor_id:
            out["actor_id"] = actor_id
            try:
                out["actor_name"] = ctx.get_actor_name() or None
            except Exception:
                out["actor_name"] = None
        try:
            out["node_ip"] = ray.util.get_node_ip_address()
        except Exception:
            pass
        return out
    except Exception:
        return {}
