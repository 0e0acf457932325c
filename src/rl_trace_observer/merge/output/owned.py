"""Temp files a merge leaves beside its output carry their owner, so the next merge can prove them
stale and remove them — and never anything else.

Why: a merge killed with ``kill -9`` (OOM killer, a cancelled CI job) cannot clean up; its output
temp, the workers' part files and half-written shard parts stayed behind (up to tens of MB each).
Every such file is named ``.<name>.rl-merge-<where>-<start>.<pid>.<what>``: ``<where>`` is a hash of
this kernel's boot and PID namespace (pids mean the same process only inside one), ``<start>`` the
owner's start time (``/proc/<pid>/stat``: a reused pid has another), ``<what>`` ``tmp`` or
``part<N>``. :func:`sweep` removes such a file only when its ``<where>`` is ours and its owner pid is
gone or now another process. The name still ends in ``.<pid>.tmp`` for the collectors' and error
messages' temp-file patterns, and it is hidden, so no merge reads it as an input.
"""

from __future__ import annotations

import os
import re
import zlib
from pathlib import Path

MARK = "rl-merge"
_LEFTOVER = re.compile(
    rf"^\.(?P<name>.+)\.{MARK}-(?P<where>[0-9a-f]{{8}})-(?P<start>\d+)\.(?P<pid>\d+)\.(tmp|part\d+)$"
)
_claimed: str | None = None  # the merge process's tag, inherited by its forked pool workers


def _start_ticks(pid: int) -> int:
    """The process's start time in clock ticks since boot (0 where /proc cannot tell)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return 0
    fields = stat[stat.rfind(b")") + 2 :].split()  # the command name may hold spaces and ')'
    try:
        return int(fields[19])  # field 22 of stat(5); fields[0] is field 3
    except (IndexError, ValueError):
        return 0


def _where() -> str:
    """8 hex digits naming this kernel boot and PID namespace (pids are comparable only within)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_bytes().strip()
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        boot, ns = os.uname().nodename.encode(), 0
    return f"{zlib.crc32(boot + b'/' + str(ns).encode()):08x}"


def claim() -> str:
    """Tag this process as the merge that owns the temp files it (and its forked workers) name."""
    global _claimed
    pid = os.getpid()
    _claimed = f"{MARK}-{_where()}-{_start_ticks(pid)}.{pid}"
    return _claimed


def owner() -> str:
    return _claimed if _claimed is not None else claim()


def temp_path(path: Path, what: str = "tmp") -> Path:
    """The owned hidden temp file beside ``path``: ``.<name>.<owner>.<what>``."""
    return path.with_name(f".{path.name}.{owner()}.{what}")


def _owner_alive(where: str, start: int, pid: int) -> bool:
    """True unless we can prove the owner gone: another namespace (or boot) proves nothing."""
    if where != _where():
        return True
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's: only a start time can tell it is not the owner
        pass
    now = _start_ticks(pid)
    return now == 0 or now == start  # an unreadable start: keep it


def sweep(folder: Path, names: set[str], recursive: bool = False) -> list[Path]:
    """Remove the leftovers in ``folder`` of merges that are gone, for the files named ``names``
    (``None``-like empty set: any name, used under a shard directory); returns what was removed."""
    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    candidates = folder.rglob(f".*.{MARK}-*") if recursive else folder.glob(f".*.{MARK}-*")
    for path in candidates:
        m = _LEFTOVER.match(path.name)
        if m is None or (names and m["name"] not in names):
            continue
        if _owner_alive(m["where"], int(m["start"]), int(m["pid"])):
            continue
        try:
            if path.is_file() and not path.is_symlink():
                path.unlink()
                removed.append(path)
        except OSError:
            pass
    return removed
