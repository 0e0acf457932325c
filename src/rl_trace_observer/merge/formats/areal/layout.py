"""Where AReaL puts its files, and what the path says: rank, role and the run they belong to.

``perf_tracer.py`` (areal 1.0.4) writes under ``<fileroot>/logs/<user>/<experiment>/<trial>/``:

- ``perf_tracer[/<role>]/traces-r<rank>.jsonl``: the perf trace of one process;
- ``session_tracer[/<role>]/sessions-r<rank>.jsonl``: the sessions of that same process.

So a perf trace and its session file share the trial folder, the role folder and the rank: that is
how a session file (which names no pid) finds its process, and a perf trace its sessions.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

PERF_DIR = "perf_tracer"
SESSION_DIR = "session_tracer"
PERF_NAME = re.compile(r"^traces-r(\d{1,9})\.jsonl$")
SESSION_NAME = re.compile(r"^sessions-r(\d{1,9})\.jsonl$")


@dataclass(frozen=True)
class Place:
    rank: int | None
    role: str | None
    trial: str  # the folder above perf_tracer/ and session_tracer/ (the file's folder when renamed)

    @property
    def key(self) -> tuple[str, str | None, int | None]:
        """What a perf trace and its session file have in common."""
        return (self.trial, self.role, self.rank)


def place_of(path: str, name: re.Pattern[str], tool_dir: str) -> Place:
    """The rank, role and trial folder a path states (role None: no role folder)."""
    folder, base = posixpath.split(path)
    m = name.match(base)
    rank = int(m.group(1)) if m else None
    parent, leaf = posixpath.split(folder)
    if leaf == tool_dir:
        return Place(rank, None, parent)
    grand, tool = posixpath.split(parent)
    if tool == tool_dir:
        return Place(rank, leaf, grand)
    return Place(rank, None, folder)


def perf_place(path: str) -> Place:
    return place_of(path, PERF_NAME, PERF_DIR)


def session_place(path: str) -> Place:
    return place_of(path, SESSION_NAME, SESSION_DIR)
