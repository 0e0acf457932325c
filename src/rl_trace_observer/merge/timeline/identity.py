"""Merged pids and tids: every number fits Perfetto's space and means one thing.

- A planned OS process (known before reading, from process records and file heads) gets
  ``(index + 1) << 8``, with ``index`` its place in the natural order (trainer, actor ranks,
  rollout replicas, ...): the merged pid doubles as the sort index.
- Its sub-processes (Kineto GPU devices, Proton's pid 0, Kineto's "Spans") take the low 8 bits, so
  they sort right after their owner and two artifacts of one process agree on them without talking.
- An OS process first met inside a file (a VizTracer child, say, or Kineto's ``pid -1`` events) gets a
  hash in ``[2**30, 2**31)``. Every pid stays below 2**31: ``.pftrace`` descriptors hold pids as int32
  and the JSON importer as uint32, so a larger pid split one process in two in ``.pftrace`` (an unnamed
  one with the negative pid beside the named one) while the JSON output showed it once.
- A thread is ``(source << 28) | lane``: per process, each source has its own tracks (Torch's and
  VizTracer's view of one OS thread must not share a track: their slices overlap partially).

All of it is a pure function of (host, pid, source, lane), so parallel workers need no coordination.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import Any

from .model import ProcessKey

PLANNED_LIMIT = (1 << 22) - 1  # planned pids stay below the hashed ones
_FALLBACK_BIT = 1 << 30
_LANE_BITS = 28
_DEVICE = re.compile(r"^(?:GPU|NPU|XPU|HPU|MTIA|Device|device)\D*(\d+)")
_FIXED_SLOTS = {"Spans": 130, "Traces": 131, "Kineto": 132}


def planned_pid(index: int) -> int:
    if not 0 <= index < PLANNED_LIMIT:
        raise ValueError(f"too many processes to merge ({index})")
    return (index + 1) << 8


def fallback_pid(key: ProcessKey) -> int:
    """A process the planner did not know: hashed into ``[2**30, 2**31)`` (see the module docstring)."""
    return _FALLBACK_BIT | ((zlib.crc32(str(key).encode()) & 0x3FFFFF) << 8)


def sub_slot(label: str) -> int:
    """Where a sub-process sits under its owner (1-255): devices by index, then fixed names."""
    m = _DEVICE.match(label)
    if m and int(m.group(1)) < 100:
        return 1 + int(m.group(1))
    if label == "Proton":
        return 110
    if label.startswith("Proton "):
        return 111 + zlib.crc32(label.encode()) % 18
    if label in _FIXED_SLOTS:
        return _FIXED_SLOTS[label]
    return 140 + zlib.crc32(label.encode()) % 115


def lane_int(lane: Any) -> int:
    if isinstance(lane, int) and not isinstance(lane, bool) and 0 <= lane < (1 << _LANE_BITS):
        return lane
    return zlib.crc32(str(lane).encode()) & ((1 << _LANE_BITS) - 1)


def same_thread(tid: Any) -> Any:
    """A thread id as the OS numbers it: ``"24572"`` is thread 24572. PyTorch profilers of 2021
    (torch 1.8-1.9) write their CPU slices' tids as text and their flow starts' as numbers; read as
    two threads, no launch arrow finds its runtime call."""
    if type(tid) is str and tid.isascii() and tid.isdigit() and len(tid) <= 10 and int(tid) < 1 << 32:
        return int(tid)
    return tid


def merged_tid(source_order: int, lane: Any) -> int:
    return ((source_order & 0xF) << _LANE_BITS) | lane_int(lane)


def overlap_tid(tid: int, level: int) -> int:
    """The track beside merged thread ``tid`` that holds its ``level``-th layer of slices overlapping
    the ones before (1, 2, ...): same source bits, lane hashed from (tid, level), so every worker and
    every artifact of one process agrees on it without talking."""
    lane = zlib.crc32(f"{tid}/overlap/{level}".encode()) & ((1 << _LANE_BITS) - 1)
    return (tid & ~((1 << _LANE_BITS) - 1)) | lane


def overlap_name(name: str, level: int) -> str:
    """``Torch · stream 7`` → ``Torch · stream 7 (overlap)``, ``(overlap 2)`` for a second layer."""
    return f"{name} (overlap)" if level == 1 else f"{name} (overlap {level})"


@dataclass(frozen=True)
class ProcessDecl:
    """A merged process as a worker met it; the parent names it (or knew it already)."""

    merged_pid: int
    key: ProcessKey | None  # the OS process, or the owner of a sub-process
    sub: str | None = None  # "GPU 0", "Proton", ... for sub-processes
    source_name: str | None = None  # what the source called it (Kineto "python", Proton "Trace")
    role: str | None = None  # the role its file states for it (an OTLP resource's): an unplanned title's


@dataclass(frozen=True)
class ThreadDecl:
    merged_pid: int
    merged_tid: int
    name: str  # "<Source> · <lane>"
    sort_index: int


def process_title(decl: ProcessDecl, known: dict[int, str]) -> str:
    """The name Perfetto shows: a planned process's label, its sub-processes under it."""
    if decl.sub is None:
        if decl.merged_pid in known:
            return known[decl.merged_pid]
        key = decl.key
        if key is None:
            return f"process {decl.merged_pid}"
        return f"{key.host} · pid {key.pid} · {decl.role}" if decl.role else f"{key.host} · pid {key.pid}"
    owner = known.get(decl.merged_pid & ~0xFF)
    if owner is None and decl.key is not None:
        owner = f"{decl.key.host} · pid {decl.key.pid}"
    return f"{owner} · {decl.sub}" if owner else decl.sub
