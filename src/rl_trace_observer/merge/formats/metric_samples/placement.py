"""Where each sampled source's counter tracks go in the merged trace (pure, from the file alone).

- An engine (or any Prometheus target) that the sampler found listening on its own node: under
  that OS process (the replica's server), as the sampler's ``server`` line says.
- TransferQueue (job ``transfer_queue`` or ``tq_*`` families): a process of its own, ``TransferQueue``.
- Any other target: a process of its own named by its job and replica label (or address).
- A GPU: under ``GPU <k>`` of every process that had a CUDA context on it (``gpu_users``: pid and
  that process's CUDA index through its ``CUDA_VISIBLE_DEVICES``) — the same ``GPU <k>`` process
  that process's Kineto trace fills; a GPU nobody used goes under ``GPU <n>`` of the sampler
  process (NVML's numbering).
- The host: one process per host, ``Host``; a node_exporter on the sampler's node draws there too,
  in place of our psutil tracks of the same quantities (``hardware.py``).
- Ascend's NPU exporter: one process per device, ``NPU <id>`` (``hardware.py``).

A place is what a reader's ``process_of`` returns: an ``int`` OS pid on the sampler's host, a
``str`` naming a process of its own beside the sampler, or ``(pid, "GPU k")``.
"""

from __future__ import annotations

from typing import Any

from . import hardware
from .decode import SamplesFile, SourceDef

Place = int | str | tuple[int, str]
HOST = "Host"
TRANSFER_QUEUE = "TransferQueue"


def _server_pids(file: SamplesFile) -> dict[int, int]:
    return {int(e["src"]): int(e["pid"]) for e in file.events if e.get("k") == "server" and e.get("pid")}


def _gpu_users(file: SamplesFile) -> dict[int, list[tuple[int, int]]]:
    """Every (pid, CUDA index) seen on each GPU source over the file, in order of appearance."""
    out: dict[int, list[tuple[int, int]]] = {}
    for e in file.events:
        if e.get("k") != "gpu_users":
            continue
        seen = out.setdefault(int(e["src"]), [])
        for pid, index in e.get("users") or []:
            if (int(pid), int(index)) not in seen:
                seen.append((int(pid), int(index)))
    return out


def _is_transfer_queue(file: SamplesFile, source: SourceDef) -> bool:
    if str(source.fields.get("job", "")).lower() in ("transfer_queue", "transferqueue"):
        return True
    return any(s.src == source.src and s.family.startswith("tq_") for s in file.series.values())


def _is_local(source: SourceDef) -> bool:
    host = str(source.fields.get("address", "")).rpartition(":")[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def target_title(source: SourceDef) -> str:
    fields: dict[str, Any] = source.fields
    job = str(fields.get("job") or "metrics")
    labels = fields.get("labels") or {}
    if "replica" in labels:
        return f"{job} replica {labels['replica']}"
    return f"{job} {fields.get('address', '')}".strip()


def places(file: SamplesFile) -> dict[int, list[Place]]:
    """Source id → the places its tracks are written to (a GPU may have several users)."""
    servers, users = _server_pids(file), _gpu_users(file)
    out: dict[int, list[Place]] = {}
    for src, source in file.sources.items():
        if source.kind == "host":
            out[src] = [HOST]
        elif source.kind == "gpu":
            index = int(source.fields.get("index") or 0)
            on = users.get(src) or []
            out[src] = [(pid, f"GPU {k}") for pid, k in on] or [f"GPU {index}"]
        elif hardware.is_npu_exporter(file, source):
            out[src] = []  # one ``NPU <id>`` process per device: hardware.npu_tracks places them
        elif hardware.is_node_exporter(file, source) and (src in servers or _is_local(source)):
            out[src] = [HOST]  # the host's source of truth (hardware.py)
        elif _is_transfer_queue(file, source):
            out[src] = [TRANSFER_QUEUE]
        elif src in servers:
            out[src] = [servers[src]]
        else:
            out[src] = [target_title(source)]
    return out
