"""One look at one node's output directory, run ON that node (``rl-trace watch --ray``).

A small pinned task (``integrations.ray.collect.on_each_node``) calls :func:`follow_node` with the
offsets the driver keeps for that node: it reads only the bytes appended since (:mod:`.follow`),
learns what they say (:mod:`.seen`: step markers, bad lines, how far events reach, the byte runs a
later merge may skip) and returns only those small facts — never a trace byte. The driver folds
them into that node's :class:`.seen.Seen` (:func:`fold`). No Ray import: it is plain data in, plain
data out, and is unit-tested without a cluster.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from .anchors import RecordAnchors
from .follow import FileMark, Follower
from .profiler_markers import changed_profiles
from .seen import NAMED_BAD, Seen, markers_from, markers_json


def follow_node(
    root: str, marks: dict[str, dict[str, int]], waiting: dict[str, list[Any]], profiles: bool = False
) -> dict[str, Any]:
    """Read what was appended under ``root`` since ``marks``; the new facts (see :func:`fold`).
    ``profiles``: no node has shown an event log yet, so the profiler traces that changed are
    searched for step markers (``profiled``: file -> markers, ``[]`` for none)."""
    real = os.path.realpath(root)
    out: dict[str, Any] = {"root": real, "host": socket.gethostname(), "exists": os.path.isdir(real)}
    if not out["exists"]:
        facts = Seen().to_json()
        return {**out, "marks": marks, "facts": facts, "reset": [], "waiting": waiting, "profiled": {}}
    follower = Follower(Path(real), {k: FileMark.from_json(v) for k, v in marks.items()})
    seen = Seen()
    seen.waiting = {k: list(v) for k, v in waiting.items()}
    reset: set[str] = set()

    def line(rel: str, number: int, raw: bytes, offset: int) -> None:
        if offset == 0:  # the file is new or started anew: what the driver knows of its runs is void
            reset.add(rel)
        seen.line(rel, number, raw, offset)

    try:
        changed = follower.poll(line)
    finally:
        follower.close()  # a node's look is one call: nothing stays open between looks
    # every changed trace, ``[]`` too: the driver drops the markers a trace no longer has
    profiled: dict[str, list[list[Any]]] = {}
    if profiles and not seen.logs:
        profiled = {rel: markers_json(list(m)) for rel, m in changed_profiles(real, changed)}
    if seen.waiting:  # AReaL's relative-time markers: anchored by the node's process records
        seen.place(RecordAnchors(Path(real)).look())
    facts = seen.to_json()
    facts.pop("waiting")
    return {
        **out,
        "marks": {k: m.to_json() for k, m in follower.marks.items()},
        "facts": facts,
        "reset": sorted(reset),
        "waiting": seen.waiting,
        "profiled": profiled,
    }


def fold(known: Seen, got: dict[str, Any]) -> bool:
    """Add a node's answer to what the driver knows of that node; True if anything new was read."""
    new = Seen.from_json(got["facts"])
    for rel in got["reset"]:
        known.runs.pop(rel, None)
    for rel, runs in new.runs.items():
        known.runs.setdefault(rel, []).extend(runs)
    for rel, entry in new.bad.items():
        mine = known.bad.setdefault(rel, {"count": 0, "lines": []})
        mine["count"] += int(entry["count"])
        mine["lines"] = (mine["lines"] + list(entry["lines"]))[:NAMED_BAD]
    known.markers += new.markers
    known.logs = known.logs or new.logs
    profiled = False
    for rel, rows in got.get("profiled", {}).items():
        profiled = known.profile(rel, tuple(markers_from(rows))) or profiled
    known.lines += new.lines
    known.last_ts_ns = max(known.last_ts_ns, new.last_ts_ns)
    placed = len(known.waiting) != len(got["waiting"])
    known.waiting = {str(k): list(v) for k, v in got["waiting"].items()}
    return bool(new.lines or new.markers or placed or profiled)
