"""When the sampler leaves: nobody left to sample for, or nowhere left to write.

- ``members.lock`` can be taken exclusively: no member holds its shared lock (the normal end).
- No process listed in ``members/`` is alive, twice in a row a second apart, although the lock is
  still held: whatever holds it (a forked child that never recorded, a descriptor passed on
  somehow, even to the sampler itself) is not a process the sampler was started for. Without this
  check a sampler started by a test was found 1.5 h after it, the only process holding that lock,
  still writing into the test's removed directory.
- A catchable ending signal (SIGTERM, SIGINT, SIGHUP: :mod:`..ending`): the reason is its name.
- The output directory or the node folder was removed or replaced (another inode at that path):
  the run it samples for is gone, or its election can no longer be trusted. A watcher thread stats
  them, so a hung output mount delays only that thread, never a sample. For an output directory it
  leaves a note (:func:`.node.mark_left`), so that a member still running does not start another
  sampler into the directory the writers recreate (its own final record would be the first file).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

from ..ending import Ending
from . import node

MEMBERS_EVERY_S = 1.0  # how often the member list is looked at while the lock is held
WATCH_EVERY_S = 0.5  # how often the watcher stats the output directory and the node folder
NORMAL_END = "no member holds members.lock"


class DirWatch:
    """A daemon thread noting when a directory that existed is removed or replaced."""

    def __init__(self, paths: list[Path], every_s: float = WATCH_EVERY_S) -> None:
        self.paths = paths
        self.every_s = every_s
        self.gone: str | None = None
        self._seen: dict[Path, tuple[int, int]] = {}
        self._stop = threading.Event()
        self._check()
        self._thread = threading.Thread(target=self._loop, name="rl-trace-sampler-watch", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s) and self.gone is None:
            self._check()

    def _check(self) -> None:
        for path in self.paths:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                if path in self._seen:  # a folder that does not exist yet is waited for
                    self.gone = f"{path} was removed"
                continue
            except OSError:  # ESTALE and the like: not an answer either way
                continue
            ident = (st.st_dev, st.st_ino)
            if self._seen.setdefault(path, ident) != ident:
                self.gone = f"{path} was replaced"

    def stop(self) -> None:
        self._stop.set()


class Lifetime:
    """Asked after every tick: a reason to leave, or None."""

    def __init__(self, folder: Path, output_dir: Path, members_fd: int, ending: Ending | None = None) -> None:
        self.folder, self.output_dir = folder, output_dir
        self.members_fd = members_fd
        self.ending = ending  # a catchable signal this process got (SIGTERM, ...): its name is the reason
        self.watch = DirWatch([output_dir, folder])
        self._next_members = time.monotonic() + MEMBERS_EVERY_S
        self._absent = 0  # consecutive looks that found no live member

    def reason(self) -> str | None:
        if self.ending is not None and self.ending.signal is not None:
            return self.ending.signal
        if node.try_lock(self.members_fd, fcntl.LOCK_EX):
            return NORMAL_END
        if self.watch.gone is not None:
            return self.watch.gone
        now = time.monotonic()
        if now >= self._next_members:
            self._next_members = now + MEMBERS_EVERY_S
            alive = node.members_alive(self.folder, but=os.getpid())
            self._absent = 0 if alive else self._absent + 1
            if self._absent >= 2:
                return "no process it was started for is alive (members.lock held by others)"
        return None

    def output_gone(self) -> bool:
        """Whether the output directory (not the node folder) was removed or replaced."""
        return self.watch.gone is not None and self.watch.gone.startswith(str(self.output_dir))

    def close(self) -> None:
        self.watch.stop()
