"""Which files a TokenSpeed profile window leaves, and when each one is complete.

TokenSpeed 0.1.1 writes, per scheduler rank, ``{profile_id}-[DP{d}-]TP{t}`` + a suffix per activity
(``ts:runtime/engine/request_handler.py``). Behind ``ts serve`` the ``profile_id`` we could send is
dropped (gateway and gRPC have no such field), so the id is a local ``%Y%m%d-%H%M%S`` timestamp:
the identity of a window is its directory, one per run / step / replica, and files are matched by
suffix and rank tag only.

``/stop_profile`` returns once rank 0 answers: torch and Proton files of every rank are written by
then, but the VizTracer reports of the other ranks may still be being saved, and a window that
stopped by itself (``num_steps``) answers nobody. So completion is judged on the files: a file is
complete when it is non-empty, looks closed (a JSON document ends with ``}``) and its size did not
change between two polls; the wait gives up after a stall timeout without progress.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

# activity → the kind its files are registered as (the merger's reader kinds where one exists)
ACTIVITY_KINDS = {
    "VIZTRACER": "viztracer",
    "PROTON": "proton",
    "CPU": "torch",
    "GPU": "torch",
    "MEM": "tokenspeed_memory",
    "EXPERT_LOAD": "tokenspeed_expert_load",
}
_TAG = r"(?P<tag>(?:DP(?P<dp>\d+)-)?TP(?P<tp>\d+))"
_NAME = re.compile(
    rf"^(?P<id>.+?)-{_TAG}(?:"
    r"(?P<stage1>-(?:EXTEND|DECODE))?\.(?P<what>viztracer\.json|trace\.json\.gz|expert-load\.pt"
    r"|proton(?:\.part_(?P<part>\d+))?\.(?P<fmt>[A-Za-z_]+))"
    r"|-memory(?P<stage2>-(?:EXTEND|DECODE))?\.pickle)$"
)
_JSON_TAIL = 64


@dataclass(frozen=True)
class ProfileFile:
    """One file of a window, by what its name says."""

    path: Path
    kind: str
    tag: str  # e.g. ``TP1`` or ``DP0-TP1``
    tp: int
    dp: int | None
    fmt: str | None = None  # Proton's output format (``chrome_trace``, ``hatchet``, ...)

    @property
    def is_json(self) -> bool:
        return self.kind == "viztracer" or (self.kind == "proton" and self.fmt == "chrome_trace")


def parse(path: Path) -> ProfileFile | None:
    """What a TokenSpeed profile file name says (None: not one of them, or a temp file)."""
    if path.name.startswith("."):
        return None
    m = _NAME.match(path.name)
    if m is None:
        return None
    what = m.group("what")
    if what is None:
        kind = "tokenspeed_memory"
    elif what == "viztracer.json":
        kind = "viztracer"
    elif what == "trace.json.gz":
        kind = "torch"
    elif what == "expert-load.pt":
        kind = "tokenspeed_expert_load"
    else:
        kind = "proton"
    dp = m.group("dp")
    return ProfileFile(
        path, kind, m.group("tag"), int(m.group("tp")), int(dp) if dp else None, m.group("fmt")
    )


def expected_kinds(activities: Iterable[str]) -> set[str]:
    return {ACTIVITY_KINDS[a] for a in activities if a in ACTIVITY_KINDS}


def looks_closed(path: Path, is_json: bool) -> bool:
    """A JSON document's last non-blank byte is ``}``; other files cannot tell (size only)."""
    if not is_json:
        return True
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - _JSON_TAIL))
            return f.read().rstrip().endswith(b"}")
    except OSError:
        return False


@dataclass
class _Seen:
    size: int
    stable: int = 0  # polls in a row with this size
    done: bool = False


@dataclass
class WindowWait:
    """Polls one window's directory until ``ranks`` ranks wrote every expected kind, or it stalls.

    ``poll()`` returns the files that became complete since the last call, so a caller registers
    each file once, as soon as it is complete, and keeps them if the rest never arrives.
    """

    directory: Path
    kinds: set[str]
    ranks: int
    stall_timeout_s: float
    clock: Callable[[], float] = time.monotonic
    seen: dict[Path, _Seen] = field(default_factory=dict)
    complete: dict[Path, ProfileFile] = field(default_factory=dict)
    last_progress: float = field(default=-1.0)

    def __post_init__(self) -> None:
        self.last_progress = self.clock()

    def poll(self) -> list[ProfileFile]:
        now, fresh = self.clock(), []
        try:
            entries = sorted(self.directory.iterdir()) if self.directory.is_dir() else []
        except OSError:
            entries = []
        for path in entries:
            info = parse(path)
            if info is None or path in self.complete:
                continue
            try:
                size = path.stat().st_size
            except OSError:
                continue
            state = self.seen.get(path)
            if state is None or state.size != size:
                self.seen[path] = _Seen(size)
                self.last_progress = now
                continue
            state.stable += 1
            if size > 0 and looks_closed(path, info.is_json):
                state.done = True
                self.complete[path] = info
                self.last_progress = now
                fresh.append(info)
        return fresh

    def missing(self) -> list[str]:
        """``kind TAG`` / ``kind: n of m ranks`` for what is not complete yet (empty: done)."""
        out = []
        for kind in sorted(self.kinds):
            tags = {f.tag for f in self.complete.values() if f.kind == kind}
            if len(tags) < self.ranks:
                out.append(f"{kind}: {len(tags)} of {self.ranks} ranks")
        pending = [p.name for p, s in self.seen.items() if not s.done]
        if pending:
            out.append("still being written: " + ", ".join(pending))
        return out

    @property
    def done(self) -> bool:
        return not self.missing()

    @property
    def stalled(self) -> bool:
        return self.clock() - self.last_progress > self.stall_timeout_s


_PID = re.compile(rb'"pid"\s*:\s*(\d+)')


def writer_pid(path: Path) -> int | None:
    """The OS pid a VizTracer report names first (its scheduler process), from the file's head."""
    try:
        with open(path, "rb") as f:
            m = _PID.search(f.read(8192))
    except OSError:
        return None
    return int(m.group(1)) if m else None
