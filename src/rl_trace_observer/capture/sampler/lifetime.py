"""When the sampler leaves: nobody left to sample for.

``members.lock`` can be taken exclusively: no member holds its shared lock (:mod:`.node`).
"""

from __future__ import annotations

import fcntl
from pathlib import Path

from . import node

NORMAL_END = "no member holds members.lock"


class Lifetime:
    """Asked after every tick: a reason to leave, or None."""

    def __init__(self, folder: Path, output_dir: Path, members_fd: int) -> None:
        self.folder = folder
        self.members_fd = members_fd

    def reason(self) -> str | None:
        if node.try_lock(self.members_fd, fcntl.LOCK_EX):
            return NORMAL_END
        return None

    def close(self) -> None:
        return None
