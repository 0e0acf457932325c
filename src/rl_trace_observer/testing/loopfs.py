"""A real ext4 file system on a loop device, to freeze (``fsfreeze``: how an NFS/Lustre stall looks
to a writer), fill and empty under a running process. Needs root and ``mkfs.ext4``, ``mount``,
``fsfreeze``; everything is undone in ``finally`` (thaw, unmount, image removed), and every freeze
has a watchdog that thaws it even if the caller dies.

Never touch a frozen mount from the process holding the freeze other than to read: a write there
cannot be interrupted, not even by SIGKILL, until the thaw.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

TOOLS = ("mkfs.ext4", "mount", "umount", "fsfreeze", "losetup")


def unavailable_reason() -> str | None:
    """Why loop-mounted file systems cannot be used here (``None``: they can)."""
    if os.geteuid() != 0:
        return "needs root (loop mounts and fsfreeze)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"missing tools: {', '.join(missing)}"
    probe = subprocess.run(["losetup", "-f"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"no free loop device ({probe.stderr.strip() or 'losetup -f failed'})"
    return None


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)


class LoopFS:
    """One mounted image; ``mount`` is the directory."""

    def __init__(self, mount: Path, image: Path) -> None:
        self.mount = mount
        self.image = image
        self._watchdog: subprocess.Popen[bytes] | None = None
        self.frozen = False

    def freeze(self, watchdog_s: float = 60.0) -> None:
        # the watchdog is a separate process: it thaws even if this one is killed
        self._watchdog = subprocess.Popen(
            ["sh", "-c", f"sleep {watchdog_s}; fsfreeze -u {self.mount}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        _run("fsfreeze", "-f", str(self.mount))
        self.frozen = True

    def thaw(self) -> None:
        if self.frozen:
            subprocess.run(["fsfreeze", "-u", str(self.mount)], capture_output=True, timeout=60)
            self.frozen = False
        if self._watchdog is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._watchdog.pid, 9)
            self._watchdog.wait()
            self._watchdog = None

    @contextlib.contextmanager
    def frozen_for(self, watchdog_s: float = 60.0) -> Iterator[None]:
        self.freeze(watchdog_s)
        try:
            yield
        finally:
            self.thaw()

    def free_bytes(self) -> int:
        """Free space as root sees it (root may also use the blocks ext4 reserves)."""
        st = os.statvfs(self.mount)
        return st.f_bfree * st.f_frsize

    def fill(self, leave_bytes: int = 0, name: str = "filler") -> None:
        """Take all free space but ``leave_bytes`` with one file (``free`` gives it back)."""
        path = self.mount / name
        with open(path, "ab") as f:
            want = self.free_bytes() - leave_bytes
            if want > 0:
                with contextlib.suppress(OSError):
                    os.posix_fallocate(f.fileno(), os.fstat(f.fileno()).st_size, want)
        # fallocate rounds to blocks: top up with small writes until exactly little is left
        with open(path, "ab", buffering=0) as f:
            while self.free_bytes() > leave_bytes + 4096:
                try:
                    f.write(b"\0" * 4096)
                except OSError:
                    break

    def free(self, name: str = "filler") -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.mount / name).unlink()

    def remount(self, *, read_only: bool) -> None:
        _run("mount", "-o", f"remount,{'ro' if read_only else 'rw'}", str(self.mount))


@contextlib.contextmanager
def loop_ext4(size_mb: int = 64) -> Iterator[LoopFS]:
    """A fresh ext4 of ``size_mb`` MiB, mounted on a temporary directory."""
    base = Path(tempfile.mkdtemp(prefix="rl-trace-loopfs-"))
    image, mount = base / "fs.img", base / "mnt"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(size_mb << 20)
    fs = LoopFS(mount, image)
    mounted = False
    try:
        _run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(image))
        _run("mount", "-o", "loop", str(image), str(mount))
        mounted = True
        yield fs
    finally:
        fs.thaw()
        if mounted:
            for _ in range(50):  # a drain may still be closing its files
                if subprocess.run(["umount", str(mount)], capture_output=True).returncode == 0:
                    break
                time.sleep(0.1)
            else:
                subprocess.run(["umount", "-l", str(mount)], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
