"""How large a file this process can merge: the memory it may still take, over what a byte costs.

Why: the merge holds one file's events at once (its passes need the whole file: per-thread nesting,
flows, outliers), about ``EVENT_COST`` bytes of memory per inflated byte. A file past what the process
can hold used to take the whole merge down with it (the kernel's OOM killer, or a MemoryError that
failed the merge: every other file lost too). Now such a file is named and left out before it is
read past the bound, and the rest is merged. The bound follows the machine, never a fixed size, so a
10 GB trace still merges wherever there is the memory for it.

What the process may take is the least of: the kernel's ``MemAvailable``, its cgroup's limit less its
usage (v1 or v2, read-only), and its ``RLIMIT_DATA``/``RLIMIT_AS`` less what it uses now.
"""

from __future__ import annotations

import resource
from pathlib import Path

# merge memory per inflated byte, the worst measured: a .gz of 2.25M short events (93 bytes each,
# 200 MiB inflated) peaked at 1.26 GB merged in one process (events of real traces are longer: less)
EVENT_COST = 6


def _meminfo(key: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _status(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_room() -> int | None:
    """The memory cgroup's limit less its usage, where a limit is set."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        controllers, rel = parts[1], parts[2].lstrip("/")
        if controllers == "":  # cgroup v2
            base = Path("/sys/fs/cgroup") / rel
            limit, used = _read_int(base / "memory.max"), _read_int(base / "memory.current")
        elif "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory") / rel
            limit = _read_int(base / "memory.limit_in_bytes")
            used = _read_int(base / "memory.usage_in_bytes")
        else:
            continue
        if limit is not None and used is not None and limit < 1 << 60:
            return max(0, limit - used)
    return None


def _rlimit_room() -> int | None:
    room = None
    for which, used_key in ((resource.RLIMIT_DATA, "VmData"), (resource.RLIMIT_AS, "VmSize")):
        soft, _ = resource.getrlimit(which)
        if soft == resource.RLIM_INFINITY or soft <= 0:
            continue
        used = _status(used_key) or 0
        left = max(0, soft - used)
        room = left if room is None else min(room, left)
    return room


def room_bytes() -> int | None:
    """The memory this process may still take (None: nothing says)."""
    found = [r for r in (_meminfo("MemAvailable"), _cgroup_room(), _rlimit_room()) if r is not None]
    return min(found) if found else None


def file_limit() -> tuple[int, int] | None:
    """(the largest inflated size this process can merge now, the room it is derived from)."""
    room = room_bytes()
    return None if room is None else (room // EVENT_COST, room)


def too_large(size: int, limit: tuple[int, int]) -> str:
    """The one line that says why a file of ``size`` (inflated) bytes is left out."""
    return (
        f"{'inflates' if size else 'holds'} past {limit[0] >> 20:,} MiB: merging it would take more than "
        f"the {limit[1] >> 20:,} MiB of memory this process may still use (~{EVENT_COST} bytes per byte of "
        "trace); merge it on a machine with more free memory"
    )
